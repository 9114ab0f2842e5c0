"""Shared helpers: a tiny spec, canonical weights per version, bridges in threads over a HashStore."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
from weightbridge.tensors import layout_mismatches
from weightbridge.tensors import materialize, torch_dtype

from sync_fakes import StoreDataPlane


def spec_text(mode: str = "sync", max_staleness: int = 1, timeout_s: float = 10.0, round_bytes: str = "8KiB",
              trainer: str = "{preset: fsdp2, mesh: {dp: 2}}",
              rollout: str = "{preset: vllm, instances: 2, mesh: {tp: 2}}", heartbeat_s: float = 0.05,
              **sync) -> str:
    """A tiny spec; ``sync`` adds fields of its ``sync:`` section (checksums, min_instances, ...)."""
    extra = "".join(f", {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in sync.items())
    return (
        "version: 1\n"
        "model: {bundled: tiny-qwen2}\n"
        f"trainer: {trainer}\n"
        f"rollout: {rollout}\n"
        f"sync: {{mode: {mode}, max_staleness: {max_staleness}, round_bytes: {round_bytes}, timeout_s: {timeout_s}, "
        f"heartbeat_s: {heartbeat_s}{extra}}}\n"
    )


def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    """Deterministic canonical weights of ``version`` (distinct per version)."""
    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def set_weights(layout, tensors, canon) -> None:
    fresh = materialize(layout, canon)
    with torch.no_grad():
        for name, t in tensors.items():
            t.copy_(fresh[name])


class Threads:
    """Run bridge endpoints in threads on one HashStore; collect results and exceptions."""

    def __init__(self) -> None:
        self.store = dist.HashStore()
        self.pool = ThreadPoolExecutor(max_workers=16)
        self.futures = {}

    def start(self, name, fn, *args, **kw):
        self.futures[name] = self.pool.submit(fn, *args, **kw)
        return self.futures[name]

    def result(self, name, timeout=30):
        return self.futures[name].result(timeout=timeout)

    def exception(self, name, timeout=30):
        return self.futures[name].exception(timeout=timeout)

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


def trainer_bridge(resolved, rank, store, version0=0, **kw):
    tensors = materialize(resolved.trainer.ranks[rank], canonical(resolved, version0))
    kw.setdefault("options", BridgeOptions(data_plane=StoreDataPlane(f"trainer {rank}")))
    return TrainerBridge.from_spec(resolved, rank=rank, tensors=tensors, store=store, **kw), tensors


def rollout_bridge(resolved, rank, store, **kw):
    tensors = materialize(resolved.rollout.ranks[rank], canonical(resolved, -1), fill=7.0)
    kw.setdefault("options", BridgeOptions(data_plane=StoreDataPlane(f"rollout {rank}")))
    return RolloutBridge.from_spec(resolved, rank=rank, tensors=tensors, store=store, **kw), tensors


def check(resolved, bridge, tensors, version) -> list[str]:
    return layout_mismatches(resolved.rollout.ranks[bridge.rank], tensors, canonical(resolved, version))


# -- one trainer rank, one rollout rank, an engine loop in a thread ---------------------------------
ONE_TRAINER = "{preset: fsdp2, mesh: {dp: 1}}"
ONE_ROLLOUT = "{preset: vllm, instances: 1, mesh: {tp: 1}}"


def one_to_one(mode: str, timeout_s: float = 1.0, **kw):
    return load_spec(spec_text(mode=mode, timeout_s=timeout_s, trainer=ONE_TRAINER, rollout=ONE_ROLLOUT, **kw))


def wait_until(cond, timeout_s=15.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


class Engine:
    """A rollout rank's engine loop in a thread: poll, apply (optionally slowly), record everything."""

    def __init__(self, r, store, *, staging: bool, slow_apply: dict | None = None, **kw) -> None:
        self.r = r
        self.bridge, self.tensors = rollout_bridge(r, 0, store, staging=staging, **kw)
        self.slow_apply = slow_apply or {}  # version -> seconds to sleep before applying it
        self.applied: list[tuple[int, list]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        b = self.bridge
        while not self.stop.is_set():
            try:
                if b.poll():
                    if self.stop.wait(self.slow_apply.pop(b.staged_version, 0.0)):
                        break  # killed while "applying"
                    v = b.apply()
                    self.applied.append((v, check(self.r, b, self.tensors, v)))
            except Exception as exc:  # noqa: BLE001 - recorded for the test (a hook's own error included)
                self.errors.append(exc)
            time.sleep(0.002)

    def kill(self) -> None:
        """As if the process died: no more polls, heartbeats or receives; nothing is cleaned up."""
        self.stop.set()
        self.thread.join(10)
        b = self.bridge
        b._stop.set()
        if b._thread is not None:
            b._thread.join(10)
        b.cp.stop_heartbeat()
        b.closed = True  # never rejoins; its join record stays, as a killed process leaves it

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.bridge.close()


def push(trainer, r, tensors, v):
    set_weights(r.trainer.ranks[0], tensors, canonical(r, v))
    return trainer.push(v)
