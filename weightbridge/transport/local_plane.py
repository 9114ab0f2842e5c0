"""The colocated data plane: pairs that share a host's memory through it, every other pair over the wire.

:class:`LocalDataPlane` implements :class:`~weightbridge.sync.dataplane.DataPlane` for
``sync.transport: shm`` (CPU: ``/dev/shm``), ``ipc`` (CUDA IPC) and ``auto`` (shm on CPU; on CUDA, IPC
when a GPU holds two members). Per epoch, from the members' identities
(:meth:`LocalDataPlane.place`, the authenticated hellos; :mod:`weightbridge.sync.locality`) it knows
which pairs are local. Then:

* every pair local (one host): no wire group is created; every bucket, receiver de-replication's
  forwards included, moves through :class:`~weightbridge.transport.local_channel.LocalChannel`;
* some pairs remote: the wire group (Gloo for ``shm``, NCCL for ``ipc``) is created as for
  ``transport: gloo`` / ``nccl``. A push runs the remote buckets on the wire's executor (a thread)
  while the local ones go through the channel, and applies the local copies once both ended;
  ``on_round(r)`` fires once both parts finished round ``r``. A plan with receiver de-replication
  moves everything over the wire (a forward may read what another pair delivered: one data plane
  keeps that order).

Local pairs prove the job secret through sealed records on the control store (the channel's
``authenticate``), remote pairs over the wire (:mod:`weightbridge.transport.peerauth`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from weightbridge.plan.streaming import covered_tensors, rank_rounds, stream_schedule
from weightbridge.plan.types import ROLLOUT, Round
from weightbridge.sync.dataplane import RunStats, TransportDataPlane
from weightbridge.sync.locality import all_local, local_peers
from weightbridge.sync.roster import Roster
from weightbridge.tensors import apply_local_copies
from weightbridge.transport.local_channel import LocalChannel
from weightbridge.transport.local_io import RecordIO
from weightbridge.transport.local_slab import slabs_for
from weightbridge.transport.segment import SHM_DIR, job_tag
from weightbridge.transport.stream import StreamTarget

__all__ = ["LocalDataPlane"]


class LocalDataPlane:
    """The colocated data plane (module docstring). ``kind``: ``shm`` or ``ipc``; ``policy``: which pairs
    are local (:mod:`weightbridge.sync.locality`)."""

    def __init__(self, *, kind: str, policy: str = "host", device: torch.device | str = "cpu",
                 checksums: bool = False, signer: Any = None, delta: str = "off", chunk_bytes: int | None = None,
                 directory: str = SHM_DIR) -> None:
        if kind not in ("shm", "ipc"):
            raise ValueError(f"kind must be shm or ipc, got {kind!r}")
        self.kind, self.policy = kind, policy
        self.device = torch.device(device)
        if kind == "ipc" and self.device.type != "cuda":
            raise ValueError(f"transport ipc needs CUDA tensors, got device {self.device}")
        if kind == "shm" and self.device.type != "cpu":
            raise ValueError(f"transport shm needs CPU tensors, got device {self.device} (use ipc or auto)")
        self.checksums, self.signer, self.directory = checksums, signer, directory
        self.wire = TransportDataPlane(transport="gloo" if kind == "shm" else "nccl", device=self.device,
                                       chunk_bytes=chunk_bytes, checksums=checksums, signer=signer, delta=delta)
        self.identities: dict[int, Any] = {}
        self.channel: LocalChannel | None = None
        self.local: frozenset[int] = frozenset()
        self.all_local = False
        self.me = -1

    def identity(self) -> Any:
        from weightbridge.transport.identity import identity_of

        return identity_of(self.kind, self.device)

    def place(self, identities: Mapping[int, Any]) -> None:
        """Before :meth:`connect`: every member's identity by bridge rank (from the epoch's hellos)."""
        self.identities = dict(identities)

    def connect(self, store: Any, *, prefix: str, bridge_rank: int, world_size: int, num_trainers: int,
                timeout_s: float, roster: Roster | None = None, watch: Callable[[], None] | None = None) -> None:
        self.close()
        roster = roster or Roster.identity(num_trainers, world_size - num_trainers)
        ids = {b: self.identities.get(b) for b in range(world_size)}
        self.me = bridge_rank
        self.local = local_peers(ids, bridge_rank, self.policy)
        self.all_local = all_local(ids, self.policy)
        if not self.all_local:
            self.wire.connect(store, prefix=prefix, bridge_rank=bridge_rank, world_size=world_size,
                              num_trainers=num_trainers, timeout_s=timeout_s, roster=roster, watch=watch)
        io = RecordIO(store, self.signer, me=bridge_rank, roster=roster, timeout_s=timeout_s, watch=watch)
        slabs = slabs_for(self.kind, job_tag(self.signer), self.device, self.directory)
        self.channel = LocalChannel(io, prefix=prefix, local=self.local, slabs=slabs, checksums=self.checksums)

    def authenticate(self, peers: Sequence[int], token: Callable[[int, int], bytes]) -> float:
        if self.channel is None:
            raise RuntimeError("authenticate() before connect()")
        local = [p for p in peers if p in self.local]
        remote = [p for p in peers if p not in self.local]
        seconds = self.channel.authenticate(local, token) if local else 0.0
        if remote:
            seconds += self.wire.authenticate(remote, token)
        return seconds

    def run(self, plan: Any, *, side: str, rank: int, tensors: Mapping[str, torch.Tensor],
            dst: Mapping[str, torch.Tensor] | None, tag: str, on_round: Callable[[int], None] | None = None,
            version: int = 0, stream: Callable[[str, torch.Tensor], None] | None = None) -> RunStats:
        """One push (the :class:`~weightbridge.sync.dataplane.DataPlane` contract). ``stream`` (a streaming
        rollout rank: ``tensors`` give shapes only): each local tensor goes to ``stream(name, tensor)`` once
        complete (:mod:`weightbridge.transport.stream`); every pair local: as its rounds are unpacked, one
        round's tensors alive at a time; some pairs remote: after both parts ended (the wire's thread and
        the channel write into one destination: every tensor of the rank is allocated for the run)."""
        if self.channel is None:
            raise RuntimeError("run() before connect()")
        if not self.all_local and plan.receiver_dedup:  # everything on the wire (module docstring): it streams
            extra = {} if stream is None else {"stream": stream}
            return self.wire.run(plan, side=side, rank=rank, tensors=tensors, dst=dst, tag=tag, on_round=on_round,
                                 version=version, **extra)
        feed = _stream_target(plan, rank, tensors, self.device, stream) if stream is not None else None
        if feed is not None:
            if side != ROLLOUT:
                raise ValueError("a streaming receive is for rollout ranks")
            dst = feed
        try:
            stats = self._run(plan, side, rank, tensors, dst, tag, on_round, version, feed)
        except BaseException:
            if feed is not None:
                feed.drop()
            raise
        if feed is None:
            return stats
        feed.finish()
        return stats._replace(stream_bytes=feed.peak_bytes)

    def _run(self, plan: Any, side: str, rank: int, tensors: Mapping[str, torch.Tensor],
             dst: Mapping[str, torch.Tensor] | None, tag: str, on_round: Callable[[int], None] | None, version: int,
             feed: Any) -> RunStats:
        import time

        t0 = time.perf_counter()
        remote = None if self.all_local else _remote_plan(plan, side, rank, self.local, self.wire_roster())
        parts = [self._local_rounds(plan, side, rank)] + ([_rounds_of(remote, side, rank)] if remote else [])
        joined = _RoundJoin(on_round, parts) if on_round is not None else None
        local_hook = None if joined is None else joined.hook(0)
        if feed is not None and remote is None:  # streaming as the channel's rounds end, on this thread
            feed.after_round(-1)
            local_hook = _streaming_hook(feed, local_hook)
        elif feed is not None:
            feed.allocate()
        box: dict[str, Any] = {}
        thread = None
        if remote is not None:
            def wire() -> None:
                try:
                    box["stats"] = self.wire.run(remote, side=side, rank=rank, tensors=tensors, dst=dst, tag=tag,
                                                 on_round=None if joined is None else joined.hook(1),
                                                 version=version)
                except BaseException as exc:  # noqa: BLE001 - raised on the calling thread
                    box["error"] = exc

            thread = threading.Thread(target=wire, name=f"weightbridge-wire-{self.me}", daemon=True)
            thread.start()
        try:
            local = self.channel.run(plan, side=side, rank=rank, tensors=tensors, dst=dst, version=version,
                                     on_round=local_hook)
        except BaseException:
            if thread is not None:
                self.wire.close(abort=True)
                thread.join(timeout=1.0)
            raise
        if thread is not None:
            thread.join()
            if "error" in box:
                raise box["error"]
        wire = box.get("stats")
        if side == ROLLOUT and plan.local_copies and (feed is None or remote is not None):  # a stream ran its own
            apply_local_copies(plan.local_copies, dst if dst is not None else tensors, rank=rank)
        return RunStats(local.bytes_sent + (wire.bytes_sent if wire else 0),
                        local.bytes_received + (wire.bytes_received if wire else 0),
                        time.perf_counter() - t0,
                        local.slab_sent + (wire.wire_sent if wire else 0),
                        local.slab_received + (wire.wire_received if wire else 0),
                        wire.delta_buckets if wire else 0,
                        self._own_slab() + (max(wire.wire_buffer_bytes, 0) if wire else 0))

    def _own_slab(self) -> int:
        """Bytes of this rank's exported slab (a sender's; a reader maps the senders' and allocates none)."""
        slab = self.channel.slab if self.channel is not None else None
        return 0 if slab is None else slab.numel() * slab.element_size()

    def held_bytes(self) -> int:
        """Slab bytes this rank keeps between runs: its exported slab (for the epoch) and the wire's."""
        return self._own_slab() + (0 if self.all_local else self.wire.held_bytes())

    def release_buffers(self) -> None:
        """Free the wire's kept slabs (the exported slab lives for the epoch: readers map it)."""
        self.wire.release_buffers()

    def wire_roster(self) -> Any:
        return self.channel.io.roster if self.channel is not None else None

    def _local_rounds(self, plan: Any, side: str, rank: int) -> set[int]:
        bridge = self.channel.io.roster.bridge_of_plan  # type: ignore[union-attr]
        out = set()
        for rnd in plan.rounds:
            for b in rnd.buckets:
                if (b.src_side == side and b.sender == rank and bridge(ROLLOUT, b.receiver) in self.local) or (
                        side == ROLLOUT and b.receiver == rank and bridge(b.src_side, b.sender) in self.local):
                    out.add(rnd.index)
        return out

    def close(self, abort: bool = False) -> None:
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close(abort=abort)
        self.wire.close(abort=abort)


