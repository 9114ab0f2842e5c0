"""The seam between the control plane and the bytes: one bridge group per epoch, one run per push.

:class:`TransportDataPlane` is the real one (:mod:`weightbridge.transport`: a standalone
Gloo/NCCL group and the P2P executor). Anything with the same four methods can stand
in for it (the unit tests move bytes through the store, in threads); ``from_spec`` refuses
a data plane that lacks one (``TypeError``).

Call sequence, on every member of an epoch (trainer ranks and the epoch's rollout ranks):

1. ``connect(store, prefix=..., bridge_rank=..., world_size=..., num_trainers=..., roster=..., watch=...)``
   once per epoch, after the handshake; returns when every member connected (or raises). ``roster`` is
   the epoch's :class:`~weightbridge.sync.roster.Roster` (errors name spec ranks through it);
   ``watch()`` raises when a member failed, died or restarted meanwhile, and a data plane that
   waits for its peers calls it while waiting (and raises what it raised).
2. ``authenticate(peers, token)`` right after ``connect``: the data-sender check with the bridge
   ranks its plan exchanges data with (``token(src, dst)``: what ``src`` must send ``dst``, bound to
   the job secret, :mod:`weightbridge.transport.peerauth`); raises ``UnauthenticatedPeer``. A data
   plane whose channel carries no bytes from outside the job (an in-process test plane) may return
   at once, but it must say so by implementing it: it is never skipped.
3. ``run(plan, side=..., rank=..., tensors=..., dst=..., tag=..., version=...)`` once per push, on
   every member (trainers send from ``tensors``; rollout ranks receive into ``dst`` and take part
   in the plan's exchange rounds and local copies). ``version`` is the pushed version (with
   ``sync.delta`` the base of the next push's deltas; a data plane may ignore it). A streaming
   rollout rank (no live tensors, ``docs/memory.md``) passes ``stream=write`` instead of ``dst``
   (``tensors`` then give shapes only): each local tensor goes to ``write(name, tensor)`` once
   complete; only a data plane whose ``run`` takes ``stream`` can serve such a rank.
4. ``close(abort=...)`` before connecting the next epoch (``abort=True`` after a failure, or from
   another thread to end a ``run`` in flight: ``RolloutBridge.close()``).

Optional: ``identity()``, the :class:`~weightbridge.sync.messages.DeviceIdentity` (backend, host, device)
this rank's hello carries, asked once when the bridge is created; the handshake refuses members whose
backends differ and two NCCL members on one device. A data plane without it states no backend (it then
agrees only with members that state none). ``place(identities)``: every member's identity by bridge rank
(from the epoch's authenticated hellos), given right before ``connect`` (the colocated data plane,
:class:`~weightbridge.transport.local_plane.LocalDataPlane`, learns from it which pairs share a host).

:func:`~weightbridge.sync.plane_choice.data_plane_for` picks the data plane of ``sync.transport``: ``gloo`` / ``nccl``: the wire
(:class:`TransportDataPlane`); ``shm`` / ``ipc``: shared memory for pairs on one host (``/dev/shm``; CUDA IPC),
the wire for the others; ``auto``: ``shm`` on CPU, on CUDA ``ipc`` where a GPU holds two members and NCCL
otherwise, and the wire alone with ``sync.delta`` (deltas pay on slow links, not in shared memory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from weightbridge.plan.types import RankPlan, TransferPlan
from weightbridge.sync.roster import Roster


class RunStats(NamedTuple):
    bytes_sent: int  # payload (plan) bytes
    bytes_received: int
    seconds: float
    wire_sent: int = -1  # bytes put on the wire (headers and deltas included); -1: not measured
    wire_received: int = -1
    delta_buckets: int = 0  # buckets this rank sent as deltas (sync.delta)
    wire_buffer_bytes: int = -1  # wire slabs this run allocated (-1: not measured)
    stream_bytes: int = -1  # streaming receive: the most local-tensor bytes alive at once (-1: not streaming)


class DataPlane(Protocol):
    def connect(
        self, store: Any, *, prefix: str, bridge_rank: int, world_size: int, num_trainers: int, timeout_s: float,
        roster: Roster | None = None, watch: Callable[[], None] | None = None,
    ) -> None: ...

    def run(
        self,
        plan: TransferPlan | RankPlan,
        *,
        side: str,
        rank: int,
        tensors: Mapping[str, torch.Tensor],
        dst: Mapping[str, torch.Tensor] | None,
        tag: str,
        on_round: Callable[[int], None] | None = None,
        version: int = 0,
    ) -> RunStats: ...

    def authenticate(self, peers: Sequence[int], token: Callable[[int, int], bytes]) -> float: ...

    def close(self, abort: bool = False) -> None: ...


METHODS = ("connect", "authenticate", "run", "close")


def check_data_plane(plane: Any) -> None:
    """``TypeError`` naming the missing methods unless ``plane`` has every method of :class:`DataPlane`
    (a data plane without ``authenticate`` would otherwise turn the data-sender check off silently)."""
    missing = [m for m in METHODS if not callable(getattr(plane, m, None))]
    if missing:
        raise TypeError(f"BridgeOptions(data_plane=...): {type(plane).__name__} lacks {', '.join(missing)} "
                        "(a data plane implements connect, authenticate, run and close: weightbridge.sync.dataplane)")


class TransportDataPlane:
    """The bridge group and executor of :mod:`weightbridge.transport`."""

    def __init__(
        self,
        *,
        transport: str = "auto",
        device: torch.device | str = "cpu",
        chunk_bytes: int | None = None,
        checksums: bool = False,
        signer: Any = None,
        delta: str = "off",
    ) -> None:
        """``signer``: the job secret's :class:`~weightbridge.sync.auth.Signer`; seals the group's rendezvous.
        ``delta``: ``sync.delta`` (the executor of each epoch keeps what it sent; a new epoch starts full)."""
        from weightbridge.transport.group import backend_for

        self.device = torch.device(device)
        self.backend = backend_for(transport, self.device)
        self.chunk_bytes = chunk_bytes
        self.checksums = checksums
        self.signer = signer
        self.delta = delta
        self.group: Any = None
        self._executor: tuple[tuple, Any] | None = None  # (key, Executor) of the last plan run

    def identity(self) -> Any:
        """The backend this rank resolved, its host and device (:func:`weightbridge.transport.identity.identity_of`)."""
        from weightbridge.transport.identity import identity_of

        return identity_of(self.backend, self.device)

    def connect(
        self, store: Any, *, prefix: str, bridge_rank: int, world_size: int, num_trainers: int, timeout_s: float,
        roster: Roster | None = None, watch: Callable[[], None] | None = None,
    ) -> None:
        from weightbridge.transport.group import create_bridge_group

        self.close()
        self.group = create_bridge_group(
            store,
            rank=bridge_rank,
            world_size=world_size,
            num_trainers=num_trainers,
            backend=self.backend,  # type: ignore[arg-type]
            timeout_s=timeout_s,
            prefix=prefix,
            device=self.device if self.backend == "nccl" else None,
            roster=roster,
            signer=self.signer,
            watch=watch,
        )

    def authenticate(self, peers: Sequence[int], token: Callable[[int, int], bytes]) -> float:
        """Every member, once per epoch after :meth:`connect`: the data-sender check with ``peers`` (bridge
        ranks); raises ``UnauthenticatedPeer`` naming the spec ranks. Returns the seconds it took."""
        from weightbridge.transport.peerauth import authenticate_peers

        return authenticate_peers(self.group, peers, token)

    def run(
        self,
        plan: TransferPlan | RankPlan,
        *,
        side: str,
        rank: int,
        tensors: Mapping[str, torch.Tensor],
        dst: Mapping[str, torch.Tensor] | None,
        tag: str,
        on_round: Callable[[int], None] | None = None,
        version: int = 0,
        stream: Callable[[str, torch.Tensor], None] | None = None,
    ) -> RunStats:
        from weightbridge.transport.executor import Executor

        kwargs: dict[str, Any] = {"side": side, "rank": rank, "device": self.device, "checksums": self.checksums,
                                  "delta": self.delta}
        if self.chunk_bytes is not None:
            kwargs["chunk_bytes"] = self.chunk_bytes
        hook = None if on_round is None else (lambda index, _stats: on_round(index))
        # One executor per (plan, group): its wire slabs are reused across updates instead of reallocated,
        # and with sync.delta it keeps what was sent and held (a new group, i.e. a new epoch, starts full).
        key = (plan.plan_hash, side, rank, id(self.group))
        if self._executor is None or self._executor[0] != key:
            self._executor = (key, Executor(plan, self.group, **kwargs))
        stats = self._executor[1].run(tensors, dst=dst, on_round=hook, version=version, stream=stream)
        return RunStats(int(stats.bytes_sent), int(stats.bytes_received), float(stats.seconds),
                        int(stats.wire_bytes_sent), int(stats.wire_bytes_received), int(stats.delta_buckets),
                        int(stats.peak_buffer_bytes), int(stats.stream_peak_bytes) if stream is not None else -1)

    def held_bytes(self) -> int:
        """Wire-slab bytes this data plane keeps between runs (a streaming rank's: none)."""
        return 0 if self._executor is None else int(self._executor[1].buffer_bytes())

    def release_buffers(self) -> None:
        """Free the kept wire slabs (the next run allocates them again): e.g. while the engine sleeps."""
        if self._executor is not None:
            self._executor[1].release_buffers()

    def close(self, abort: bool = False) -> None:
        self._executor = None
        group, self.group = self.group, None
        if group is not None:
            group.close(abort=abort)
