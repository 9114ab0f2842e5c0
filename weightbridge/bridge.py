"""The runtime API: push new weights from trainer ranks, receive and apply them on rollout ranks.

Three classes, one per role:

* :class:`TrainerBridge` - one per trainer rank; ``push(version)`` after the optimizer step.
* :class:`RolloutBridge` - one per rollout rank (each TP/EP worker of each engine instance);
  ``poll()`` / ``ready()`` / ``apply()`` at the engine's safe points, ``version``, ``torn``.
* :class:`ColocatedBridge` - trainer and rollout tensors in one process: direct copies, no wire.

Call sequence (disaggregated, ``sync.mode`` = ``sync`` or ``async``):

1. Trainer rank 0 calls ``TrainerBridge.from_spec(spec, rank=0, tensors=..., host=H, port=P)``:
   it hosts the control store on ``H:P`` (a ``TCPStore``) and joins.
2. Every other trainer rank ``t`` and every rollout rank ``r`` calls ``from_spec(...)`` with the
   same spec, host and port (any order, any time: late rollout instances join the next push).
3. Every trainer rank calls ``push(v)`` with the same strictly increasing ``v`` after each
   optimizer step (a collective over the trainer ranks; a rank that skips it hangs the others
   until the deadline). Trainer rank 0 decides the membership (complete rollout instances
   with live heartbeats, at least ``min_instances``), starts a new epoch when it changed or
   the previous push failed (all members re-handshake and open a new bridge group), waits
   for the staleness bound (async), and announces ``v``; all trainer ranks then send.
   ``push`` returns when every receiver **applied** ``v`` (sync, and async with
   ``max_staleness`` 0) or **staged** it (async).
4. Every rollout rank calls ``poll()`` at its safe points (e.g. between scheduler steps) and,
   when it returns True, ``apply()``. With ``staging=True`` the bytes land in a staging copy
   on a background thread while the engine keeps serving the old weights, and ``apply()``
   copies them in; with ``staging=False`` ``poll()`` itself receives into the live weights
   (blocking for the transfer; the rank is ``torn`` meanwhile) and ``apply()`` commits.
5. Every rank calls ``close()``; trainer rank 0 last (it hosts the store).

Staleness (async, ``max_staleness`` = k >= 1): ``push(v)`` first waits until every
receiver that has staged anything applied at least ``v - k``; so once ``push(v)`` returns,
no receiver is more than ``k`` versions behind the trainer, and a trainer ``k`` versions ahead
of the slowest receiver blocks (up to ``sync.timeout_s``, then :class:`DeadlineExceeded`).

Failures: every wait has the deadline ``sync.timeout_s``; a rank that fails publishes its
error, every member of the epoch raises a typed error (:class:`PeerFailed`,
:class:`DeadlineExceeded`, :class:`HandshakeMismatch`, or the transport's errors) instead of
hanging. A staged receiver keeps its previous version; an in-place receiver is ``torn``
(``version`` is None, ``apply()`` raises :class:`TornModelError`) until the next complete push.
The next ``push`` after a failure starts a new epoch.

Usage loop::

    # trainer rank t
    bridge = TrainerBridge.from_spec("spec.yaml", rank=t, tensors=local_params, host=H, port=P)
    for step in range(1, n + 1):
        train_step(); optimizer.step()
        bridge.push(step)
    bridge.close()

    # rollout rank r (inside the engine's loop)
    bridge = RolloutBridge.from_spec("spec.yaml", rank=r, tensors=live_params, host=H, port=P)
    while serving:
        if bridge.poll():
            bridge.apply()
        generate(...)
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weightbridge.layout.ir import RankLayout
from weightbridge.plan.types import ROLLOUT, TRAINER, TransferPlan
from weightbridge.spec.resolve import ResolvedSpec
from weightbridge.sync.control import ControlPlane
from weightbridge.sync.dataplane import DataPlane, RunStats, TransportDataPlane
from weightbridge.sync.errors import (
    BridgeError,
    DeadlineExceeded,
    HandshakeMismatch,
    NothingToApply,
    PeerFailed,
    RankId,
    TornModelError,
)
from weightbridge.sync.membership import (
    PlanCache,
    actual_dtypes,
    check_tensors,
    expected_dtypes,
    rollout_ranks_of,
)
from weightbridge.sync.messages import Ack, Announce, Hello, Join, Keys, Leave, Membership, decode

log = logging.getLogger(__name__)

__all__ = [
    "BridgeError",
    "ColocatedBridge",
    "DeadlineExceeded",
    "HandshakeMismatch",
    "NothingToApply",
    "PeerFailed",
    "PushStats",
    "ReceiveStats",
    "RolloutBridge",
    "TornModelError",
    "TrainerBridge",
    "load_spec",
]


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PushStats:
    """What one ``push`` did, seen from one trainer rank."""

    version: int
    seq: int  # push sequence number (1, 2, ...), across epochs
    epoch: int
    mode: str
    bytes_sent: int  # by this rank
    wire_bytes: int  # by all trainer ranks (the plan's update bytes)
    seconds: float  # push() wall time
    transfer_s: float  # this rank's data-plane time
    wait_s: float  # waiting for the staleness bound and the receivers' acks
    num_rounds: int
    new_epoch: bool  # this push re-planned (first push, membership change, recovery)

    @property
    def gbps(self) -> float:
        """Update bytes over push wall time, GB/s (1e9)."""
        return self.wire_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReceiveStats:
    """What the last receive did on one rollout rank."""

    version: int
    seq: int
    epoch: int
    bytes_received: int
    transfer_s: float
    staged: bool  # into the staging copy (else into the live weights)


# ---------------------------------------------------------------------------------------------
# shared machinery
# ---------------------------------------------------------------------------------------------


def load_spec(spec: str | Path | ResolvedSpec) -> ResolvedSpec:
    """A :class:`ResolvedSpec` from itself, a spec file path, or spec YAML text."""
    if isinstance(spec, ResolvedSpec):
        return spec
    from weightbridge.spec.errors import SpecErrors
    from weightbridge.spec.resolve import check_text, resolve_spec

    text = str(spec)
    if isinstance(spec, Path) or ("\n" not in text and Path(text).is_file()):
        return resolve_spec(text)
    resolved, problems = check_text(text, "<spec>")
    if problems or resolved is None:
        raise SpecErrors(problems)
    return resolved


def _connect(
    spec: str | Path | ResolvedSpec, host: str | None, port: int | None, store: Any, timeout_s: float | None, *,
    is_master: bool,
) -> tuple[ResolvedSpec, float, Any]:
    """``from_spec``'s common part: the resolved spec, the deadline (argument, else the spec's) and
    the control store (given, else opened at ``host:port``; hosted when ``is_master``)."""
    resolved = load_spec(spec)
    t_s = float(timeout_s if timeout_s is not None else resolved.sync.timeout_s)
    if store is None:
        store = _open_store(host, port, is_master=is_master, timeout_s=t_s)
    return resolved, t_s, store


def _open_store(host: str | None, port: int | None, *, is_master: bool, timeout_s: float) -> Any:
    if host is None or port is None:
        raise ValueError("pass host and port of the control store (trainer rank 0 hosts it), or store=")
    from weightbridge.transport.store import open_store

    return open_store(host, port, is_master=is_master, timeout_s=timeout_s)


class _Endpoint:
    """Epoch machinery shared by both sides: membership, plan, handshake, bridge group."""

    side: str

    def __init__(
        self,
        resolved: ResolvedSpec,
        *,
        side: str,
        rank: int,
        tensors: Mapping[str, torch.Tensor],
        store: Any,
        prefix: str,
        timeout_s: float | None,
        heartbeat_s: float,
        round_bytes: int | None,
        receiver_dedup: str,
        data_plane: DataPlane | None,
        on_round: Callable[[int], None] | None,
        checksums: bool = False,
    ) -> None:
        self.spec = resolved
        self.side = side
        self.rank = rank
        self.me = RankId(side, rank)
        layouts = resolved.trainer if side == TRAINER else resolved.rollout
        if not 0 <= rank < layouts.world_size:
            raise ValueError(f"{side} rank {rank} outside [0, {layouts.world_size}) of the spec")
        self.layout: RankLayout = layouts.ranks[rank]
        check_tensors(self.layout, tensors)
        self.tensors = dict(tensors)
        self.timeout_s = float(timeout_s if timeout_s is not None else resolved.sync.timeout_s)
        self.mode = resolved.sync.mode
        self.max_staleness = resolved.sync.max_staleness
        self.num_trainers = resolved.trainer.world_size
        self.store = store
        self.keys = Keys(prefix)
        self.cp = ControlPlane(store, me=self.me, keys=self.keys, timeout_s=self.timeout_s, heartbeat_s=heartbeat_s)
        self.plans = PlanCache(
            resolved.trainer,
            resolved.rollout,
            round_bytes=int(round_bytes if round_bytes is not None else resolved.sync.round_bytes),
            receiver_dedup=receiver_dedup,
        )
        self.data_plane: DataPlane = data_plane or TransportDataPlane(
            transport=resolved.sync.transport, device=_device_of(tensors), checksums=checksums
        )
        self.wire = f"checksums={bool(checksums)}"
        self.on_round = on_round
        self.nonce = uuid.uuid4().hex
        self.dtypes, self.dtype_diffs = actual_dtypes(self.layout, tensors)
        self._expected_dtypes = {RankId(TRAINER, r.rank): expected_dtypes(r) for r in resolved.trainer.ranks}
        self._expected_dtypes.update({RankId(ROLLOUT, r.rank): expected_dtypes(r) for r in resolved.rollout.ranks})
        # epoch state
        self.epoch = 0
        self.members: Membership | None = None
        self.hellos: dict[RankId, Hello] = {}
        self.plan: TransferPlan | None = None
        self.plan_rank = -1
        self.broken = False  # the epoch's bridge group is unusable (a push failed in it)
        self.failure_epoch = 0  # where this rank's failures are published: the epoch it is in or entering
        self.closed = False

    # -- joining ------------------------------------------------------------------------------
    def _join(self, instance: int) -> None:
        self.cp.start_heartbeat()
        self.cp.set(
            self.keys.join(self.me.key),
            Join(side=self.side, rank=self.rank, instance=instance, nonce=self.nonce, pid=os.getpid(),
                 host=socket.gethostname()),
        )

    def _member_ids(self, m: Membership) -> list[RankId]:
        return [RankId(TRAINER, t) for t in range(m.num_trainers)] + [RankId(ROLLOUT, r) for r in m.rollout_ranks]

    def _enter_epoch(self, cp: ControlPlane, epoch: int) -> bool:
        """Handshake and open the bridge group of ``epoch``; False if this rank is not a member."""
        deadline = cp.deadline()
        raw = cp.wait_for([self.keys.members(epoch)], deadline, f"the membership of epoch {epoch}", epoch=epoch)
        m = decode(raw[0], Membership)
        if self.side == ROLLOUT and self.rank not in m.rollout_ranks:
            return False
        self.failure_epoch = epoch
        plan = self.plans.plan(m.instances)
        plan_rank = self.rank if self.side == TRAINER else m.rollout_ranks.index(self.rank)
        hello = Hello(
            side=self.side, rank=self.rank, epoch=epoch, spec_hash=self.spec.spec_hash, plan_hash=plan.plan_hash,
            dtypes=self.dtypes, dtype_diffs=self.dtype_diffs, wire=self.wire, nonce=self.nonce,
        )
        members = self._member_ids(m)
        self.data_plane.close(abort=self.broken)
        self.plan = None
        self.hellos = cp.handshake(hello, members, self._expected_dtypes, deadline)
        bridge_rank = plan_rank if self.side == TRAINER else m.num_trainers + plan_rank
        self.data_plane.connect(
            cp.store, prefix=self.keys.group_prefix(epoch), bridge_rank=bridge_rank,
            world_size=m.num_trainers + len(m.rollout_ranks), num_trainers=m.num_trainers, timeout_s=self.timeout_s,
        )
        self.epoch, self.members, self.plan, self.plan_rank, self.broken = epoch, m, plan, plan_rank, False
        log.info("%s: entered epoch %d (%s), plan %s", self.me, epoch, m.reason, plan.plan_hash[:12])
        return True

    def _fail(self, cp: ControlPlane, exc: BaseException) -> None:
        """Publish ``exc`` to the epoch's members (unless it came from a peer) and mark the group unusable."""
        self.broken = True
        cp.publish_failure(self.failure_epoch, exc)
        # Drop the group now: peers blocked on this rank's sockets fail at once instead of at
        # their deadline. The next push re-creates it in a new epoch.
        self.data_plane.close(abort=True)

    def _close_common(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.cp.delete(self.keys.join(self.me.key))
            self.cp.set(self.keys.leave(self.me.key), Leave(side=self.side, rank=self.rank, nonce=self.nonce))
        except BridgeError:
            pass  # store host already gone
        self.cp.stop_heartbeat()
        self.data_plane.close(abort=self.broken)


def _device_of(tensors: Mapping[str, torch.Tensor]) -> torch.device:
    for t in tensors.values():
        return t.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# trainer side
# ---------------------------------------------------------------------------------------------


class TrainerBridge(_Endpoint):
    """One trainer rank's end of the bridge. See the module docstring for the call sequence."""

    def __init__(self, resolved: ResolvedSpec, *, min_instances: int, **kw: Any) -> None:
        super().__init__(resolved, side=TRAINER, **kw)
        if not 1 <= min_instances <= resolved.rollout.num_instances:
            raise ValueError(f"min_instances must be in [1, {resolved.rollout.num_instances}], got {min_instances}")
        self.min_instances = min_instances
        self._since = 0
        self.last_version: int | None = None
        # Trainer 0 numbers pushes from the last announcement (it may be a restarted process);
        # other ranks match announcements by version, so one made before they connected counts.
        ann = self.cp.get(self.keys.announce, Announce) if self.rank == 0 else None
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
        prefix: str = "wb",
        timeout_s: float | None = None,
        heartbeat_s: float = 1.0,
        round_bytes: int | None = None,
        receiver_dedup: str = "auto",
        min_instances: int | None = None,
        data_plane: DataPlane | None = None,
        on_round: Callable[[int], None] | None = None,
        checksums: bool = False,
    ) -> TrainerBridge:
        """Connect trainer rank ``rank`` holding ``tensors`` (local name -> tensor, as in the spec).

        Rank 0 hosts the control store at ``host:port`` unless ``store`` is given. ``timeout_s``,
        ``round_bytes`` override the spec's ``sync`` section (every rank must agree: the plan
        hash is checked). ``min_instances`` (default: all of the spec's rollout instances) is how
        many complete, live rollout instances every push waits for (up to the deadline); each push
        goes to the instances present then, so late ones join at a later push and a dead one is
        dropped once fewer than all are required.
        ``on_round(round_index)`` is called by the data plane after each round (progress).
        ``checksums=True`` appends a checksum to every bucket and verifies it on receipt (a
        corrupted update raises ``ChecksumError``: staged receivers keep the previous version,
        in-place ones report torn); every rank must pass the same value (checked at the handshake).
        """
        resolved, t_s, store = _connect(spec, host, port, store, timeout_s, is_master=rank == 0)
        return cls(
            resolved,
            rank=rank,
            tensors=tensors,
            store=store,
            prefix=prefix,
            timeout_s=t_s,
            heartbeat_s=heartbeat_s,
            round_bytes=round_bytes,
            receiver_dedup=receiver_dedup,
            data_plane=data_plane,
            on_round=on_round,
            checksums=checksums,
            min_instances=min_instances if min_instances is not None else resolved.rollout.num_instances,
        )

    # -- push ---------------------------------------------------------------------------------
    def push(self, version: int, tensors: Mapping[str, torch.Tensor] | None = None) -> PushStats:
        """Send version ``version`` (strictly increasing) to every rollout rank of the epoch.

        Called by every trainer rank with the same ``version``. ``tensors`` replaces the local
        tensors given so far (when the training framework re-allocated them); by default the
        tensors passed to ``from_spec`` are read as they are now. Returns per the mode (module
        docstring). Raises a typed error on any failure, after telling the other ranks.
        """
        if tensors is not None:
            check_tensors(self.layout, tensors)
            if actual_dtypes(self.layout, tensors)[0] != self.dtypes:
                raise ValueError(f"{self.me}: push(tensors=...) changed tensor dtypes since the handshake")
            self.tensors = dict(tensors)
        if self.closed:
            raise BridgeError(f"{self.me}: push() after close()")
        if self.last_version is not None and version <= self.last_version:
            raise ValueError(f"{self.me}: versions must increase: pushed {self.last_version}, then {version}")
        t0 = time.perf_counter()
        wait_s = 0.0
        # Failures already published in the current epoch concern an earlier push: the waits
        # before the announcement ignore them (trainer 0 starts a new epoch because of them).
        self._since = self.cp.counter(self.keys.failures(self.epoch))
        try:
            if self.rank == 0:
                ann, waited = self._announce(version)
                wait_s += waited
            else:
                ann = self._await_announce(version)
            self.seq = ann.seq  # announced: the next push is seq + 1 even if this one fails
            new_epoch = ann.epoch != self.epoch or self.broken
            if new_epoch:
                self._enter_epoch(self.cp, ann.epoch)
            assert self.plan is not None and self.members is not None
            run = self.data_plane.run(
                self.plan, side=TRAINER, rank=self.rank, tensors=self.tensors, dst=None,
                tag=f"v{version}", on_round=self.on_round,
            )
            t_ack = time.perf_counter()
            self._await_acks(ann)
            wait_s += time.perf_counter() - t_ack
        except BaseException as exc:
            self._fail(self.cp, exc)
            raise
        self.last_version = version
        return PushStats(
            version=version, seq=ann.seq, epoch=ann.epoch, mode=self.mode, bytes_sent=run.bytes_sent,
            wire_bytes=self.plan.wire_bytes, seconds=time.perf_counter() - t0, transfer_s=run.seconds,
            wait_s=wait_s, num_rounds=self.plan.num_rounds, new_epoch=new_epoch,
        )

    def _announce(self, version: int) -> tuple[Announce, float]:
        """Trainer rank 0: decide the epoch, enforce the staleness bound, announce the push."""
        cp = self.cp
        deadline = cp.deadline()
        instances = self._await_instances(deadline)
        waited = 0.0
        if self.mode == "async":
            t = time.perf_counter()
            self._await_staleness(version, rollout_ranks_of(self.spec.rollout, instances), deadline)
            waited = time.perf_counter() - t
        reason = self._epoch_change(instances)
        epoch = self.epoch
        if reason:
            epoch = cp.increment(self.keys.epoch)
            cp.set(
                self.keys.members(epoch),
                Membership(
                    epoch=epoch, num_trainers=self.num_trainers, instances=instances,
                    rollout_ranks=rollout_ranks_of(self.spec.rollout, instances), reason=reason,
                ),
            )
        ann = Announce(seq=self.seq + 1, version=version, epoch=epoch)
        cp.set(self.keys.announce, ann)
        return ann, waited

    def _joined_instances(self) -> tuple[int, ...]:
        """Instances whose every rank has joined and is not known dead."""
        now = time.monotonic()
        out = []
        for inst in range(self.spec.rollout.num_instances):
            ranks = [RankId(ROLLOUT, r.rank) for r in self.spec.rollout.instance_ranks(inst)]
            if not self.cp.exists([self.keys.join(r.key) for r in ranks]):
                continue
            alive = True
            for r in ranks:
                counter = self.cp.counter(self.keys.heartbeat(r.key))
                self.cp.monitor.observe(r, counter, now)
                alive = alive and not self.cp.monitor.dead(r, now) and not self.cp.monitor.known_dead(r, counter)
            if alive:
                out.append(inst)
        return tuple(out)

    def _await_instances(self, deadline: float) -> tuple[int, ...]:
        got: list[tuple[int, ...]] = []

        def enough(_: list[bytes]) -> bool:
            got[:] = [self._joined_instances()]
            return len(got[0]) >= self.min_instances

        self.cp.wait_for([], deadline, f"at least {self.min_instances} complete rollout instance(s) to join",
                         ready=enough, epoch=self.epoch or None, since=self._since)
        return got[0]

    def _epoch_change(self, instances: tuple[int, ...]) -> str:
        """Why the next push needs a new epoch ('' if it does not)."""
        if self.members is None:
            return "first push"
        if self.broken or self.cp.counter(self.keys.failures(self.epoch)) > 0:
            return f"recovery after a failure in epoch {self.epoch}"
        if instances != self.members.instances:
            return f"rollout instances {list(self.members.instances)} -> {list(instances)}"
        for who, hello in self.hellos.items():
            join = self.cp.get(self.keys.join(who.key), Join)
            if join is None or join.nonce != hello.nonce:
                return f"{who} reconnected"
        return ""

    def _await_staleness(self, version: int, rollout_ranks: tuple[int, ...], deadline: float) -> None:
        """Async: wait until every receiver that has staged something applied >= version - max(k, 1)."""
        bound = version - max(self.max_staleness, 1)
        ranks = [r for r in rollout_ranks if self.cp.exists([self.keys.ack("staged", r)])]
        if not ranks:
            return

        def fresh(_: list[bytes]) -> bool:
            for r in ranks:
                ack = self.cp.get(self.keys.ack("applied", r), Ack)
                if ack is None or ack.version < bound:
                    return False
            return True

        self.cp.wait_for(
            [], deadline, f"every receiver to apply version >= {bound} (max_staleness {self.max_staleness})",
            ready=fresh, epoch=self.epoch or None, since=self._since,
            watch=[RankId(ROLLOUT, r) for r in ranks],
        )

    def _await_announce(self, version: int) -> Announce:
        """Trainer ranks > 0: wait for rank 0's announcement of ``version`` (two deadlines: it may
        first wait for the staleness bound)."""
        seen: list[Announce] = []

        def is_mine(values: list[bytes]) -> bool:
            ann = decode(values[0], Announce)
            if ann.seq <= self.seq or ann.version != version:
                return False
            if self.seq == 0 and self.cp.counter(self.keys.failures(ann.epoch)) > 0:
                return False  # a fresh (restarted) process: that is the failed attempt, not the retry
            seen[:] = [ann]
            return True

        self.cp.wait_for(
            [self.keys.announce], self.cp.deadline(2 * self.timeout_s), f"trainer 0 to announce version {version}",
            # epoch 0 too: trainer 0 publishes there when it fails before any epoch (no receivers)
            ready=is_mine, epoch=self.epoch, since=self._since, watch=[RankId(TRAINER, 0)],
        )
        return seen[0]

    def _await_acks(self, ann: Announce) -> None:
        assert self.members is not None
        ranks = self.members.rollout_ranks
        stage = "applied" if self.mode != "async" or self.max_staleness == 0 else "staged"
        keys = [self.keys.ack(stage, r) for r in ranks]

        def done(values: list[bytes]) -> bool:
            return all(decode(v, Ack).seq >= ann.seq for v in values)

        self.cp.wait_for(
            keys, self.cp.deadline(), f"every rollout rank to ack {stage} version {ann.version}",
            ready=done, epoch=ann.epoch, watch=self._member_ids(self.members),
        )

    def close(self) -> None:
        """Leave the bridge. Trainer rank 0 hosts the store: close it last."""
        self._close_common()


