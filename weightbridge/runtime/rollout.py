"""The rollout side: ``RolloutBridge`` on every rollout rank (each TP/EP worker of each engine instance).

State (guarded by one lock; the receive thread and the engine thread both touch it)::

    version      last applied version (None before the first apply, and while torn)
    torn         in place: an update began and did not complete; live weights are mixed
    staged       a complete version waiting for apply() (in the staging copy, or in place)

Threads: with ``staging=True`` a background thread receives every announced push into the
staging copy; the engine's thread calls ``poll`` / ``apply`` / ``apply_instance``.

Streaming (``tensors=None``: an engine whose weights are not tensors the bridge can write, e.g.
behind vLLM's or SGLang's reload; ``docs/memory.md``): the rank keeps no copy of its shard. In
place, a receive runs only inside a call given a ``sink`` (``poll(sink=)`` / ``apply_instance(sink=)``,
from the engine's update session), and each local tensor goes to ``sink(name, tensor)`` as soon
as its last bytes arrived: the engine is written during the receive, so the rank is torn until
the version is applied, and stays torn if its instance does not apply it. With staging, the
staging copy (one shard, on the device or in host memory: ``sync.staging_memory``) is received
on the background thread and written into the ``sink`` given to ``apply`` / ``apply_instance``. A gate (held by
the receive thread for a whole receive, and by :mod:`.instance` while the instance's ranks decide)
keeps a staged version from being superseded while the instance agrees on it.

Robust reading: the announcement is read through :meth:`RolloutBridge._announcement`; a bad value
under its key (garbage, another message kind, oversized, unauthenticated) is a typed
``BadMessage`` raised once, at the next ``poll()`` / ``apply()``, and the receive thread keeps
serving later genuine announcements. An announcement later than the last one handled is a new
push (:func:`~weightbridge.runtime.coordinator.receives`); a replayed older one is ignored. Every loop also puts
back this rank's join record and its latest acks if they vanished or were overwritten with bad
values (:meth:`RolloutBridge._repair`): trainer 0 reads them for membership and the staleness bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from weightbridge.errors import BadMessage, BridgeError, ForgedMessage, NothingToApply, ProtocolError, TornModelError
from weightbridge.runtime import coordinator as co
from weightbridge.runtime.connect import connect
from weightbridge.runtime.epochs import CAUSE_WAIT_S, REJOIN_CHECK_S, Endpoint
from weightbridge.runtime.options import BridgeOptions, reject_moved
from weightbridge.runtime.results import ReceiveStats
from weightbridge.runtime.staging import layout_shapes, staging_copy
from weightbridge.spec.resolve import ResolvedSpec
from weightbridge.sync.board import Board
from weightbridge.sync.dataplane import RunStats
from weightbridge.sync.messages import Announce
from weightbridge.sync.roster import ROLLOUT

Sink = Callable[[str, torch.Tensor], None]  # where a streaming rank puts each complete local tensor


class RolloutBridge(Endpoint):
    """One rollout rank's end of the bridge. See :mod:`weightbridge.bridge` for the call sequence."""

    def __init__(self, resolved: ResolvedSpec, *, staging: bool, tensors: Mapping[str, torch.Tensor] | None,
                 device: torch.device | str | None = None, **kw: Any) -> None:
        self.live = tensors is not None  # False: streaming (module docstring)
        if tensors is None:
            tensors = layout_shapes(resolved, kw.get("rank", -1))
            device = torch.device("cpu") if device is None else device
        super().__init__(resolved, side=ROLLOUT, tensors=tensors, device=device, **kw)
        self.staging = staging
        self.staging_memory = resolved.sync.staging_memory
        self._staging: dict[str, torch.Tensor] | None = staging_copy(
            self.layout, self.tensors, live=self.live, where=self.staging_memory, device=self.device,
        ) if staging else None
        self._sink: Sink | None = None  # where a streaming rank writes, during the call that gave it
        self._lock = threading.Lock()
        self._version: int | None = None
        self._torn: tuple[int, int | None, str] | None = None  # (version, previous, cause)
        self._staged: Announce | None = None
        self._error: BaseException | None = None
        self.last_receive: ReceiveStats | None = None
        self.last_apply_s = 0.0
        self._bad: str | None = None  # the bad announcement value last reported (reported once)
        self._acked: dict[str, Announce] = {}  # stage -> the push this rank acked last (to repair its ack)
        self._ack_lock = threading.Lock()
        self._next_ack_check = 0.0
        try:
            ann = self.board.announcement()
        except (ProtocolError, ForgedMessage):
            ann = None
        # pushes before joining are not ours: (epoch, seq) of the last announcement handled
        self._handled: tuple[int, int, int] | None = None if ann is None else ann.order
        self._stop = threading.Event()
        # Held by the receive thread for a whole receive, and by the instance agreement while the
        # instance's ranks decide on the staged version (runtime/instance.py).
        self._gate = threading.Lock()
        self._thread: threading.Thread | None = None
        self._agreement: Any = None  # runtime.instance.InstanceAgreement, on first apply_instance()
        self._join(instance=self.layout.instance)
        if staging:
            name = f"weightbridge-receive-{self.me.key.replace('/', '-')}"
            self._thread = threading.Thread(target=self._receive_loop, name=name, daemon=True)
            self._thread.start()

    @classmethod
    def from_spec(
        cls,
        spec: str | Path | ResolvedSpec,
        *,
        rank: int,
        tensors: Mapping[str, torch.Tensor] | None,
        host: str | None = None,
        port: int | None = None,
        store: Any = None,
        staging: bool | None = None,
        device: torch.device | str | None = None,
        options: BridgeOptions | None = None,
        **moved: Any,
    ) -> RolloutBridge:
        """Connect rollout rank ``rank`` (spec numbering, instance-major) with its live ``tensors``.

        ``staging`` (default: the spec's ``sync.staging``, else True in async mode and False
        otherwise; it may differ per rank): True keeps a copy of the rank's shard to receive into
        (on the device or in host memory: ``sync.staging_memory``; the engine serves the old
        version until ``apply()``), False receives in place inside ``poll()``. ``tensors=None``:
        the rank streams (module docstring): it holds no weights of its own and writes each local
        tensor into the ``sink`` given to ``poll`` / ``apply`` / ``apply_instance``; ``device``
        (default: the tensors', else CPU) is where received tensors are put. With ``sync.delta``
        the receive tensors (the staging copy, or ``tensors`` in place) must be written only by
        the bridge: deltas apply onto them (``docs/delta.md``); a streaming rank needs staging
        for them. Settings the ranks must agree on come from the spec's ``sync`` section;
        ``options`` are per-process :class:`BridgeOptions` (see :meth:`TrainerBridge.from_spec`).
        The control store is at ``host:port`` (hosted by trainer rank 0, or external with
        ``sync.store: external``), or ``store``; rollout ranks never host it. A dropped connection is
        re-opened within ``sync.timeout_s``; past it every call raises ``StoreUnreachable``.
        """
        reject_moved("RolloutBridge.from_spec", moved)
        resolved, store = connect(spec, host, port, store, is_master=False, who=f"rollout {rank}")
        staged = resolved.sync.staged() if staging is None else bool(staging)
        if tensors is None and not staged and resolved.sync.delta != "off":
            raise ValueError(f"rollout {rank}: sync.delta applies each push onto the version the receive tensors "
                             "hold, and a streaming rank (tensors=None) in place holds none: receive into a staging "
                             "copy (staging=True or sync.staging: true) or set sync.delta: off")
        return cls(
            resolved, rank=rank, tensors=tensors, store=store, options=options or BridgeOptions(),
            staging=staged, device=device,
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
    def staging_tensors(self) -> Mapping[str, torch.Tensor] | None:
        """The staging copy, read only (it may hold a newer, unapplied version); None without staging."""
        return self._staging

    @property
    def staged_version(self) -> int | None:
        """The complete version waiting for ``apply()``, or None (informative: it may change at once)."""
        with self._lock:
            return None if self._staged is None else self._staged.version

    def poll(self, *, sink: Sink | None = None) -> bool:
        """Make progress; True when a complete version is ready for ``apply()``.

        Staging: never blocks (the receive runs on a background thread). In place: when a push
        is announced, receives it here, into the live weights (blocks for the transfer); a
        streaming rank only when given ``sink``, into which it writes each local tensor as it
        completes. Raises the error of a failed receive once (the bridge stays usable for the
        next push), and a bad announcement value once (``BadMessage``).
        """
        with self._sinking(sink):
            self._raise_pending()
            if self._receives_in_place():
                ann = self._announcement(self.board)
                if ann is not None and co.receives(ann.order, self._handled):
                    self._receive(self.board, ann, keep_error=False)
                    return self.ready()
            self._repair(self.board)  # after the announcement: a push waits for no repair round trips
            return self.ready()

    def _receives_in_place(self) -> bool:
        """In place, with somewhere to put the bytes (a streaming rank: a sink given to this call)."""
        return not self.staging and (self.live or self._sink is not None)

    @contextmanager
    def _sinking(self, sink: Sink | None) -> Iterator[None]:
        if sink is None:  # an outer call's sink (apply_instance's, for the poll() it makes) stays
            yield
            return
        outer, self._sink = self._sink, sink
        try:
            yield
        finally:
            self._sink = outer

    def apply(self, *, sink: Sink | None = None) -> int:
        """At a safe point: make the ready version live and return the live version.

        Staging: copies the staged weights into the live tensors (a streaming rank: writes each
        into ``sink``). In place: commits the received version. With nothing ready, returns the current version. Raises
        :class:`TornModelError` when torn, :class:`NothingToApply` before any version, and first
        an error the receive thread kept that no ``poll()`` raised yet (then nothing is applied;
        a staged version stays for the next call).
        For an instance of several ranks use :meth:`apply_instance` instead.
        """
        with self._sinking(sink):
            self._raise_pending()
            return self._apply_staged()

    def _apply_staged(self) -> int:
        """``apply()`` without raising a kept error (the instance agreement, which polled already)."""
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
                if not self.live and self._sink is None:
                    raise ValueError(f"{self.me}: a streaming rank applies a staged version into the engine: pass "
                                     "sink= to apply() / apply_instance()")
                try:
                    with torch.no_grad():
                        for name, buf in self._staging.items():
                            if self.live:
                                self.tensors[name].copy_(buf)
                            else:
                                self._sink(name, buf)  # type: ignore[misc]
                except BaseException:
                    self._torn = (staged.version, self._version, "apply() failed while copying staged weights")
                    raise
            self._version, self._torn, self._staged = staged.version, None, None
            self.last_apply_s = time.perf_counter() - t0
        self._ack(self.board, "applied", staged)
        return staged.version

    def apply_instance(self, version: int | None = None, *, timeout_s: float | None = None,
                       sink: Sink | None = None) -> int | None:
        """Every rank of this rank's rollout instance applies the same version, or none does.

        Called by **every rank of the instance** together (e.g. from one collective RPC of the
        engine), with the same arguments, the same number of times. The ranks agree through the
        control store (:mod:`weightbridge.runtime.instance`): each publishes the version it has
        staged; they apply when all staged the same one. ``version`` None: apply the version every
        rank has complete, if any, and return it (None when there is none; never waits).
        ``version`` v: wait (up to ``timeout_s``, default the spec's) until every rank staged v or
        newer, apply it and return it; :class:`~weightbridge.errors.DeadlineExceeded` naming the
        spec ranks that did not, :class:`~weightbridge.errors.PeerFailed` when another rank's
        receive failed (its own error on that rank). An instance of one rank decides alone.
        A streaming rank passes ``sink`` (see :meth:`poll` and :meth:`apply`): in place it receives
        here, writing the engine as the bytes arrive, and is torn if the instance does not apply
        the version it received.
        """
        if self._agreement is None:
            from weightbridge.runtime.instance import InstanceAgreement, MemberOps

            self._agreement = InstanceAgreement(self, MemberOps(
                self._gate, self._receives_in_place, self._receive_pending, self._apply_staged, self._unapplied_stream))
        with self._sinking(sink):
            return self._agreement.apply(version, self.timeout_s if timeout_s is None else float(timeout_s))

    def memory(self) -> dict[str, Any]:
        """What this rank's bridge holds or last used beyond the engine's own weights, in bytes
        (``docs/memory.md``): ``staging`` (the staging copy, kept; where: ``staging_memory``),
        ``wire_held`` (wire slabs kept between updates; a streaming rank keeps none),
        ``wire_last`` and ``stream_last`` (the last receive's slab and the most local-tensor bytes
        it held at once), ``round_bytes``."""
        staged = sum(t.numel() * t.element_size() for t in self._staging.values()) if self._staging else 0
        held = getattr(self.data_plane, "held_bytes", None)
        last = self.last_receive
        return {"staging": staged, "staging_memory": self.staging_memory if self._staging else None,
                "wire_held": int(held()) if callable(held) else -1,
                "wire_last": -1 if last is None else last.wire_buffer_bytes,
                "stream_last": -1 if last is None else last.stream_bytes,
                "round_bytes": self.spec.sync.round_bytes}

    def release_buffers(self) -> None:
        """Free the wire slabs kept between updates (e.g. before the engine sleeps); the next receive
        allocates what it needs again. The staging copy, which holds the staged version, stays."""
        release = getattr(self.data_plane, "release_buffers", None)
        if callable(release):
            release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _receive_pending(self) -> None:
        """In place, holding nothing (the instance agreement, while it waits): receive an announced push now,
        so that peers blocked in it (exchange rounds) can finish; an error is kept for the next ``poll()``."""
        try:
            ann = self._announcement(self.board)
        except BridgeError as exc:  # a bad value: the next poll() raises it
            self._keep(exc)
            return
        if ann is not None and co.receives(ann.order, self._handled):
            try:
                self._receive(self.board, ann, keep_error=True)
            except BaseException:  # noqa: BLE001 - kept by _receive for the next poll()
                pass

    def _unapplied_stream(self, reason: str) -> None:
        """A streaming rank wrote a version into the engine that its instance did not apply: torn."""
        with self._lock:
            if not self.live and not self.staging and self._staged is not None:
                self._torn = (self._staged.version, self._version, f"streamed version {self._staged.version} into "
                              f"the engine, but its instance did not apply it ({reason})")
                self._staged = None

    def close(self) -> None:
        """Leave the bridge. A receive in flight is ended first, then the receive thread is waited for:
        its waits on the control store and on the bridge group's rendezvous end at once, an NCCL
        transfer is aborted; a Gloo transfer cannot be interrupted from its own process and ends when
        its peer sends or drops, or at its deadline (``timeout_s``). The peers hear "closed while
        receiving version v" (a published failure)."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self.data_plane.close(abort=True)
            self._thread.join(timeout=self.timeout_s + CAUSE_WAIT_S + 1)
        self._close_common()

    # -- receiving ----------------------------------------------------------------------------
    def _raise_pending(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def _keep(self, exc: BaseException) -> None:
        """Keep ``exc`` for the next ``poll()`` / ``apply()`` (the first one kept wins)."""
        with self._lock:
            if self._error is None:
                self._error = exc

    def _ack(self, board: Board, stage: str, ann: Announce) -> None:
        with self._ack_lock:
            board.ack(stage, ann)
            self._acked[stage] = ann

    def _repair(self, board: Board) -> None:
        """Put back this rank's join record and latest acks if missing, unreadable or not the latest
        (at most every ``REJOIN_CHECK_S``): a deleted, garbage or replayed older applied ack would
        otherwise hold trainer 0's staleness wait until this rank applies again, which may never come."""
        self.rejoin_if_missing(board)
        now = time.monotonic()
        if self.closed or now < self._next_ack_check:
            return
        self._next_ack_check = now + REJOIN_CHECK_S
        with self._ack_lock:
            for stage, ann in self._acked.items():
                try:
                    ack = board.ack_of(stage, self.rank)
                    current = ack is not None and (ack.epoch, ack.seq, ack.version, ack.nonce) == (
                        ann.epoch, ann.seq, ann.version, board.nonce)
                except (ProtocolError, ForgedMessage):
                    current = False
                if not current:
                    board.ack(stage, ann)

    def _announcement(self, board: Board) -> Announce | None:
        """The announcement now. A bad value raises ``BadMessage`` naming this rank once, then
        reads as none until it changes (the next genuine announcement replaces it)."""
        try:
            ann = board.announcement()
        except (ProtocolError, ForgedMessage) as exc:
            text = str(exc)
            with self._lock:
                repeated, self._bad = self._bad == text, text
            if repeated:
                return None
            raise BadMessage(self.me, f"ignored an unusable announcement on the control store ({text}); "
                             "waiting for the next push") from exc
        self._bad = None
        return ann

    def _receive_loop(self) -> None:
        """Staging mode: wait for announcements and receive each into the staging copy.

        Never ends on an error before ``close()``: each is kept for ``poll()`` (a bad value once,
        a store that stays unreachable each time it is seen) and the loop goes on, so a later
        genuine announcement is still received."""
        board = self.board.clone()
        board.cp.stop = self._stop  # close() ends this thread's waits at once
        while not self._stop.is_set():
            try:
                ann = self._announcement(board)
                if ann is None or not co.receives(ann.order, self._handled):
                    self._repair(board)  # only while idle: a push waits for no repair round trips
            except BridgeError as exc:
                self._keep(exc)
                self._stop.wait(0.005 if isinstance(exc, BadMessage) else 0.1)
                continue
            if ann is None or not co.receives(ann.order, self._handled):
                self._stop.wait(0.005)
                continue
            if not self._gate.acquire(timeout=0.05):
                continue  # the instance is deciding on the staged version; the announcement stays pending
            try:
                self._receive(board, ann, keep_error=True)
            except BaseException:  # noqa: BLE001 - kept for poll(); already published by _receive
                pass
            finally:
                self._gate.release()

    def _receive(self, board: Board, ann: Announce, *, keep_error: bool) -> None:
        """Receive push ``ann`` (its epoch first, if new); errors are raised (and kept for poll())."""
        self._handled = ann.order
        try:
            if ann.epoch != self.epoch or self.broken:
                if not self.enter_epoch(board, ann.epoch):
                    return  # joined after the membership of this push was fixed: next one
            plan, _ = self.epoch_plan()
            with self._lock:
                self._staged = None  # a staged, unapplied older version is superseded
                if self._staging is None:
                    self._torn = (ann.version, self._version, f"in-place receive of version {ann.version} interrupted")
            dst = self._staging if self._staging is not None else self.tensors
            stream = {} if self._staging is not None or self.live else {"stream": self._sink}
            with torch.no_grad():
                run: RunStats = self.data_plane.run(
                    plan, side=ROLLOUT, rank=self.plan_rank, tensors=dst, dst=None if stream else dst,
                    tag=f"v{ann.version}", on_round=self.on_round, version=ann.version, **stream,
                )
            with self._lock:
                self._staged = ann
                if self._staging is None:
                    self._torn = None
            self.last_receive = ReceiveStats(ann.version, ann.seq, ann.epoch, run.bytes_received, run.seconds,
                                             self._staging is not None,
                                             run.wire_received if run.wire_received >= 0 else run.bytes_received,
                                             getattr(run, "wire_buffer_bytes", -1), getattr(run, "stream_bytes", -1))
            self._ack(board, "staged", ann)
        except BaseException as exc:
            if self._stop.is_set():  # close() aborted this receive: that is what the peers must hear
                cause: BaseException = BridgeError(f"{self.me}: closed while receiving version {ann.version}")
            else:
                cause = self.explain(board, exc, ann.epoch)  # a peer's ChecksumError behind a disconnect
            self.fail(board, cause, ann.version)
            if keep_error:
                self._keep(cause)
            if cause is not exc:
                raise cause from exc
            raise
