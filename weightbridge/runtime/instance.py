"""Instance-level apply: every rank of one rollout instance applies the same version, agreed on the store.

An engine instance with several ranks (vLLM or SGLang with TP/PP/EP > 1) must never serve a mix
of versions. :meth:`RolloutBridge.apply_instance` (called by every rank of the instance together,
e.g. from one collective RPC) runs rounds of :class:`InstanceAgreement`:

1. each rank makes progress (``poll()``; a failed receive becomes its offer's ``error``), keeps its
   staged version from being superseded for the round (the receive gate; skipped while a receive
   is in flight: it then offers nothing), and publishes an :class:`~weightbridge.sync.messages.Offer`
   (staged version, live version, late, error, wanted version) under the instance's session and the round number;
2. it waits for the offers of every rank of the instance for that round (heartbeats watched, so a
   dead rank raises ``PeerFailed``), evaluates :func:`~weightbridge.runtime.coordinator.decide_instance_apply`
   on them (the same offers on every rank, so every rank takes the same branch), releases the gate
   and acts: apply the version all staged, return, raise, or run another round.

Rounds are numbered per *session* (a digest of the instance's ranks' join nonces: a restarted rank
starts a new session for all) and a rank deletes its offer of round ``n - 1`` once it has seen every
offer of round ``n`` (by then every rank read it). An instance of one rank decides alone (no store
traffic). :class:`InstanceView` reads an instance's versions from outside (a driver process).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from weightbridge.errors import BridgeError, DeadlineExceeded, PeerFailed, ProtocolError
from weightbridge.runtime import coordinator as co
from weightbridge.sync.board import Board, rollout_ids
from weightbridge.sync.messages import Join, Offer, decode
from weightbridge.sync.roster import ROLLOUT, RankId, instance_rollout_ranks

ROUND_PAUSE_S = 0.005  # between rounds that found nothing to apply yet


class InstanceMember(Protocol):
    """What the agreement reads of its rank's :class:`~weightbridge.runtime.rollout.RolloutBridge`: its public
    surface (declared here, so that ``rollout`` imports ``instance`` and not the reverse)."""

    board: Board
    me: RankId
    rank: int  # spec numbering
    layout: Any  # its .instance: the rollout instance this rank belongs to
    spec: Any  # the resolved spec (its .rollout)
    staging: bool

    @property
    def staged_version(self) -> int | None: ...

    @property
    def version(self) -> int | None: ...

    def poll(self) -> bool: ...


@dataclass(frozen=True)
class MemberOps:
    """What the agreement does to its rank's bridge beyond the public surface, handed over by the bridge
    (:meth:`~weightbridge.runtime.rollout.RolloutBridge.apply_instance`); each is named by what it does there.

    ``gate``: held by the receive thread for a whole receive; the agreement holds it while the instance
    decides, so that the staged version is not superseded meanwhile. ``receives_in_place()``: this call
    receives in place (no staging; live tensors or a sink). ``receive_pending()``: receive an announced push
    now, keeping any error for the next ``poll()``. ``apply_staged()``: ``apply()`` without raising a kept
    error. ``unapplied_stream(reason)``: a streamed version its instance did not apply leaves the rank torn.
    """

    gate: threading.Lock
    receives_in_place: Callable[[], bool]
    receive_pending: Callable[[], None]
    apply_staged: Callable[[], int]
    unapplied_stream: Callable[[str], None]


class InstanceAgreement:
    """The apply agreement of one rollout rank with the other ranks of its instance."""

    def __init__(self, bridge: InstanceMember, ops: MemberOps) -> None:
        self.bridge = bridge
        self.ops = ops
        self.board: Board = bridge.board  # the engine thread's connection (the receive thread has its own)
        self.me = bridge.me
        self.instance = bridge.layout.instance
        self.ranks = instance_rollout_ranks(bridge.spec.rollout, self.instance)
        self.peers = [RankId(ROLLOUT, r) for r in self.ranks if r != bridge.rank]
        self._next_round: dict[str, int] = {}  # session -> its next round number
        self._mine: dict[str, int] = {}  # session -> my latest round whose offer is still on the store

    def apply(self, want: int | None, timeout_s: float) -> int | None:
        """One ``apply_instance`` call. A streaming rank (in place, no live tensors) has written what it
        received into the engine already: unless the instance applies exactly that, it is torn."""
        outcome = "it raised"
        try:
            applied = self._apply_loop(want, timeout_s)
            outcome = "no version was applied" if applied is None else f"version {applied} was applied"
            return applied
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"[:300]
            raise
        finally:
            self.ops.unapplied_stream(outcome)  # no-op unless a streamed version is left staged

    def _apply_loop(self, want: int | None, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        session = self._session(deadline) if self.peers else ""
        while True:
            offer, held, error = self._offer(session, deadline, want)
            try:
                offers = [offer] + (self._peer_offers(session, offer, deadline + timeout_s, 2 * timeout_s)
                                  if self.peers else [])
                decision = co.decide_instance_apply(offers)
                if isinstance(decision, co.ApplyStaged):
                    return self._apply(decision.version)
            finally:
                if held:
                    self.ops.gate.release()
            if isinstance(decision, co.RankFailed):
                if decision.rank == self.me.rank and error is not None:
                    raise error
                raise PeerFailed(self.me, RankId(ROLLOUT, decision.rank), decision.error)
            if isinstance(decision, co.WantsDiffer):
                wants = ", ".join(f"{RankId(ROLLOUT, r)}: {'any' if w is None else w}" for r, w in decision.wants)
                raise ProtocolError(
                    self.me, f"the ranks of rollout instance {self.instance} called apply_instance with different "
                    f"versions in one round ({wants}); nothing was applied (every rank of an instance makes the "
                    "same apply_instance calls with the same arguments)")
            if isinstance(decision, co.AlreadyLive):
                return decision.version
            if isinstance(decision, co.NothingCommon):
                return None
            if isinstance(decision, co.TooLate):
                lagging = ", ".join(str(RankId(ROLLOUT, r)) for r in decision.lagging)
                raise DeadlineExceeded(
                    self.me, f"version {decision.want} staged on every rank of rollout instance {self.instance} "
                    f"(not staged on {lagging})", timeout_s,
                )
            time.sleep(ROUND_PAUSE_S)

    # -- one round ----------------------------------------------------------------------------
    def _offer(self, session: str, deadline: float, want: int | None) -> tuple[Offer, bool, BaseException | None]:
        bridge = self.bridge
        error: BaseException | None = None
        try:
            bridge.poll()  # raises a failed receive once; the other ranks must hear of it
        except BridgeError as exc:
            error = exc
        held = False
        staged = None
        if error is None:
            if bridge.staging:
                held = self.ops.gate.acquire(blocking=False)  # False while a receive is in flight
                staged = bridge.staged_version if held else None
            else:
                staged = bridge.staged_version  # in place: only poll() (this thread) changes it
        n = self._next_round.get(session, 0)
        self._next_round[session] = n + 1
        offer = Offer(
            rank=self.me.rank, round=n, staged=staged, live=bridge.version, late=time.monotonic() > deadline,
            error=None if error is None else f"{type(error).__name__}: {error}", want=want,
        )
        if self.peers:
            try:
                self.board.offer(self.instance, session, offer)
            except BaseException:
                if held:
                    self.ops.gate.release()
                raise
        return offer, held, error

    def _peer_offers(self, session: str, mine: Offer, deadline: float, budget_s: float) -> list[Offer]:
        """Every peer's offer of ``mine``'s round, up to ``deadline`` (``budget_s`` after the apply began: a
        late peer still offers, marked late, within the apply's own deadline plus one)."""
        ranks = [p.rank for p in self.peers]
        keys = self.board.offer_keys(self.instance, session, mine.round, ranks)
        progress = self.ops.receive_pending if (self.ops.receives_in_place() and mine.staged is None) else None
        raw = self.board.cp.wait_for(
            keys, deadline, f"rollout ranks {ranks} of instance {self.instance} to reach round {mine.round} of "
            "apply_instance (does every rank of the instance call it?)", watch=self.peers, progress=progress,
            budget_s=budget_s,
        )
        offers = [decode(v, Offer) for v in raw]
        for o in offers:
            if o.round != mine.round:
                raise ProtocolError(self.me, f"offer of round {o.round} from rollout {o.rank} under round {mine.round}")
        previous = self._mine.get(session)
        if previous is not None:  # every rank published round n, so every rank has read my round n - 1
            self.board.withdraw_offer(self.instance, session, previous)
        self._mine[session] = mine.round
        return offers

    def _apply(self, version: int) -> int:
        applied = self.ops.apply_staged()  # poll() this round raised any kept error already
        if applied != version:
            raise ProtocolError(self.me, f"the instance agreed on version {version}, the staged one was {applied}")
        return applied

    def _session(self, deadline: float) -> str:
        """A digest of the instance's ranks' join nonces (waits until every rank joined)."""
        ids = rollout_ids(self.ranks)
        raw = self.board.cp.wait_for(
            self.board.join_keys(ids), deadline, f"every rank of rollout instance {self.instance} to join", watch=ids,
        )
        nonces = "/".join(decode(v, Join).nonce for v in raw)
        return hashlib.sha256(nonces.encode()).hexdigest()[:12]


class InstanceView:
    """Read-only: the versions of one rollout instance, for a process that is not a rank (a driver).

    ``applied()``: the version every rank of the instance applied last (None before the first);
    ``staged()``: the newest version every rank has complete (None if one has none).
    """

    def __init__(
        self, resolved: Any, instance: int, store: Any, *, prefix: str = "wb", timeout_s: float = 60.0
    ) -> None:
        from weightbridge.sync.control import ControlPlane
        from weightbridge.sync.messages import Keys

        if not 0 <= instance < resolved.rollout.num_instances:
            raise ValueError(f"instance {instance} outside [0, {resolved.rollout.num_instances}) of the spec")
        self.instance = instance
        self.ranks = instance_rollout_ranks(resolved.rollout, instance)
        from weightbridge.sync.auth import signer_for  # the job secret: $WEIGHTBRIDGE_SECRET or sync.secret_file

        self.board = Board(ControlPlane(store, me=RankId("driver", instance), keys=Keys(prefix), timeout_s=timeout_s,
                                        auth=signer_for(resolved)))

    @classmethod
    def connect(cls, resolved: Any, instance: int, *, host: str, port: int, prefix: str = "wb",
                timeout_s: float = 60.0) -> InstanceView:
        from weightbridge.transport.store import open_store

        return cls(resolved, instance, open_store(host, port, is_master=False, timeout_s=timeout_s),
                   prefix=prefix, timeout_s=timeout_s)

    def staged(self) -> int | None:
        acks = self.board.acks("staged", self.ranks)
        return None if len(acks) < len(self.ranks) else min(a.version for a in acks.values())

    def applied(self) -> int | None:
        acks = self.board.acks("applied", self.ranks)
        if len(acks) < len(self.ranks):
            return None
        versions = {a.version for a in acks.values()}
        if len(versions) != 1:
            raise ProtocolError(
                f"rollout instance {self.instance}", f"ranks report different applied versions {sorted(versions)}"
            )
        return versions.pop()
