"""The executor's own stream, ordered against its caller by events (checked on CPU with a stand-in).

No GPU here: ``testing.cuda_standin.RecordingCuda`` has the surface ``ExecStreams`` uses (per-thread
current streams as CUDA has) and logs every record, wait and synchronisation. On a GPU,
``bench/gpu_readiness.py`` runs the same path with real streams and checks the bytes.
"""

from __future__ import annotations

import pytest
import torch

from weightbridge.plan import build_plan
from weightbridge.spec.resolve import check_text
from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize
from weightbridge.testing._internal.cuda_standin import RecordingCuda
from weightbridge.testing._internal.loopback import LoopbackWorld
from weightbridge.transport import pipeline
from weightbridge.transport.streams import ExecStreams, stream_device

SPEC = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
"""


@pytest.mark.parametrize("overlap", ["inline", "thread"])
def test_every_stage_runs_on_the_executors_stream_after_the_callers_and_before_it_returns(overlap: str, monkeypatch) -> None:
    """The callers run on a non-default stream; with ``overlap="thread"`` packing happens on the worker
    thread, which packed on its own default stream before (NCCL, ordered after the issuing thread's
    stream, could then send a buffer still being packed)."""
    r, _ = check_text(SPEC)
    plan = build_plan(r.trainer, r.rollout, round_bytes=8 << 10)
    world = LoopbackWorld(plan, checksums=True, overlap=overlap)
    api = RecordingCuda()
    executors = world.trainers + world.rollouts
    packed_on: list[str] = []
    for ex in executors:
        ex.streams = ExecStreams("cpu", api=api)
    real_pack = pipeline.pack_items

    def pack_items(*args, **kwargs):  # the pipeline's packing of small items, on whichever thread packs
        packed_on.append(api.current_stream().name)
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(pipeline, "pack_items", pack_items)
    callers = {("trainer", t): api.Stream() for t in range(2)} | {("rollout", q): api.Stream() for q in range(2)}

    def on_caller_stream(side, rank, fn):
        with api.stream(callers[(side, rank)]):
            return fn()

    canon = canonical_tensors(r.canonical, seed=2)
    dsts = [empty_like_layout(r.rollout.ranks[q]) for q in range(2)]
    world.run([materialize(r.trainer.ranks[t], canon) for t in range(2)], dsts, caller=on_caller_stream)
    for q in range(2):
        assert diff_tensors(dsts[q], materialize(r.rollout.ranks[q], canon)) == []

    own = {ex.streams.stream.name for ex in executors}
    assert packed_on and set(packed_on) <= own, packed_on  # never on a thread's default stream
    log = api.log
    for ex, caller in zip(executors, callers.values()):
        mine = ex.streams.stream.name
        first = [e for e in log if e[1] == mine]
        # begin: an event on the caller's stream, the executor's stream waits for it
        [ready] = [e[2] for e in log if e[0] == "record" and e[1] == caller.name][:1]
        assert ("wait", mine, ready) == first[0]
        # end: an event on the executor's stream, the caller's stream waits for it, the host synchronises
        [done] = [e[2] for e in log if e[0] == "record" and e[1] == mine]
        assert log.index(("wait", caller.name, done)) < log.index(("sync", mine, done))
        assert ex.streams.syncs == 1 and ex.streams.caller is None


def test_streams_are_inactive_off_cuda_and_follow_the_cuda_device() -> None:
    s = ExecStreams("cpu")
    assert not s.active
    s.begin()
    with s.use():
        pass
    s.end()
    assert s.syncs == 0
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 1)
    assert stream_device(cpu, gpu) == gpu and stream_device(gpu, cpu) == gpu and stream_device(cpu, cpu) == cpu
