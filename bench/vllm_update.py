#!/usr/bin/env python
"""Benchmark: a weightbridge update of a live vLLM engine vs saving safetensors + vLLM reloading them.

In ONE run, on one vLLM engine (CPU build, float32) and one 2-rank FSDP2 trainer (Gloo), per
trainer version (the trainer waits for the driver between versions, so timings never overlap):

(a) **weightbridge**: trainer ranks push their own shards (no gather), the vLLM workers receive
    their checkpoint-format shards and reload them through vLLM's weight-update protocol
    (``VLLMWeightSync.update``). Timed from the start of ``push`` on the trainer to the
    moment the new weights are live (the driver's ``update`` returned), wall clock.
(b) **save + reload** (what most RL frameworks do without a transfer engine): the trainer
    gathers the full model (``DTensor.full_tensor``), rank 0 writes it with ``save_pretrained``,
    and vLLM reloads it in place (``collective_rpc("reload_weights", weights_path=dir)``).
    Timed as gather + save (trainer) + reload (engine).

After (a) each version is checked bitwise against vLLM's own load of the saved checkpoint
(``weightbridge_check``). Prints per-version times and the median ratio b/a. The model is a
Qwen2 with untied embeddings (vLLM 0.32's CPU reload leaves a tied lm_head stale; see
docs/vllm_integration_notes.md), ``--hidden``/``--layers``/``--vocab`` set its size.

    python bench/vllm_update.py                    # ~50M parameters, float32 (~200 MB), TP 1
    python bench/vllm_update.py --tp 2 --versions 4 --json
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=1, choices=(1, 2))
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from weightbridge.bridge import BridgeOptions
    from weightbridge.testing import vllm_selfcheck as sc
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.testing.localrun import launch
    from weightbridge.transport.store import open_store

    heads = args.hidden // 64
    overrides = {"hidden_size": args.hidden, "intermediate_size": args.hidden * 8 // 3 // 64 * 64,
                 "num_hidden_layers": args.layers, "max_window_layers": args.layers, "num_attention_heads": heads,
                 "num_key_value_heads": 2, "vocab_size": args.vocab, "tie_word_embeddings": False}
    work = Path(tempfile.mkdtemp(prefix="wb-bench-vllm-"))
    model_dir = sc.write_model(work / "v0", "qwen2", **overrides)
    spec = sc.spec_text("qwen2", model_dir, args.tp, "sync", args.timeout_s)
    from weightbridge.sync.auth import ensure_env_secret

    ensure_env_secret()  # the trainers (launch) and the engine's workers inherit the job secret
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout_s)
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(model_dir), "workdir": str(work),
           "phases": [{"prefix": "wb-bench", "steps": args.versions, "spec": spec}],
           "timeout_s": args.timeout_s, "go_key": "bench/go"}
    results: list = []
    trainers = threading.Thread(target=lambda: results.extend(launch(
        sc.trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=args.timeout_s * (args.versions + 2))),
        daemon=True)
    trainers.start()
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print
    t0 = time.perf_counter()
    rows = []
    try:
        llm = sc.make_llm(model_dir, args.tp)
        say(f"engine up in {time.perf_counter() - t0:.1f}s")
        sync = VLLMWeightSync(llm, spec, host="127.0.0.1", port=master.port, options=BridgeOptions(prefix="wb-bench"))
        for v in range(1, args.versions + 1):
            master.set(f"bench/go/{v}", b"1")
            sync.update(v)
            ours = time.time()
            problems = [p for ps in llm.collective_rpc("weightbridge_check", args=(str(sc.version_dir(work, v)),))
                        for p in ps]
            t = time.perf_counter()
            llm.collective_rpc("reload_weights", kwargs={"weights_path": str(sc.version_dir(work, v))})
            reload_s = time.perf_counter() - t
            rows.append({"version": v, "ours_end": ours, "reload_s": reload_s, "problems": problems})
    except BaseException as exc:
        # The driver failed: every trainer rank's own result or error first (it is often the cause).
        print(f"driver failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        trainers.join(timeout=args.timeout_s + 10)  # trainer ranks raise within their own deadline
        report_ranks(results, trainers.is_alive())
        raise
    trainers.join(timeout=args.timeout_s)
    if not results or not all(r.ok for r in results):
        report_ranks(results, trainers.is_alive())
        return 1
    rec = {r["version"]: r for r in results[0].value}
    for row in rows:
        r = rec[row["version"]]
        row.update(weightbridge_s=row.pop("ours_end") - r["push_wall_start"], push_s=r["push_s"],
                   gather_s=r["gather_s"], save_s=r["save_s"], wire_bytes=r["wire_bytes"])
        row["baseline_s"] = row["gather_s"] + row["save_s"] + row["reload_s"]
        row["ratio"] = row["baseline_s"] / row["weightbridge_s"]
    out = {"tp": args.tp, "model_mb": rows[0]["wire_bytes"] / 1e6, "rows": rows,
           "median_ratio": statistics.median(r["ratio"] for r in rows),
           "all_bitwise_equal": all(not r["problems"] for r in rows)}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"\nvLLM TP{args.tp}, {out['model_mb']:.0f} MB per update (float32), 2 FSDP2 trainer ranks, CPU/Gloo")
        head = ("v", "weightbridge", "gather", "save", "reload", "baseline", "ratio")
        print(f"{head[0]:>3} {head[1]:>13} {head[2]:>8} {head[3]:>8} {head[4]:>8} {head[5]:>9} {head[6]:>6}  check")
        for r in rows:
            print(f"{r['version']:>3} {r['weightbridge_s']:>12.3f}s {r['gather_s']:>7.3f}s {r['save_s']:>7.3f}s "
                  f"{r['reload_s']:>7.3f}s {r['baseline_s']:>8.3f}s {r['ratio']:>6.2f}  "
                  f"{'bitwise equal' if not r['problems'] else r['problems'][:2]}")
        print(f"median baseline / weightbridge: {out['median_ratio']:.2f}x")
    llm.collective_rpc("shutdown_weight_transfer_engine")
    return 0 if out["all_bitwise_equal"] else 1


def report_ranks(results: list, running: bool) -> None:
    """Print every trainer rank's outcome (value summary or error + traceback tail) on stderr."""
    if not results:
        print(f"trainer ranks: no results ({'still running' if running else 'none returned'})", file=sys.stderr)
    for r in results:
        if r.ok:
            print(f"trainer rank {r.index}: ok ({len(r.value or [])} pushes)", file=sys.stderr)
        else:
            why = f"{type(r.error).__name__}: {r.error}" if r.error is not None else f"died (exit {r.exitcode})"
            tail = "\n    ".join(r.traceback.strip().splitlines()[-6:]) if r.traceback else ""
            print(f"trainer rank {r.index}: FAILED{' (timed out)' if r.timed_out else ''}: {why}"
                  + (f"\n    {tail}" if tail else ""), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
