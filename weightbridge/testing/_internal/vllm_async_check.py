"""End-to-end check of weightbridge under vLLM's ``AsyncLLM``, with requests in flight during updates.

Processes: this one (the driver: ``__main__``-guarded, since vLLM spawns; hosts the control store,
owns the ``AsyncLLM`` and drives :class:`~weightbridge.integrations.vllm.async_driver.AsyncVLLMWeightSync`),
vLLM's engine core and TP workers, and 2 FSDP2 trainer ranks
(:func:`weightbridge.testing._internal.vllm_selfcheck.trainer_main`, paced by the driver through ``go/{v}``).

Phases ``sync`` then ``async`` (a new bridge each). Each version ``v`` is applied with one of vLLM's
pause choices (:data:`PLAN`). Around each update:

* a *probe*: one long request, started so that it is surely in flight when the update pauses
  the engine (it has produced tokens, it is far from done);
* *traffic*: one more request in flight at all times while the update happens;
* then every worker's bitwise check against vLLM's own load of the trainer's checkpoint, greedy
  generation next to the trainer's HF model, and ``get_weight_version()``.

Every finished request is recorded with its tokens, logprobs and vLLM's ``weight_versions`` spans
(:mod:`weightbridge.testing._internal.vllm_online`); the tests replay them with the labelled versions.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from weightbridge.testing._internal import vllm_online as online
from weightbridge.testing._internal import vllm_selfcheck as sc

# Liveness is not what these checks test: a vLLM worker pinned to a busy core can stall for
# seconds on a loaded 2-core machine, so peers are declared dead only after 10 x this.
HEARTBEAT_S = 2.0

# version -> (pause mode, clear_cache): each of vLLM's choices at least once, in both modes
PLAN: dict[int, tuple[str, bool]] = {1: ("keep", True), 2: ("wait", True), 3: ("abort", True),
                                     4: ("keep", False), 5: ("keep", True)}
PROBE_TOKENS = 64
PROBE_STARTED = 4  # tokens the probe has before the update starts


def make_engine(model_dir: str | Path, tp: int) -> Any:
    from vllm.config import WeightTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from weightbridge.integrations.vllm import BACKEND

    from weightbridge.integrations._engine.hooks import record_writes

    record_writes()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if tp == 2:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    args = AsyncEngineArgs(
        model=str(model_dir), tensor_parallel_size=tp, skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
        max_model_len=online.MAX_MODEL_LEN, max_num_seqs=4, seed=0,
        weight_transfer_config=WeightTransferConfig(backend=BACKEND),
        worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension",
    )
    return AsyncLLM.from_engine_args(args)


class Requests:
    """Sends requests to the engine and records each finished one as a sample."""

    def __init__(self, engine: Any, vocab: int) -> None:
        self.engine, self.vocab = engine, vocab
        self.samples: list[dict[str, Any]] = []
        self._n = 0

    async def one(self, ids: list[int], max_tokens: int, tag: str, started: asyncio.Event | None = None,
                  logprobs: bool = True) -> dict[str, Any]:
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                            logprobs=1 if logprobs else None)
        self._n += 1
        final = None
        async for out in self.engine.generate({"prompt_token_ids": ids}, sp, request_id=f"{tag}-{self._n}"):
            final = out
            if started is not None and len(out.outputs[0].token_ids) >= PROBE_STARTED:
                started.set()
        sample = online.sample_from_output(final.outputs[0], ids, tag)
        self.samples.append(sample)
        return sample

    async def traffic(self, stop: asyncio.Event, seed: int) -> None:
        """One request in flight at a time until ``stop``."""
        rng = random.Random(seed)
        n = 0
        while not stop.is_set():
            ids = online.prompt(rng, self.vocab)
            await self.one(ids, min(rng.randrange(40, 80), online.MAX_MODEL_LEN - len(ids)), f"traffic-s{seed}-{n}")
            n += 1

    async def greedy(self) -> list[list[int]]:
        outs = await asyncio.gather(*(self.one(p, sc.NEW_TOKENS, "greedy", logprobs=False) for p in sc.PROMPTS))
        return [o["tokens"] for o in outs]


def run(kind: str, tp: int, workdir: str | Path, *, steps: tuple[int, int] = (2, 3), timeout_s: float = 120.0,
        log: Any = print) -> dict[str, Any]:
    """The whole check (call under ``if __name__ == "__main__":``); returns a JSON-able report."""
    return asyncio.run(_run(kind, tp, Path(workdir), steps, timeout_s, log))


async def _run(kind: str, tp: int, workdir: Path, steps: tuple[int, int], timeout_s: float, log: Any) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync
    from weightbridge.localrun import launch
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.transport.store import open_store

    ensure_env_secret()  # before the trainer processes and the engine's workers start
    model_dir = sc.write_model(workdir / "v0", kind)
    v0 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    (model_dir / "greedy.json").write_text(json.dumps(sc.greedy(v0)))
    vocab = v0.config.vocab_size
    del v0
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    phases = [{"mode": m, "prefix": f"wb-{m}", "steps": n, "spec": sc.spec_text(kind, model_dir, tp, m, timeout_s, heartbeat_s=HEARTBEAT_S)}
              for m, n in zip(("sync", "async"), steps) if n]
    total = sum(steps)
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(model_dir), "workdir": str(workdir),
           "phases": phases, "timeout_s": timeout_s, "kind": kind, "go_key": "go", "greedy": True,
           "go_wait_s": 900.0}
    results: list[Any] = []
    trainers = threading.Thread(target=lambda: results.extend(launch(
        sc.trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=timeout_s * (total + 2), threads=1)),
        daemon=True)
    trainers.start()  # they set up while the engine starts
    t0 = time.perf_counter()
    engine = make_engine(model_dir, tp)
    report: dict[str, Any] = {"kind": kind, "tp": tp, "engine_start_s": time.perf_counter() - t0, "plan": PLAN,
                              "updates": [], "probes": {}, "samples": [], "trainer": None}
    log(f"[async] {kind} TP{tp}: AsyncLLM up in {report['engine_start_s']:.1f}s")
    req = Requests(engine, vocab)
    try:
        report["initial"] = await req.greedy()
        v = 0
        for i, phase in enumerate(phases):
            master.set(f"go/setup/{phase['prefix']}", b"1")
            sync = await AsyncVLLMWeightSync.create(engine, phase["spec"], host="127.0.0.1", port=master.port,
                                                    options=BridgeOptions(prefix=phase["prefix"]),
                                                    initial_version=0 if i == 0 else None)
            for _ in range(phase["steps"]):
                v += 1
                report["updates"].append(await _one_update(sync, req, master, phase["mode"], v, workdir, timeout_s,
                                                           report["probes"]))
                u = report["updates"][-1]
                log(f"[async] v{v} ({phase['mode']}, pause {u['pause']}, clear_cache {u['clear_cache']}): update "
                    f"{u['update_s'] * 1e3:.0f} ms; {u['problems'] or 'bitwise equal'}; generation "
                    f"{'equal' if u['generation_equal'] else 'DIFFER'}; probe {u['probe']}")
        report["final_label"] = await engine.get_weight_version()
    finally:
        report["samples"] = req.samples
        trainers.join(timeout=timeout_s * (total + 2))
        report["trainer"] = [{"ok": r.ok, "error": repr(r.error) if r.error else None, "timed_out": r.timed_out,
                              "value": r.value} for r in results]
        for r in results:
            if not r.ok:
                log(f"[async] trainer rank {r.index} failed: {r.error!r}\n{(r.traceback or '')[-2000:]}")
        engine.shutdown()
    return report


async def _one_update(sync: Any, req: Requests, master: Any, mode: str, v: int, workdir: Path, timeout_s: float,
                      probes: dict[str, Any]) -> dict[str, Any]:
    pause, clear = PLAN[v]
    rng = random.Random(1000 + v)
    stop = asyncio.Event()
    traffic = asyncio.create_task(req.traffic(stop, seed=v))
    master.set(f"go/{v}", b"1")
    if mode == "async":  # the trainer's push returns once every worker staged v, the engine serving meanwhile
        deadline = time.monotonic() + timeout_s
        while (await sync.staged() or 0) < v:
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {v} not staged within {timeout_s:.0f}s")
            await asyncio.sleep(0.02)
    started = asyncio.Event()
    probe = asyncio.create_task(req.one(online.prompt(rng, req.vocab), PROBE_TOKENS, f"probe-v{v}-{pause}", started))
    await asyncio.wait_for(started.wait(), timeout_s)
    before = await sync.engine.get_weight_version()
    t = time.perf_counter()
    live = await sync.update(v, pause=pause, clear_cache=clear)  # sync mode: receives while the trainer sends
    update_s = time.perf_counter() - t
    stop.set()
    sample = await asyncio.wait_for(probe, timeout_s)
    await asyncio.wait_for(traffic, timeout_s)
    probes[str(v)] = {"pause": pause, "clear_cache": clear, "label_before": before, "sample": sample}
    vdir = sc.version_dir(workdir, v)
    problems = await sync.check(vdir)
    got = await req.greedy()
    want = json.loads((vdir / "greedy.json").read_text())
    return {"mode": mode, "version": v, "live": live, "pause": pause, "clear_cache": clear, "update_s": update_s,
            "problems": problems, "generated": got, "trainer_greedy": want, "generation_equal": got == want,
            "label": await sync.engine.get_weight_version(),
            "probe": f"{sample['finish']} {sample['spans']}"}