class _Feed(StreamTarget):
    """A streaming rank's destination (:class:`~weightbridge.transport.stream.StreamTarget`) that also
    knows each round's position among the rank's rounds, and can allocate every tensor up front (a run
    whose parts write from two threads)."""

    def __init__(self, *args: Any, positions: dict[int, int]) -> None:
        super().__init__(*args)
        self.positions = positions

    def allocate(self) -> None:
        for name in self.plan.order:
            self[name]  # noqa: B018 - allocates it


def _stream_target(plan: Any, rank: int, shapes: Mapping[str, torch.Tensor], device: torch.device,
                   write: Callable[[str, torch.Tensor], None]) -> _Feed:
    mine = rank_rounds(plan, rank)
    copies = [c for c in plan.local_copies if c.rank == rank]
    return _Feed(shapes, covered_tensors(mine, copies, {n: t.numel() for n, t in shapes.items()}), device,
                 stream_schedule(mine, copies), write, positions={ridx: pos for pos, (ridx, _, _) in enumerate(mine)})


def _streaming_hook(feed: _Feed, then: Callable[[int], None] | None) -> Callable[[int], None]:
    """The channel's ``on_round``: hand over what round ``r`` completed, then call ``then(r)``."""
    def hook(ridx: int) -> None:
        pos = feed.positions.get(ridx)
        if pos is not None:
            feed.after_round(pos)
        if then is not None:
            then(ridx)

    return hook


