"""Streaming receive: a rollout rank's local tensors exist only while their bytes arrive.

A streaming run (:meth:`Executor.run(..., stream=write) <weightbridge.transport.executor.Executor.run>`)
has no full-shard destination. :class:`StreamTarget` is the destination mapping the round stages
read and write instead: a local tensor is allocated on the rank's device when a round first
touches it (zeros when the layout leaves some of its elements uncovered, e.g. vocabulary padding),
receives its items (zero-copy where its boxes allow, as any destination; a tensor no item writes is
handed over as zeros after the last round), and once nothing later
in the plan writes or reads it (:func:`weightbridge.plan.streaming.stream_schedule`: its last
receive, local copy and exchange send) it is handed to ``write(name, tensor)`` -- the engine's
reload -- and dropped. So a rank holds the tensors of the round in flight plus those a round
boundary cuts, never the shard (:func:`~weightbridge.plan.streaming.stream_peak_bytes` says how much).

Frames: names and shapes are the rank's local tensors (its layout IR); round positions are indices
into :attr:`Executor.my_rounds` (the rounds this rank takes part in), -1 meaning "before the first".
Called on the executor's calling thread only (streaming runs unpack inline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from weightbridge.plan.streaming import StreamSchedule
from weightbridge.tensors import apply_local_copies

Write = Callable[[str, torch.Tensor], None]


class StreamTarget(Mapping[str, torch.Tensor]):
    """The destination of one streaming run (module docstring). ``shapes``: every local tensor of the
    rank as a meta (or any) tensor giving its shape and dtype; ``covered``: the names whose every
    element some item or copy writes (the others start as zeros)."""

    def __init__(self, shapes: Mapping[str, torch.Tensor], covered: set[str], device: torch.device,
                 plan: StreamSchedule, write: Write) -> None:
        self.shapes = shapes
        self.covered = covered
        self.device = device
        self.plan = plan
        self.write = write
        self.live: dict[str, torch.Tensor] = {}
        self.handed: set[str] = set()
        self.bytes = 0  # of the tensors alive now
        self.peak_bytes = 0
        self.written = 0  # tensors handed to write()

    # -- the Mapping the round stages use ------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.live.get(name)
        if t is not None:
            return t
        if name in self.handed:
            raise RuntimeError(f"local tensor {name!r} was already handed to the engine (the stream schedule "
                               "missed a later use of it)")
        meta = self.shapes[name]  # KeyError: not a tensor of this rank
        make = torch.empty if name in self.covered else torch.zeros
        t = self.live[name] = make(tuple(meta.shape), dtype=meta.dtype, device=self.device)
        self.bytes += t.numel() * t.element_size()
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return t

    def get(self, name: str, default: torch.Tensor | None = None) -> torch.Tensor | None:  # type: ignore[override]
        return self[name] if name in self.shapes else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __contains__(self, name: object) -> bool:
        return name in self.shapes

    # -- the stream -----------------------------------------------------------------------------
    def after_round(self, pos: int) -> None:
        """Round position ``pos`` was unpacked: run the local copies due, hand over what is complete."""
        copies = self.plan.copies.get(pos)
        if copies:
            apply_local_copies(copies, self)
        for name in self.plan.done.get(pos, ()):
            if name in self.live:
                self._hand(name)

    def finish(self) -> None:
        """After the last round: anything still alive (a tensor the schedule ends later than the rounds),
        then, as zeros one at a time, the tensors no item or copy writes (all padding on this rank, e.g.
        a row-parallel bias only rank 0 holds): the engine's reload needs every local tensor, as a
        receive buffer would have written them."""
        for name in self.plan.order:
            if name in self.live:
                self._hand(name)
        for name in self.shapes:
            if name not in self.handed and name not in self.plan.first:
                self[name]  # noqa: B018 - allocates it: zeros (uncovered)
                self._hand(name)

    def _hand(self, name: str) -> None:
        t = self.live.pop(name)
        self.handed.add(name)
        self.write(name, t)
        self.written += 1
        self.bytes -= t.numel() * t.element_size()

    def drop(self) -> None:
        """A failed run: forget what is alive (never handed over)."""
        self.live.clear()
        self.bytes = 0
