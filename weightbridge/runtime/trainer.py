"""The trainer side: ``TrainerBridge.push`` on every trainer rank; trainer rank 0 also coordinates.

Every trainer rank calls :meth:`TrainerBridge.push` with the same version (a collective over the
trainer ranks). Rank 0 first takes the push's decisions through :mod:`.coordinator` (who is a
member, the staleness wait, whether a new epoch starts) from snapshots of the control store, and
announces; ranks > 0 wait for that announcement. Then every rank enters the epoch if it is new,
sends its share of the plan, and waits for the receivers' acks.

Failures (see ``docs/failures.md``): every rank publishes its own error in the epoch and raises
it; trainer 0 also publishes a failure that stopped it *before* announcing (even a peer's
``PeerFailed``), so ranks > 0 waiting for the announcement raise at once instead of at their
deadline; after a transport error a rank raises the root cause a peer published (a receiver's
``ChecksumError``) when there is one. In async mode trainer 0 counts staleness over the versions
each receiver's current process actually staged, so a failed push or a restarted rollout never
leaves a version to wait for that cannot come.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from weightbridge.errors import BridgeError, ForgedMessage, PeerFailed, ProtocolError
from weightbridge.quant import quantized_sources
from weightbridge.runtime import coordinator as co
from weightbridge.runtime.connect import connect
from weightbridge.runtime.epochs import REJOIN_CHECK_S, Endpoint
from weightbridge.runtime.options import BridgeOptions, reject_moved
from weightbridge.runtime.results import PushStats
from weightbridge.spec.resolve import ResolvedSpec
from weightbridge.sync.batch import batch, reuse
from weightbridge.sync.board import rollout_ids
from weightbridge.sync.membership import actual_dtypes, check_tensors
from weightbridge.sync.messages import Announce
from weightbridge.sync.roster import TRAINER, RankId, Roster, instance_rollout_ranks


class TrainerBridge(Endpoint):
    """One trainer rank's end of the bridge. See :mod:`weightbridge.bridge` for the call sequence."""

    def __init__(self, resolved: ResolvedSpec, **kw: Any) -> None:
        super().__init__(resolved, side=TRAINER, **kw)
        n = resolved.rollout.num_instances
        self.min_instances = resolved.sync.min_instances or n
        if not 1 <= self.min_instances <= n:
            raise ValueError(f"sync.min_instances must be in [1, {n}], got {self.min_instances}")
        self._since = 0
        self.last_version: int | None = None
        self._last_ann: tuple[int, int] | None = None  # ranks > 0: (epoch, seq) of the last announcement sent for
        self._receivers: dict[int, co.Incarnation | None] = {}  # trainer 0, async: what each receiver process staged
        self._pushed_to: tuple[int, ...] = ()  # trainer 0: the rollout ranks of the latest push
        self._instance_ranks = tuple(instance_rollout_ranks(resolved.rollout, i) for i in range(n))
        # Trainer 0 numbers pushes from the last announcement (it may be a restarted process);
        # other ranks match announcements by version, so one made before they connected counts.
        try:
            ann = self.board.announcement() if self.rank == 0 else None
        except (ProtocolError, ForgedMessage):  # a bad value: number from 0 (any change is a new push)
            ann = None
        self.seq = ann.seq if ann is not None else 0
        self._join(instance=0)

    @classmethod
    def from_spec(
        cls,
        spec: str | Path | ResolvedSpec,
        *,
        rank: int,
        tensors: Mapping[str, torch.Tensor],
        host: str | None = None,
        port: int | None = None,
        store: Any = None,
        options: BridgeOptions | None = None,
        **moved: Any,
    ) -> TrainerBridge:
        """Connect trainer rank ``rank`` holding ``tensors`` (local name -> tensor, as in the spec).

        The control store: rank 0 hosts it at ``host:port`` (every other rank connects there) unless
        ``store`` is given or the spec says ``sync.store: external``; then every rank, rank 0
        included, connects to a store that outlives the bridges (``weightbridge store --host H --port
        P``, or a launcher's ``weightbridge.open_store``), so trainer 0 may die and be restarted like
        any rank. Every rank reconnects a dropped store connection within ``sync.timeout_s``; a
        store that stays unreachable (here, or at any later call) raises ``StoreUnreachable``
        naming the rank and ``host:port``. Everything the
        ranks must agree on comes from the spec's ``sync`` section (its hash is compared at the
        handshake): ``timeout_s``, ``round_bytes``, ``checksums`` (a checksum per bucket; a
        corrupted update raises ``ChecksumError``), ``receiver_dedup``, ``heartbeat_s``, and
        ``min_instances`` (default: all of the spec's rollout instances): how many complete, live
        rollout instances every push waits for (up to the deadline); each push goes to the
        instances present then, so late ones join at a later push and a dead one is dropped once
        fewer than all are required. ``options``: per-process :class:`BridgeOptions` (the store key
        prefix, the ``on_round`` progress hook, a test data plane). Keyword arguments that moved
        raise ``TypeError`` saying where they went.
        """
        reject_moved("TrainerBridge.from_spec", moved)
        options = options or BridgeOptions()
        resolved, store = connect(spec, host, port, store, is_master=rank == 0, who=f"trainer {rank}",
                                  secret=options.secret)
        return cls(resolved, rank=rank, tensors=tensors, store=store, options=options)

    # -- push ---------------------------------------------------------------------------------
    def push(self, version: int, tensors: Mapping[str, torch.Tensor] | None = None) -> PushStats:
        """Send version ``version`` (strictly increasing) to every rollout rank of the epoch.

        Called by every trainer rank with the same ``version``. ``tensors`` replaces the local
        tensors given so far (when the training framework re-allocated them); by default the
        tensors passed to ``from_spec`` are read as they are now. Returns per the mode (see
        :mod:`weightbridge.bridge`). Raises a typed error on any failure, after telling the other ranks.
        """
        if self.closed:
            raise BridgeError(f"{self.me}: push() after close()")
        if self.last_version is not None and version <= self.last_version:
            raise ValueError(f"{self.me}: versions must increase: pushed {self.last_version}, then {version}")
        if self.options.before_push is not None:  # e.g. Megatron's deferred parameter all-gather
            self.options.before_push()
        if tensors is not None:  # replaced only once every check passed: a refused call changes nothing
            check_tensors(self.layout, tensors)
            if actual_dtypes(self.layout, tensors)[0] != self.dtypes:
                raise ValueError(f"{self.me}: push(tensors=...) changed tensor dtypes since the handshake")
            self.tensors = dict(tensors)
        t0 = time.perf_counter()
        wait_s = 0.0
        announced: Announce | None = None
        try:
            self.rejoin_if_missing(self.board)
            # Failures already published in the epoch this rank is in (or failed to enter) concern
            # an earlier push: the waits before the announcement ignore them (trainer 0 starts a
            # new epoch because of them). Later ones there, trainer 0's included, end those waits.
            self._since = self.board.failure_count(self.failure_epoch)
            if self.rank == 0:
                ann, waited = self._announce(version)
                wait_s += waited
            else:
                ann = self._await_announce(version)
                self._last_ann = (ann.epoch, ann.seq)
            announced = ann
            self.seq = ann.seq  # announced: the next push is seq + 1 even if this one fails
            new_epoch = ann.epoch != self.epoch or self.broken
            if new_epoch:
                self.enter_epoch(self.board, ann.epoch)
            plan, roster = self.epoch_plan()
            # weights the rollout receives quantised: read through this rank's derived FP8 sources
            sources = quantized_sources(self.tensors, self.layout, self.spec.rollout.quant)
            run = self.data_plane.run(
                plan, side=TRAINER, rank=self.plan_rank, tensors=sources, dst=None,
                tag=f"v{version}", on_round=self.on_round, version=version,
            )
            t_ack = time.perf_counter()
            self._await_acks(ann, roster)
            wait_s += time.perf_counter() - t_ack
        except BaseException as exc:
            cause = exc if announced is None else self.explain(self.board, exc, announced.epoch)
            if self.rank == 0 and announced is None and isinstance(exc, PeerFailed):
                self._relay(exc, version)
            self.fail(self.board, cause, version)
            if self.rank == 0 and announced is not None:
                self._after_push(announced)
            if cause is not exc:
                raise cause from exc
            raise
        if self.rank == 0:
            self._after_push(ann)
        self.last_version = version
        return PushStats(
            version=version, seq=ann.seq, epoch=ann.epoch, mode=self.mode, bytes_sent=run.bytes_sent,
            wire_bytes=plan.wire_bytes, seconds=time.perf_counter() - t0, transfer_s=run.seconds,
            wait_s=wait_s, num_rounds=plan.num_rounds, new_epoch=new_epoch,
            wire_sent=run.wire_sent if run.wire_sent >= 0 else run.bytes_sent, delta_buckets=run.delta_buckets,
        )

    # -- trainer rank 0: the coordinator's I/O ------------------------------------------------
    def _announce(self, version: int) -> tuple[Announce, float]:
        """Trainer rank 0: decide the members, enforce the staleness bound, decide the epoch, announce."""
        deadline = self.cp.deadline()
        instances, look = self._await_members(deadline, version)
        roster = Roster.of_instances(self.spec.rollout, self.num_trainers, instances)
        waited = 0.0
        if self.mode == "async":
            t = time.perf_counter()
            if self._await_staleness(roster.rollout_ranks, deadline, version, look):
                look = {}  # it waited: the epoch view reads anew
            waited = time.perf_counter() - t
        self._pushed_to = roster.rollout_ranks
        with reuse(self.cp, look):  # the members' look answers the epoch view's reads of join records
            view = self._epoch_view()
        decision = co.decide_push(view, last_seq=self.seq, version=version, instances=instances)
        epoch = self.board.open_epoch(roster, decision.reason).epoch if decision.new_epoch else self.epoch
        return self.board.announce(decision.seq, decision.version, epoch, self.started_ms), waited

    def _rollout_view(self) -> co.RolloutView:
        """Which rollout ranks joined and which are dead, now (updates the heartbeat monitor)."""
        now = time.monotonic()
        joined, dead = set(), set()
        monitor = self.cp.monitor
        for ranks in self._instance_ranks:
            ids = rollout_ids(ranks)
            if not self.board.joined(ids):
                continue
            joined.update(ranks)
            for who in ids:
                counter = self.board.heartbeat(who)
                monitor.observe(who, counter, now)
                if monitor.dead(who, now) or monitor.known_dead(who, counter):
                    dead.add(who.rank)
        return co.RolloutView(self._instance_ranks, frozenset(joined), frozenset(dead))

    def _await_members(self, deadline: float, version: int) -> tuple[tuple[int, ...], dict]:
        """The members of the push, and the snapshot of the look that found them (every rollout rank's
        join record and heartbeat, in async mode its applied ack, and the epoch's members' join records:
        what the staleness check and the epoch view read next)."""
        got: list = []
        every = rollout_ids([r for ranks in self._instance_ranks for r in ranks])
        keys = self.board.join_keys([*every, *self.hellos]) + self.board.heartbeat_keys(every)
        if self.mode == "async":
            keys += self.board.ack_keys("applied", [w.rank for w in every])

        def enough(_: list[bytes]) -> bool:
            with batch(self.cp, keys) as look:  # one snapshot per look
                decision = co.decide_members(self._rollout_view(), self.min_instances)
            got[:] = [decision, look] if isinstance(decision, co.Members) else []
            return bool(got)

        self.cp.wait_for([], deadline, f"at least {self.min_instances} complete rollout instance(s) to join",
                         ready=enough, epoch=self.failure_epoch or None, since=self._since, only=_of_push(version))
        return got[0].instances, got[1]

    def _await_staleness(self, rollout_ranks: tuple[int, ...], deadline: float, version: int, look: dict) -> bool:
        """Async: wait until each receiver applied the ``max(k, 1)``-th newest version its current
        process staged (:func:`~.coordinator.decide_staleness`; none staged: nothing to wait for).
        The first look is ``look`` (the members' snapshot); True when it had to wait."""
        acks = self.board.ack_keys("applied", rollout_ranks)
        joins = self.board.join_keys(rollout_ids(rollout_ranks))
        with reuse(self.cp, look), batch(self.cp, joins + acks):  # reads only what the look lacks
            for r in rollout_ranks:
                self._receivers[r] = co.track_incarnation(self._receivers.get(r), self._nonce_of(r), self.seq)
            first = self._staleness(rollout_ranks)
        if isinstance(first, co.Fresh):
            return False

        def fresh(_: list[bytes]) -> bool:
            with batch(self.cp, acks):
                return isinstance(self._staleness(rollout_ranks), co.Fresh)

        lag = "; ".join(f"rollout {r} must apply {need}, applied {'none' if has is None else has}"
                        for r, need, has in first.lagging)
        self.cp.wait_for(
            [], deadline,
            f"every receiver to apply version >= {first.bound} (max_staleness {self.max_staleness}) of the "
            f"versions delivered to it ({lag})",
            ready=fresh, epoch=self.failure_epoch or None, since=self._since,
            watch=rollout_ids([r for r, _, _ in first.lagging]), only=_of_push(version),
        )
        return True

    def _staleness(self, rollout_ranks: tuple[int, ...]) -> co.Fresh | co.AwaitStaleness:
        """Trainer 0, async: the staleness decision from the receivers' applied acks now."""
        records = {r: self._receivers.get(r) for r in rollout_ranks}

        applied = {}
        for r, rec in records.items():
            ack = self._ack("applied", r)
            # an applied ack counts if this process wrote it (its nonce, when the ack carries one)
            # for a push this trainer announced (a seq past its own cannot be genuine)
            if ack is not None and rec is not None and getattr(ack, "nonce", "") in ("", rec.nonce) \
                    and ack.seq <= self.seq:
                applied[r] = (ack.seq, ack.version)
        return co.decide_staleness(self.max_staleness, records, applied)

    def _after_push(self, ann: Announce) -> None:
        """Trainer 0, async, when push ``ann`` ended (returned or failed): note which receivers staged it."""
        if self.mode != "async":
            return
        pushed_to = getattr(self, "_pushed_to", ())
        keys = self.board.join_keys(rollout_ids(pushed_to)) + self.board.ack_keys("staged", pushed_to)
        try:
            with batch(self.cp, keys):  # every receiver's join record and staged ack: one snapshot
                for r in pushed_to:
                    rec = co.track_incarnation(self._receivers.get(r), self._nonce_of(r), ann.seq)
                    if rec is None:
                        continue
                    ack = self._ack("staged", r)
                    mine = ack is not None and getattr(ack, "nonce", "") in ("", rec.nonce)
                    self._receivers[r] = co.after_push(rec, seq=ann.seq, version=ann.version,
                                                       staged_seq=ack.seq if mine else None,  # type: ignore[union-attr]
                                                       keep=max(self.max_staleness, 1) + 1)
        except BridgeError:  # the store is unreachable: the next push finds out
            pass

    def _relay(self, exc: BaseException, version: int) -> None:
        """Trainer 0 failed before announcing ``version``: publish the cause even when it is a peer's
        (``publish_failure`` skips ``PeerFailed``, which the other trainer ranks did not see: they
        wait for the announcement and would only give up at their deadline)."""
        relay = type(type(exc).__name__, (Exception,), {})(str(exc))  # same type name and message
        self.cp.publish_failure(self.failure_epoch, relay, version)

    def _nonce_of(self, rollout_rank: int) -> str | None:
        try:
            join = self.board.join_of(RankId("rollout", rollout_rank))
        except (ProtocolError, ForgedMessage):
            return None
        return None if join is None else join.nonce

    def _ack(self, stage: str, rollout_rank: int):  # -> Ack | None
        """A rollout rank's latest ``stage`` ack; a bad value reads as none (its next ack replaces it)."""
        try:
            return self.board.ack_of(stage, rollout_rank)
        except (ProtocolError, ForgedMessage):
            return None

    def _epoch_view(self) -> co.EpochView:
        if self.roster is None:
            return co.EpochView(epoch=self.epoch)
        joins: dict[RankId, str | None] = {}
        with batch(self.cp, self.board.join_keys(list(self.hellos))):  # every member's join record: one snapshot
            for who in self.hellos:
                try:
                    join = self.board.join_of(who)
                except (ProtocolError, ForgedMessage):
                    join = None  # unreadable: as if it left (a new epoch; the rank rewrites it)
                joins[who] = None if join is None else join.nonce
        return co.EpochView(
            epoch=self.epoch, instances=self.roster.instances, broken=self.broken,
            failures=self.board.failure_count(self.epoch),
            hello_nonces={who: h.nonce for who, h in self.hellos.items()}, join_nonces=joins,
        )

    # -- every trainer rank -------------------------------------------------------------------
    def _await_announce(self, version: int) -> Announce:
        """Trainer ranks > 0: wait for rank 0's announcement of ``version`` (two deadlines: it may
        first wait for the staleness bound)."""
        seen: list[Announce] = []

        def is_mine(_: list[bytes]) -> bool:
            try:
                ann = self.board.announcement()
            except (ProtocolError, ForgedMessage):  # a bad value: trainer 0's next announcement replaces it
                return False
            if ann is None:
                return False
            failures = self.board.failure_count(ann.epoch) if self._last_ann is None else 0
            if co.accepts_announcement((ann.epoch, ann.seq, ann.version), last=self._last_ann, version=version,
                                       failures_in_epoch=failures):
                seen[:] = [ann]
            return bool(seen)

        # no keys to wait for: the wait would open (and raise on) a bad value; is_mine reads it instead
        self.cp.wait_for(
            [], self.cp.deadline(2 * self.timeout_s), f"trainer 0 to announce version {version}",
            # the epoch trainer 0 publishes its failures in: the one this rank is in or failed to
            # enter (both took the same announcement), epoch 0 before any (no receivers then);
            # only trainer 0's failure of this push counts (another rank may still be failing the
            # previous push there, later than this rank did)
            ready=is_mine, epoch=self.failure_epoch, since=self._since, watch=[RankId(TRAINER, 0)],
            only=_of_push(version, RankId(TRAINER, 0)), budget_s=2 * self.timeout_s,
        )
        return seen[0]

    def _await_acks(self, ann: Announce, roster: Roster) -> None:
        ranks = roster.rollout_ranks
        stage = co.ack_stage(self.mode, self.max_staleness)
        next_check = [time.monotonic() + REJOIN_CHECK_S]

        keys = self.board.ack_keys(stage, ranks)

        def done(_: list[bytes]) -> bool:
            if self.rank == 0 and time.monotonic() > next_check[0]:
                next_check[0] = time.monotonic() + REJOIN_CHECK_S
                self._reassert(ann)
            # only this epoch's acks by the incarnations that handshook count (a replayed old ack does not)
            acks: dict[int, int] = {}
            with batch(self.cp, keys, all_or_none=True) as snapshot:  # one check; all there: one read
                if snapshot is None:
                    return False  # a rank has no ack at all yet
                for r in ranks:
                    try:
                        acks.update({r: a.seq for r, a in self.board.acks(stage, [r], epoch=ann.epoch,
                                                                          hellos=self.hellos).items()})
                    except (ProtocolError, ForgedMessage):
                        pass  # a bad value reads as no ack yet: the rank's real ack replaces it
            return not co.pending_acks(acks, ranks, ann.seq)

        self.cp.wait_for(
            [], self.cp.deadline(), f"every rollout rank to ack {stage} version {ann.version}",
            ready=done, epoch=ann.epoch, watch=roster.members, joins=self.hellos,
        )

    def _reassert(self, ann: Announce) -> None:
        """Trainer 0 while its push runs: put its announcement back if the key lost it (deleted, or
        overwritten with garbage or an older announcement where the store is not keyed by the secret),
        so a receiver that has not read it yet still does. Receivers that did take it see nothing new."""
        try:
            now = self.board.announcement()
        except (ProtocolError, ForgedMessage):
            now = None
        if now != ann:
            self.board.announce(ann.seq, ann.version, ann.epoch, ann.started)

    def close(self) -> None:
        """Leave the bridge. With ``sync.store: trainer0`` trainer rank 0 hosts the store: close it last."""
        self._close_common()


def _of_push(version: int, by: RankId | None = None):
    """A failure filter for the waits before an announcement: only failures published in ``push(version)``
    (by ``by``). A rank may publish the failure of the previous push after this one began (it
    failed later than the waiter); that one is old news, not a reason to fail this push too."""
    def accept(f) -> bool:
        return f.version == version and (by is None or (f.side, f.rank) == (by.side, by.rank))
    return accept

