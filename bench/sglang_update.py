#!/usr/bin/env python
"""Benchmark: weightbridge vs SGLang's native update paths, one SGLang engine, one trainer world.

In ONE run on the same model and world (2 FSDP2 trainer ranks, Gloo, fp32; one real SGLang engine at
TP ``--tp`` with weightbridge's custom weight loader), per repetition, with the trainer ranks paced
by the driver so that phases never overlap:

(a) **weightbridge sync** (in place): every trainer rank ``push(v)``; the driver's
    ``SGLangWeightSync.update(v)`` (SGLang's begin / update_weights_from_tensor / end) waits in the
    workers for the bytes and writes them. Update = the trainer's push call; pause = the update call.
(b) **weightbridge async** (staged): the workers receive on a background thread while the engine
    serves; the driver applies once ``staged() == v``. Update = push call; pause = the update call.
(c) **native update_weights_from_distributed** (slime's path): both trainer ranks gather the full
    model (FSDP2 ``full_tensor``), trainer rank 0 broadcasts every HF tensor over a Gloo group it
    shares with SGLang's workers (``init_weights_update_group(backend="gloo")``), SGLang's workers
    ``load_weights`` them between ``begin_weight_update`` / ``end_weight_update``. Update = gather +
    broadcast on trainer rank 0; pause = begin .. end.
(d) **native update_weights_from_disk**: gather, trainer rank 0 writes the checkpoint
    (``save_pretrained``), SGLang loads it. Update = gather + save + load; pause = the load call.

After each method the driver checks SGLang's weights bitwise against the trainer's checkpoint
(``SGLangWeightSync.check``): every method must have moved the same bytes. Prints medians and
the ratios native / weightbridge.

    python bench/sglang_update.py                     # TP 2, 3 repetitions
    python bench/sglang_update.py --tp 1 --reps 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from weightbridge.integrations._engine.verify import NOT_KEPT

OVERRIDES = {"hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 4,
             "num_hidden_layers": 4, "max_window_layers": 4, "vocab_size": 8000}
TIMEOUT_S = 300.0
METHODS = ("wb_sync", "wb_async", "distributed", "disk")


def _ok(result: Any, what: str) -> None:
    """SGLang's Engine calls answer (success, message[, ...])."""
    if not result[0]:
        raise RuntimeError(f"{what} failed: {result[1]}")


