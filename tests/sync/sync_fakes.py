"""A data plane that moves bucket bytes through the control store: bridge tests in threads, no Gloo."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from weightbridge.sync.dataplane import RunStats
from weightbridge.errors import DeadlineExceeded
from weightbridge.tensors import apply_local_copies, pack_items, unpack_items


class StoreDataPlane:
    def __init__(self, name: str = "") -> None:
        self.name = name
        self.store = None
        self.prefix = ""
        self.timeout_s = 5.0
        self.connects = 0

    def connect(self, store, *, prefix, bridge_rank, world_size, num_trainers, timeout_s, roster=None,
                watch=None) -> None:
        self.store, self.prefix, self.timeout_s = store, prefix, timeout_s
        self.connects += 1
        store.set(f"{prefix}/conn/{bridge_rank}", b"1")
        self._wait([f"{prefix}/conn/{r}" for r in range(world_size)], "every member to connect")

    def _wait(self, keys, what):
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                raise DeadlineExceeded(self.name, what, self.timeout_s)
            time.sleep(0.001)

    def run(self, plan, *, side, rank, tensors, dst, tag, on_round: Callable[[int], None] | None = None,
            version: int = 0) -> RunStats:
        t0 = time.perf_counter()
        sent = received = 0
        for rnd in plan.rounds:
            for b in rnd.buckets:
                if b.src_side == side and b.sender == rank:
                    buf = torch.empty(b.nbytes, dtype=torch.uint8)
                    pack_items(b.items, tensors, buf)
                    self.store.set(self._key(tag, rnd.index, b), buf.numpy().tobytes())
                    sent += b.nbytes
            if side == "rollout":
                for b in rnd.buckets:
                    if b.receiver == rank:
                        key = self._key(tag, rnd.index, b)
                        self._wait([key], f"bucket {key}")
                        buf = torch.frombuffer(bytearray(self.store.get(key)), dtype=torch.uint8)
                        unpack_items(b.items, buf, dst)
                        received += b.nbytes
            if on_round is not None:
                on_round(rnd.index)
        if side == "rollout":
            apply_local_copies(plan.local_copies, dst, rank=rank)
        return RunStats(sent, received, time.perf_counter() - t0)

    def _key(self, tag, rnd, b) -> str:
        return f"{self.prefix}/data/{tag}/{rnd}/{b.src_side}{b.sender}->{b.receiver}"

    def authenticate(self, peers, token) -> float:
        return 0.0  # bytes move through the test's own in-process store: nobody outside can send them

    def close(self, abort: bool = False) -> None:
        pass