# ---------------------------------------------------------------------------------------------
# rollout side
# ---------------------------------------------------------------------------------------------


class RolloutBridge(_Endpoint):
    """One rollout rank's end of the bridge. See the module docstring for the call sequence.

    State (guarded by one lock; the receive thread and the engine thread both touch it)::

        version      last applied version (None before the first apply, and while torn)
        torn         in place: an update began and did not complete; live weights are mixed
        staged       a complete version waiting for apply() (in the staging copy, or in place)
    """

    def __init__(self, resolved: ResolvedSpec, *, staging: bool, **kw: Any) -> None:
        super().__init__(resolved, side=ROLLOUT, **kw)
        self.staging = staging
        self._staging: dict[str, torch.Tensor] | None = (
            {name: t.detach().clone() for name, t in self.tensors.items() if name in _names(self.layout)}
            if staging else None
        )
        self._lock = threading.Lock()
        self._version: int | None = None
        self._torn: tuple[int, int | None, str] | None = None  # (version, previous, cause)
        self._staged: Announce | None = None
        self._error: BaseException | None = None
        self.last_receive: ReceiveStats | None = None
        self.last_apply_s = 0.0
        ann = self.cp.get(self.keys.announce, Announce)
        self._handled_seq = ann.seq if ann is not None else 0  # pushes before joining are not ours
        self._stop = threading.Event()
        # Held by the receive thread for a whole receive, and by an engine that needs the staged
        # version to stay put across a multi-rank decision (see hold()).
        self._gate = threading.Lock()
        self._thread: threading.Thread | None = None
        self._join(instance=self.layout.instance)
        if staging:
            self._thread = threading.Thread(target=self._receive_loop, name=f"weightbridge-receive-{rank_key(self)}",
                                            daemon=True)
            self._thread.start()

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
        staging: bool = True,
        prefix: str = "wb",
        timeout_s: float | None = None,
        heartbeat_s: float = 1.0,
        round_bytes: int | None = None,
        receiver_dedup: str = "auto",
        data_plane: DataPlane | None = None,
        on_round: Callable[[int], None] | None = None,
        checksums: bool = False,
    ) -> RolloutBridge:
        """Connect rollout rank ``rank`` (spec numbering, instance-major) with its live ``tensors``.

        ``staging=True`` keeps a copy of the weights to receive into (2x memory; the engine
        serves the old version until ``apply()``); ``staging=False`` receives in place inside
        ``poll()``.
        """
        resolved, t_s, store = _connect(spec, host, port, store, timeout_s, is_master=False)
        return cls(
            resolved, rank=rank, tensors=tensors, store=store, prefix=prefix, timeout_s=t_s,
            heartbeat_s=heartbeat_s, round_bytes=round_bytes, receiver_dedup=receiver_dedup,
            data_plane=data_plane, on_round=on_round, staging=staging, checksums=checksums,
        )

    # -- engine-facing ------------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        """The version the live weights hold; None before the first apply and while torn."""
        with self._lock:
            return None if self._torn is not None else self._version

    @property
    def torn(self) -> bool:
        with self._lock:
            return self._torn is not None

    def ready(self) -> bool:
        """True when a complete version is waiting for ``apply()`` (no progress is made)."""
        with self._lock:
            return self._staged is not None

    @property
    def staged_version(self) -> int | None:
        """The complete version waiting for ``apply()``, or None."""
        with self._lock:
            return None if self._staged is None else self._staged.version

    def try_hold(self) -> bool:
        """Non-blocking: keep the staged version from being superseded until :meth:`release`.

        For engines whose ranks must agree on the version to apply (all TP ranks of an instance
        apply the same one): each rank try-holds, the ranks exchange ``staged_version``, apply
        if they agree, then release. False while a receive is in flight (retry later). Never
        blocks, so a rank holding the gate cannot wait on a peer whose receive needs this one.
        """
        return self._gate.acquire(blocking=False)

    def release(self) -> None:
        """End a :meth:`try_hold` that returned True."""
        self._gate.release()

    def poll(self) -> bool:
        """Make progress; True when a complete version is ready for ``apply()``.

        Staging: never blocks (the receive runs on a background thread). In place: when a push
        is announced, receives it here, into the live weights (blocks for the transfer). Raises
        the error of a failed receive once (the bridge stays usable for the next push).
        """
        self._raise_pending()
        if not self.staging:
            ann = self.cp.get(self.keys.announce, Announce)
            if ann is not None and ann.seq > self._handled_seq:
                self._receive(self.cp, ann, keep_error=False)
        return self.ready()

    def apply(self) -> int:
        """At a safe point: make the ready version live and return the live version.

        Staging: copies the staged weights into the live tensors. In place: commits the
        received version. With nothing ready, returns the current version. Raises
        :class:`TornModelError` when torn, :class:`NothingToApply` before any version.
        """
        with self._lock:
            staged = self._staged
            if staged is None:
                if self._torn is not None:
                    raise TornModelError(self.me, *self._torn)
                if self._version is None:
                    raise NothingToApply(self.me)
                return self._version
            t0 = time.perf_counter()
            if self._staging is not None:
                try:
                    with torch.no_grad():
                        for name, buf in self._staging.items():
                            self.tensors[name].copy_(buf)
                except BaseException:
                    self._torn = (staged.version, self._version, "apply() failed while copying staged weights")
                    raise
            self._version, self._torn, self._staged = staged.version, None, None
            self.last_apply_s = time.perf_counter() - t0
        self.cp.set(self.keys.ack("applied", self.rank),
                    Ack(rank=self.rank, version=staged.version, seq=staged.seq, epoch=staged.epoch, stage="applied"))
        return staged.version

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)
        self._close_common()

    # -- receiving ----------------------------------------------------------------------------
    def _raise_pending(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def _receive_loop(self) -> None:
        """Staging mode: wait for announcements and receive each into the staging copy."""
        cp = self.cp.clone()
        while not self._stop.is_set():
            try:
                ann = cp.get(self.keys.announce, Announce)
            except BridgeError as exc:
                with self._lock:
                    self._error = exc
                return
            if ann is None or ann.seq <= self._handled_seq:
                self._stop.wait(0.005)
                continue
            if not self._gate.acquire(timeout=0.05):
                continue  # an engine holds the staged version; the announcement stays pending
            try:
                self._receive(cp, ann, keep_error=True)
            except BaseException:  # noqa: BLE001 - kept for poll(); already published by _receive
                pass
            finally:
                self._gate.release()

    def _receive(self, cp: ControlPlane, ann: Announce, *, keep_error: bool) -> None:
        """Receive push ``ann`` (its epoch first, if new); errors are raised (and kept for poll())."""
        self._handled_seq = ann.seq
        try:
            if ann.epoch != self.epoch or self.broken:
                if not self._enter_epoch(cp, ann.epoch):
                    return  # joined after the membership of this push was fixed: next one
            assert self.plan is not None
            with self._lock:
                self._staged = None  # a staged, unapplied older version is superseded
                if self._staging is None:
                    self._torn = (ann.version, self._version, f"in-place receive of version {ann.version} interrupted")
            dst = self._staging if self._staging is not None else self.tensors
            with torch.no_grad():
                run: RunStats = self.data_plane.run(
                    self.plan, side=ROLLOUT, rank=self.plan_rank, tensors=dst, dst=dst, tag=f"v{ann.version}",
                    on_round=self.on_round,
                )
            with self._lock:
                self._staged = ann
                if self._staging is None:
                    self._torn = None
            self.last_receive = ReceiveStats(ann.version, ann.seq, ann.epoch, run.bytes_received, run.seconds,
                                             self._staging is not None)
            cp.set(self.keys.ack("staged", self.rank),
                   Ack(rank=self.rank, version=ann.version, seq=ann.seq, epoch=ann.epoch, stage="staged"))
        except BaseException as exc:
            self._fail(cp, exc)
            if keep_error:
                with self._lock:
                    self._error = exc
            raise


def _names(layout: RankLayout) -> set[str]:
    return {t.name for t in layout.tensors}


def rank_key(ep: _Endpoint) -> str:
    return ep.me.key.replace("/", "-")


# ---------------------------------------------------------------------------------------------
# colocated: one process holds both sides
# ---------------------------------------------------------------------------------------------


class ColocatedBridge:
    """Trainer and rollout tensors in one process: plan items copied directly, no wire.

    ``trainer[t]`` are trainer rank ``t``'s tensors, ``rollout[r]`` rollout rank ``r``'s live
    tensors. ``push(version)`` copies every item (with dtype casts) and the local copies;
    if it raises midway the rollout side is ``torn`` until the next complete push.
    Cross-process colocated setups use :class:`TrainerBridge` / :class:`RolloutBridge`
    (``sync.mode: colocated`` behaves as ``sync`` there).
    """

    def __init__(
        self,
        resolved: ResolvedSpec,
        trainer: Mapping[int, Mapping[str, torch.Tensor]],
        rollout: Mapping[int, Mapping[str, torch.Tensor]],
        *,
        round_bytes: int | None = None,
    ) -> None:
        from weightbridge.plan import build_plan

        for side, given, layout in (("trainer", trainer, resolved.trainer), ("rollout", rollout, resolved.rollout)):
            if sorted(given) != list(range(layout.world_size)):
                raise ValueError(
                    f"{side} tensors for ranks {sorted(given)}; the spec has ranks 0..{layout.world_size - 1}"
                )
            for r in layout.ranks:
                check_tensors(r, given[r.rank])
        self.spec = resolved
        self.trainer = {t: dict(v) for t, v in trainer.items()}
        self.rollout = {r: dict(v) for r, v in rollout.items()}
        self.plan = build_plan(
            resolved.trainer, resolved.rollout,
            round_bytes=int(round_bytes if round_bytes is not None else resolved.sync.round_bytes),
            receiver_dedup="off",
        )
        self.version: int | None = None
        self.torn = False

    @classmethod
    def from_spec(
        cls,
        spec: str | Path | ResolvedSpec,
        *,
        trainer: Mapping[int, Mapping[str, torch.Tensor]],
        rollout: Mapping[int, Mapping[str, torch.Tensor]],
        round_bytes: int | None = None,
    ) -> ColocatedBridge:
        return cls(load_spec(spec), trainer, rollout, round_bytes=round_bytes)

    def push(self, version: int) -> PushStats:
        from weightbridge.transport.pack import apply_local_copies, unpack_items, pack_items

        t0 = time.perf_counter()
        self.torn = True
        with torch.no_grad():
            for _, bucket in self.plan.buckets():
                buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=_device_of(self.rollout[bucket.receiver]))
                pack_items(bucket.items, self.trainer[bucket.sender], buf)
                unpack_items(bucket.items, buf, self.rollout[bucket.receiver])
            for r, tensors in self.rollout.items():
                apply_local_copies(self.plan.local_copies, tensors, rank=r)
        self.torn = False
        self.version = version
        dt = time.perf_counter() - t0
        return PushStats(
            version=version, seq=0, epoch=0, mode="colocated", bytes_sent=self.plan.wire_bytes,
            wire_bytes=self.plan.wire_bytes, seconds=dt, transfer_s=dt, wait_s=0.0,
            num_rounds=self.plan.num_rounds, new_epoch=False,
        )
