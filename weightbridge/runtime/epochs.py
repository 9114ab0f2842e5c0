"""Epoch machinery shared by both sides: joining, the epoch's roster and plan, handshake, bridge group.

Every rank (trainer and rollout) is an :class:`Endpoint`. An epoch is a fixed membership chosen by
trainer rank 0 (:mod:`.coordinator`); each member enters it with :meth:`Endpoint.enter_epoch`
(read the membership, build its :class:`~weightbridge.sync.roster.Roster` and plan, handshake,
open the epoch's bridge group) before the epoch's first push, and :meth:`Endpoint.fail` marks it
unusable after a failure, so the next push starts a new one.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import torch

from weightbridge.errors import BridgeError, ForgedMessage, PeerFailed, ProtocolError
from weightbridge.layout.ir import RankLayout
from weightbridge.plan.network import local_copy_of, network_model
from weightbridge.plan.types import RankPlan
from weightbridge.runtime.connect import device_of
from weightbridge.runtime.options import BridgeOptions
from weightbridge.spec.resolve import ResolvedSpec
from weightbridge.sync.auth import signer_for
from weightbridge.sync.board import Board
from weightbridge.sync.control import ControlPlane
from weightbridge.sync.dataplane import DataPlane, check_data_plane
from weightbridge.sync.plane_choice import data_plane_for
from weightbridge.sync.membership import PlanCache, actual_dtypes, check_tensors, data_check, expected_dtypes
from weightbridge.sync.messages import Hello, Keys
from weightbridge.sync.roster import ROLLOUT, TRAINER, RankId, Roster

log = logging.getLogger(__name__)

REJOIN_CHECK_S = 0.25  # how often a rank checks that its join record is still on the store
CAUSE_WAIT_S = 1.0  # after a transport error: how long to look for the failure a peer published


class Endpoint:
    """One rank's bridge state across epochs (the base of ``TrainerBridge`` and ``RolloutBridge``)."""

    side: str

    def __init__(
        self,
        resolved: ResolvedSpec,
        *,
        side: str,
        rank: int,
        tensors: Mapping[str, torch.Tensor],
        store: Any,
        options: BridgeOptions,
        device: torch.device | str | None = None,
    ) -> None:
        """``device``: where this rank's tensors live (default: the first tensor's; a streaming rollout
        rank, whose ``tensors`` are meta tensors, names it)."""
        sync = resolved.sync
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
        self.options = options
        self.timeout_s = float(sync.timeout_s)
        self.mode = sync.mode
        self.max_staleness = sync.max_staleness
        self.num_trainers = resolved.trainer.world_size
        self.store = store
        # AuthError (how to provide the secret) before anything is written to the store
        self.signer = signer_for(resolved, options.secret)
        spec_ranks = [RankId(TRAINER, r) for r in range(resolved.trainer.world_size)]
        spec_ranks += [RankId(ROLLOUT, r) for r in range(resolved.rollout.world_size)]
        self.cp = ControlPlane(store, me=self.me, keys=Keys(options.prefix), timeout_s=self.timeout_s,
                               heartbeat_s=sync.heartbeat_s, auth=self.signer, ranks=spec_ranks)
        self.board = Board(self.cp)
        # the spec's network model, as `weightbridge plan` uses it (receiver_dedup "auto" is priced on it)
        self.net = network_model(resolved.network, colocated=sync.mode == "colocated",
                                 local_copy=local_copy_of(sync.transport))
        self.plans = PlanCache(resolved.trainer, resolved.rollout, round_bytes=sync.round_bytes,
                               receiver_dedup=sync.receiver_dedup, network=self.net)
        self.device = torch.device(device) if device is not None else device_of(tensors)
        self.data_plane: DataPlane = options.data_plane or data_plane_for(
            sync.transport, device=self.device, checksums=sync.checksums, signer=self.signer, delta=sync.delta,
        )
        check_data_plane(self.data_plane)
        # backend, host and device, in every hello (a data plane that says nothing states no backend)
        describe = getattr(self.data_plane, "identity", None)
        self.identity = describe() if callable(describe) else None
        # Also in the spec hash; kept in the Hello for a data plane given in the options.
        self.wire = f"checksums={sync.checksums}" + (f",delta={sync.delta}" if sync.delta != "off" else "")
        self.on_round: Callable[[int], None] | None = options.on_round
        self.nonce = uuid.uuid4().hex
        self.started_ms = time.time_ns() // 1_000_000  # in the join record: a later process of this rank is larger
        self.dtypes, self.dtype_diffs = actual_dtypes(self.layout, tensors)
        self._expected_dtypes = {RankId(TRAINER, r.rank): expected_dtypes(r) for r in resolved.trainer.ranks}
        self._expected_dtypes.update({RankId(ROLLOUT, r.rank): expected_dtypes(r) for r in resolved.rollout.ranks})
        # epoch state
        self.epoch = 0
        self.roster: Roster | None = None
        self.hellos: dict[RankId, Hello] = {}
        self.plan: RankPlan | None = None
        self.plan_rank = -1
        self.broken = False  # the epoch's bridge group is unusable (a push failed in it)
        self.failure_epoch = 0  # where this rank's failures are published: the epoch it is in or entering
        self.closed = False

    # -- joining ------------------------------------------------------------------------------
    def _join(self, instance: int) -> None:
        self.cp.start_heartbeat()
        self.board.join(instance, self.nonce, self.started_ms)
        self._next_join_check = time.monotonic() + REJOIN_CHECK_S

    def rejoin_if_missing(self, board: Board) -> None:
        """Re-publish this rank's join record if it vanished or is unreadable (every rank, from its
        own loops; at most every ``REJOIN_CHECK_S``): trainer 0 counts only joined ranks, so a deleted
        join key would otherwise exclude a live rank from every later push. A valid record with
        another nonce is left alone if it is a later process of this rank (``started``), and replaced
        if it is an earlier one's (a replayed old value)."""
        now = time.monotonic()
        if self.closed or now < getattr(self, "_next_join_check", 0.0):
            return
        self._next_join_check = now + REJOIN_CHECK_S
        try:
            join = board.join_of(self.me)
            if join is not None and (join.nonce == self.nonce or join.started > self.started_ms):
                return
        except (ProtocolError, ForgedMessage):  # garbage or a forgery under the key: replace it with the real record
            pass
        board.join(self.layout.instance if self.side == ROLLOUT else 0, self.nonce, self.started_ms)

    def explain(self, board: Board, exc: BaseException, epoch: int) -> BaseException:
        """After transport error ``exc`` in ``epoch``: :class:`PeerFailed` carrying the root cause a
        peer published there (e.g. the receiver's ``ChecksumError`` behind this rank's
        ``PeerDisconnected``), looked for up to ``CAUSE_WAIT_S``; else ``exc`` itself, naming its peer's
        host and host-mates when the spec places ranks on hosts (:mod:`.hosts`)."""
        from weightbridge.runtime.coordinator import root_cause
        from weightbridge.runtime.hosts import with_hosts
        from weightbridge.transport.errors import RECEIVER_FINDINGS, TransportError

        if not isinstance(exc, TransportError) or isinstance(exc, RECEIVER_FINDINGS):
            return exc  # not a symptom (or this rank's own finding)
        deadline = time.monotonic() + min(CAUSE_WAIT_S, self.timeout_s / 4)
        while True:
            try:
                with board.cp.bounded(deadline):  # a store that does not answer ends the search, not a deadline later
                    seen = [(RankId(f.side, f.rank), f.error, f.message) for f in board.cp.failures(epoch)]
            except BridgeError:
                return with_hosts(exc, self.net, self.roster)
            cause = root_cause(seen, self.me)
            if cause is not None and cause.root:
                return PeerFailed(self.me, cause.peer, cause.error)
            if time.monotonic() > deadline:
                return with_hosts(exc, self.net, self.roster)
            time.sleep(0.02)

    def epoch_plan(self) -> tuple[RankPlan, Roster]:
        """The current epoch's plan and roster; :class:`ProtocolError` outside of an epoch."""
        if self.plan is None or self.roster is None:
            raise ProtocolError(self.me, "no epoch entered (a push ran before its epoch's handshake)")
        return self.plan, self.roster

    def enter_epoch(self, board: Board, epoch: int) -> bool:
        """Handshake and open the bridge group of ``epoch``; False if this rank is not a member."""
        deadline = board.cp.deadline()
        roster = Roster.of_membership(board.await_membership(epoch, deadline))
        if self.me not in roster:
            return False
        self.failure_epoch = epoch
        plan = self.plans.plan(roster, self.me.side, roster.plan_rank(self.me))
        self.data_plane.close(abort=self.broken)
        self.plan = None
        # Waits in this epoch end when a member restarts (its successor beats under the same key):
        # compared with the hellos (nonce, start) the members sent (a member that restarts before
        # greeting is replaced by its successor's hello).
        self.hellos = board.handshake(
            roster, spec_hash=self.spec.spec_hash, plan_hash=plan.plan_hash, dtypes=self.dtypes,
            dtype_diffs=self.dtype_diffs, wire=self.wire, nonce=self.nonce, expected_dtypes=self._expected_dtypes,
            deadline=deadline, started=self.started_ms, identity=self.identity,
        )
        place = getattr(self.data_plane, "place", None)
        if callable(place):  # which members share this rank's host (the colocated data plane)
            place({roster.bridge_rank(m): h.identity for m, h in self.hellos.items()})
        self.data_plane.connect(
            board.cp.store, prefix=board.group_prefix(epoch), bridge_rank=roster.bridge_rank(self.me),
            world_size=roster.world_size, num_trainers=roster.num_trainers, timeout_s=self.timeout_s, roster=roster,
            watch=board.cp.epoch_watch(epoch, roster.members, self.hellos),
        )
        # data senders prove the secret before the first byte (every data plane; never skipped)
        self.data_auth_s = self.data_plane.authenticate(*data_check(plan, roster, self.me, self.hellos, self.signer))
        self.epoch, self.roster, self.plan, self.plan_rank, self.broken = (
            epoch, roster, plan, roster.plan_rank(self.me), False
        )
        log.info("%s: entered epoch %d (%s), plan %s", self.me, epoch, list(roster.instances), plan.plan_hash[:12])
        return True

    def fail(self, board: Board, exc: BaseException, version: int | None = None) -> None:
        """Publish ``exc`` (in push ``version``) to the epoch's members (unless it came from a peer) and
        mark the group unusable."""
        self.broken = True
        board.cp.publish_failure(self.failure_epoch, exc, version)
        # Drop the group now: peers blocked on this rank's sockets fail at once instead of at
        # their deadline. The next push re-creates it in a new epoch.
        self.data_plane.close(abort=True)

    def _close_common(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.board.leave(self.nonce)
        except BridgeError:
            pass  # store host already gone
        self.cp.stop_heartbeat()
        self.data_plane.close(abort=self.broken)