def _remote_plan(plan: Any, side: str, rank: int, local: frozenset[int], roster: Roster) -> Any:
    """``plan`` without the buckets of local pairs and without local copies (applied after both parts),
    or None when nothing is left; its hash marks it as the wire's part."""
    bridge = roster.bridge_of_plan

    def remote(b: Any) -> bool:
        peer = bridge(ROLLOUT, b.receiver) if (b.src_side == side and b.sender == rank) else bridge(b.src_side, b.sender)
        return peer not in local

    rounds = tuple(Round(r.index, tuple(b for b in r.buckets if remote(b))) for r in plan.rounds)
    if not any(r.buckets for r in rounds):
        return None
    kw: dict[str, Any] = {"rounds": rounds, "local_copies": ()}
    if "plan_hash" in {f.name for f in dataclasses.fields(plan) if f.init}:
        kw["plan_hash"] = plan.plan_hash + "/wire"
    return dataclasses.replace(plan, **kw)


def _rounds_of(plan: Any, side: str, rank: int) -> set[int]:
    return {r.index for r in plan.rounds for b in r.buckets
            if (b.src_side == side and b.sender == rank) or (side == ROLLOUT and b.receiver == rank)}


class _RoundJoin:
    """``on_round(r)`` once every part with round ``r`` finished it, rounds in order (parts on two threads)."""

    def __init__(self, on_round: Callable[[int], None], parts: list[set[int]]) -> None:
        self.on_round = on_round
        self.need = {r: sum(r in p for p in parts) for p in parts for r in p}
        self.order = sorted(self.need)
        self.done: dict[int, int] = {}
        self.next = 0
        self.lock = threading.Lock()

    def hook(self, _part: int) -> Callable[[int], None]:
        def done(r: int) -> None:
            fire = []
            with self.lock:
                self.done[r] = self.done.get(r, 0) + 1
                while self.next < len(self.order) and self.done.get(self.order[self.next], 0) >= \
                        self.need[self.order[self.next]]:
                    fire.append(self.order[self.next])
                    self.next += 1
            for x in fire:
                self.on_round(x)
        return done