def trainer_rank(job: dict[str, Any]) -> dict[str, list[float]]:
    """One FSDP2 trainer rank (launched by name); paced by the driver through store keys."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.demo.fsdp2 import FSDP2World, shard_dp
    from weightbridge.transport.store import open_store

    rank = job["rank"]
    store = open_store("127.0.0.1", job["port"], is_master=False, timeout_s=TIMEOUT_S)
    world = FSDP2World(lambda mesh: shard_dp(AutoModelForCausalLM.from_pretrained(job["dir"], dtype=torch.float32),
                                             mesh), rank=rank, world_size=2, store=store, prefix="bench/trainer/")
    plain = AutoModelForCausalLM.from_pretrained(job["dir"], dtype=torch.float32) if rank == 0 else None
    out: dict[str, list[float]] = {}
    v = 0

    def go(name: str) -> None:
        store.wait([f"bench/go/{name}"])

    def done(name: str, **values: float) -> None:
        if rank == 0:
            store.set(f"bench/done/{name}", json.dumps(values))

    def perturb() -> None:  # a new version: every element changes
        with torch.no_grad():
            for p in world.model.parameters():
                p.add_(1e-3)

    def save(path: Path, full: dict[str, Any]) -> None:
        plain.load_state_dict(full, strict=False)
        plain.save_pretrained(path)

    for mode in ("sync", "async"):
        bridge = TrainerBridge.from_spec(load_spec(job[f"spec_{mode}"]), rank=rank, tensors=world.tensors(),
                                         store=store, options=BridgeOptions(prefix=f"bench-{mode}"))
        for rep in range(job["reps"] + 1):
            v += 1
            perturb()
            full = world.full_tensors()  # for the bitwise check only (not timed)
            if rank == 0:
                save(Path(job["work"]) / f"v{v}", full)
            go(f"wb_{mode}/{v}")
            t0 = time.perf_counter()
            bridge.push(v, tensors=world.tensors())
            out.setdefault(f"wb_{mode}_update_s", []).append(time.perf_counter() - t0)
            done(f"wb_{mode}/{v}", version=v)
        bridge.close()

    pg = None
    if rank == 0:  # slime's path: trainer rank 0 is rank 0 of a group with SGLang's TP workers
        from sglang.srt.utils import init_custom_process_group

        go("group")
        pg = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{job['group_port']}",
                                       world_size=1 + job["tp"], rank=0, group_name="wb-bench")
    for rep in range(job["reps"] + 1):
        v += 1
        perturb()
        go(f"distributed/{v}")
        t0 = time.perf_counter()
        full = world.full_tensors()
        if rank == 0:
            for name in sorted(full):
                dist.broadcast(full[name].contiguous(), src=0, group=pg)
        t1 = time.perf_counter()
        if rank == 0:
            save(Path(job["work"]) / f"v{v}", full)  # for the bitwise check only (not timed)
        done(f"distributed/{v}", update_s=t1 - t0)
    for rep in range(job["reps"] + 1):
        v += 1
        perturb()
        go(f"disk/{v}")
        t0 = time.perf_counter()
        full = world.full_tensors()
        if rank == 0:
            save(Path(job["work"]) / f"v{v}", full)
        done(f"disk/{v}", update_s=time.perf_counter() - t0)
    world.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2, choices=(1, 2))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    import yaml

    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.sglang.driver import SGLangWeightSync
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.localrun import launch
    from weightbridge.integrations.sglang.cpu_engine import make_engine
    from weightbridge.testing._internal.sglang_selfcheck import _free_port
    from weightbridge.testing._internal.vllm_selfcheck import write_model
    from weightbridge.transport.store import open_store

    ensure_env_secret()
    work = Path(tempfile.mkdtemp(prefix="wb-bench-sglang-"))
    model_dir = write_model(work / "v0", "qwen2", **OVERRIDES)
    specs = {}
    for mode in ("sync", "async"):
        spec = {"version": 1, "model": {"config": str((model_dir / "config.json").resolve())},
                "trainer": {"preset": "fsdp2", "mesh": {"dp": 2}},
                "rollout": {"preset": "sglang", "mesh": {"tp": args.tp}},
                "sync": {"mode": mode, "max_staleness": 1, "round_bytes": "64MiB", "transport": "gloo",
                         "timeout_s": TIMEOUT_S, "heartbeat_s": 0.5}}
        specs[mode] = work / f"spec_{mode}.yaml"
        specs[mode].write_text(yaml.safe_dump(spec, sort_keys=False))
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=TIMEOUT_S)
    group_port = _free_port()
    job = {"port": master.port, "dir": str(model_dir), "work": str(work), "reps": args.reps, "tp": args.tp,
           "group_port": group_port, "spec_sync": str(specs["sync"]), "spec_async": str(specs["async"])}
    results: list[Any] = []
    trainers = threading.Thread(target=lambda: results.extend(
        launch(trainer_rank, [({**job, "rank": r},) for r in range(2)], timeout_s=3600, threads=1)), daemon=True)
    trainers.start()
    engine = make_engine(model_dir, args.tp)
    rows: dict[str, dict[str, list[float]]] = {m: {"update_s": [], "pause_s": []} for m in METHODS}
    problems: list[str] = []

    def go(name: str) -> None:
        master.set(f"bench/go/{name}", "1")

    def done(name: str) -> dict[str, float]:
        master.wait([f"bench/done/{name}"])
        return json.loads(master.get(f"bench/done/{name}"))

    v = 0
    try:
        for mode in ("sync", "async"):
            sync = SGLangWeightSync(engine, specs[mode], host="127.0.0.1", port=master.port,
                                    options=BridgeOptions(prefix=f"bench-{mode}"), cache_dir=str(work / "probe"))
            for rep in range(args.reps + 1):
                v += 1
                go(f"wb_{mode}/{v}")
                if mode == "async":
                    while sync.staged() != v:
                        time.sleep(0.002)
                t0 = time.perf_counter()
                sync.update(v)
                pause = time.perf_counter() - t0
                done(f"wb_{mode}/{v}")
                if rep:
                    rows[f"wb_{mode}"]["pause_s"].append(pause)
                problems += [f"wb_{mode} v{v}: {p}" for p in sync.check(work / f"v{v}") if not p.startswith(NOT_KEPT)]
                print(f"[bench] wb_{mode} v{v}: pause {pause:.3f} s", file=sys.stderr, flush=True)
            if mode == "async":
                checker = sync
            else:
                sync.close()
        names, dtypes, shapes = [], [], []
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for name, t in sorted(ref.state_dict().items()):
            if name == "lm_head.weight" and ref.config.tie_word_embeddings:
                continue
            names.append(name)
            dtypes.append("float32")
            shapes.append(list(t.shape))
        del ref
        go("group")
        _ok(engine.init_weights_update_group("127.0.0.1", group_port, 1, 1 + args.tp, "wb-bench", backend="gloo"),
            "init_weights_update_group")
        for rep in range(args.reps + 1):
            v += 1
            t0 = time.perf_counter()
            _ok(engine.begin_weight_update(), "begin_weight_update")
            go(f"distributed/{v}")
            _ok(engine.update_weights_from_distributed(names, dtypes, shapes, group_name="wb-bench"),
                "update_weights_from_distributed")
            _ok(engine.end_weight_update(), "end_weight_update")
            pause = time.perf_counter() - t0
            stats = done(f"distributed/{v}")
            print(f"[bench] distributed v{v}: pause {pause:.3f} s, update {stats['update_s']:.3f} s", file=sys.stderr,
                  flush=True)
            if rep:
                rows["distributed"]["pause_s"].append(pause)
                rows["distributed"]["update_s"].append(stats["update_s"])
            problems += [f"distributed v{v}: {p}" for p in checker.check(work / f"v{v}")
                         if "checkpoint format" not in p]
        for rep in range(args.reps + 1):
            v += 1
            go(f"disk/{v}")
            stats = done(f"disk/{v}")
            t0 = time.perf_counter()
            _ok(engine.update_weights_from_disk(str(work / f"v{v}")), "update_weights_from_disk")
            pause = time.perf_counter() - t0
            print(f"[bench] disk v{v}: pause {pause:.3f} s", file=sys.stderr, flush=True)
            if rep:
                rows["disk"]["pause_s"].append(pause)
                rows["disk"]["update_s"].append(stats["update_s"] + pause)
            problems += [f"disk v{v}: {p}" for p in checker.check(work / f"v{v}") if "checkpoint format" not in p]
        checker.close()
    finally:
        trainers.join(timeout=600)
        engine.shutdown()
    for r in results:
        if not r.ok:
            print(f"trainer rank {r.index} failed: {r.error}\n{(r.traceback or '')[-3000:]}", file=sys.stderr)
            return 1
    for mode in ("sync", "async"):
        rows[f"wb_{mode}"]["update_s"] = results[0].value[f"wb_{mode}_update_s"][1:]
    med = {m: {k: statistics.median(vals) for k, vals in d.items()} for m, d in rows.items()}
    report = {"tp": args.tp, "reps": args.reps, "params": sum(s[0] * (s[1] if len(s) > 1 else 1) for s in shapes),
              "median_s": med, "problems": problems[:10],
              "ratios": {f"{m}/wb_{w}": {k: med[m][k] / med[f"wb_{w}"][k] for k in ("update_s", "pause_s")}
                         for m in ("distributed", "disk") for w in ("sync", "async")}}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"SGLang TP{args.tp}, FSDP2 dp2 trainer, {report['params'] / 1e6:.1f}M fp32 params, "
              f"median of {args.reps}; bitwise: {'all equal' if not problems else problems[:3]}")
        print(f"{'method':<34}{'update (s)':>12}{'engine pause (s)':>18}")
        label = {"wb_sync": "weightbridge sync (in place)", "wb_async": "weightbridge async (staged)",
                 "distributed": "update_weights_from_distributed", "disk": "update_weights_from_disk"}
        for m in METHODS:
            print(f"{label[m]:<34}{med[m]['update_s']:>12.3f}{med[m]['pause_s']:>18.3f}")
        for key, r in report["ratios"].items():
            print(f"ratio {key:<28} update x{r['update_s']:.2f}  pause x{r['pause_s']:.2f}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
