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

``--server``: the same against a ``vllm serve`` process, as online RL stacks run vLLM; everything
goes through vLLM's HTTP routes. (a) is trainer rank 0's ``VLLMServers.push(bridge, v)``: push +
pause + ``/start_weight_update`` + ``/update_weights`` + ``/finish_weight_update`` + resume, until
``v`` is live. Versions alternate ``pause_route="pause"`` (``/pause`` ... ``/resume``) and ``"sleep"``
(the default: level-0 ``/sleep`` + ``/reset_prefix_cache`` ... ``/wake_up``), and the run ends with
each one's fixed cost per update: the server-side update's wall minus its ``/update_weights`` call
(the workers receiving and loading), i.e. HTTP control + pausing + labelling + resuming. (b) is gather + save + ``/pause`` + ``/collective_rpc reload_weights``
(``weights_path``: the server reloads from disk) + ``/resume``. vLLM's native trainer-to-server
path (the ``nccl`` backend: trainer rank 0 gathers and broadcasts every full tensor) needs CUDA
and NCCL, so on CPU the baseline is save + reload.

    python bench/vllm_update.py                    # ~50M parameters, float32 (~200 MB), TP 1
    python bench/vllm_update.py --tp 2 --versions 4 --json
    python bench/vllm_update.py --server           # vllm serve, HTTP-driven
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
    ap.add_argument("--server", action="store_true", help="a `vllm serve` process driven over HTTP")
    args = ap.parse_args()
    if args.server:
        return run_server(args)

    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.vllm.cpu_engine import make_llm
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.localrun import launch
    from weightbridge.testing._internal import vllm_selfcheck as sc
    from weightbridge.transport.store import open_store

    work = Path(tempfile.mkdtemp(prefix="wb-bench-vllm-"))
    model_dir = sc.write_model(work / "v0", "qwen2", **overrides(args))
    spec = sc.spec_text("qwen2", model_dir, args.tp, "sync", args.timeout_s)
    from weightbridge.localrun import ensure_env_secret

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
        llm = make_llm(model_dir, args.tp)
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
    llm.collective_rpc("shutdown_weight_transfer_engine")
    return finish(args, rows, "vLLM LLM (offline)")


def overrides(args: argparse.Namespace) -> dict:
    return {"hidden_size": args.hidden, "intermediate_size": args.hidden * 8 // 3 // 64 * 64,
            "num_hidden_layers": args.layers, "max_window_layers": args.layers,
            "num_attention_heads": args.hidden // 64, "num_key_value_heads": 2, "vocab_size": args.vocab,
            "tie_word_embeddings": False}


def run_server(args: argparse.Namespace) -> int:
    """The ``--server`` case: one ``vllm serve`` (subprocess), 2 FSDP2 trainer ranks whose rank 0 drives it."""
    from weightbridge.localrun import launch
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.testing._internal import vllm_online as online
    from weightbridge.testing._internal import vllm_selfcheck as sc
    from weightbridge.transport.store import open_store

    ensure_env_secret()  # the trainers (launch) and the server's workers inherit the job secret
    work = Path(tempfile.mkdtemp(prefix="wb-bench-vllm-server-"))
    model_dir = sc.write_model(work / "v0", "qwen2", **overrides(args))
    spec = sc.spec_text("qwen2", model_dir, args.tp, "sync", args.timeout_s)
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout_s)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print
    t0 = time.perf_counter()
    proc, server = online.start_server(model_dir, args.tp, work / "server.log", start=False)
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(model_dir), "workdir": str(work),
           "phases": [{"prefix": "wb-bench", "steps": args.versions, "spec": spec,
                       "pause_routes": ["pause", "sleep"]}], "timeout_s": args.timeout_s,
           "go_key": "bench/go", "go_wait_s": 900.0, "servers": [server.url]}
    results: list = []
    trainers = threading.Thread(target=lambda: results.extend(launch(
        sc.trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=args.timeout_s * (args.versions + 2))),
        daemon=True)
    trainers.start()  # rank 0's VLLMServers.init() waits for the server
    rows = []
    try:
        online.wait_server(proc, server, work / "server.log")
        say(f"vllm serve up in {time.perf_counter() - t0:.1f}s")
        for v in range(1, args.versions + 1):
            master.set(f"bench/go/{v}", b"1")
            deadline = time.monotonic() + args.timeout_s
            # live: labelled v and resumed (rank 0's push is then returning)
            while server.weight_version() != str(v) or server.call("/is_paused", method="GET")["is_paused"]:
                if time.monotonic() > deadline or not trainers.is_alive() or proc.poll() is not None:
                    raise RuntimeError(f"version {v} never went live")
                time.sleep(0.01)
            vdir = str(sc.version_dir(work, v))
            problems = [p for ps in server.collective_rpc("weightbridge_check", (vdir,)) for p in ps]
            t = time.perf_counter()  # the baseline's engine side, paused like ours
            server.call("/pause", query={"mode": "keep", "clear_cache": "true"})
            server.collective_rpc("reload_weights", kwargs={"weights_path": vdir})
            server.call("/resume")
            rows.append({"version": v, "reload_s": time.perf_counter() - t, "problems": problems})
    except BaseException as exc:
        print(f"driver failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        trainers.join(timeout=args.timeout_s + 10)
        report_ranks(results, trainers.is_alive())
        online.stop_server(proc)
        raise
    trainers.join(timeout=args.timeout_s)
    online.stop_server(proc)
    if not results or not all(r.ok for r in results):
        report_ranks(results, trainers.is_alive())
        return 1
    rec = {r["version"]: r for r in results[0].value}
    for row in rows:
        r = rec[row["version"]]
        row.update(weightbridge_s=r["push_s"], gather_s=r["gather_s"], save_s=r["save_s"], wire_bytes=r["wire_bytes"])
        row["baseline_s"] = row["gather_s"] + row["save_s"] + row["reload_s"]
        row["ratio"] = row["baseline_s"] / row["weightbridge_s"]
        control = r["server_update_s"]  # the update's wall on the server, its /update_weights part
        row.update(pause_route=control["pause_route"], fixed_s=control["total"] - control["update_weights"],
                   routes_s={k: v for k, v in control.items() if k.startswith("/")})
    fixed = {route: statistics.median(r["fixed_s"] for r in rows if r["pause_route"] == route)
             for route in ("pause", "sleep") if any(r["pause_route"] == route for r in rows)}
    code = finish(args, rows, "vllm serve (HTTP)", {"fixed_s_by_pause_route": fixed})
    say("fixed cost per update beyond the engine's own reload (HTTP control + pause/resume; median, versions "
        "alternate): " + ", ".join(f"pause_route={k!r} {v * 1e3:.1f} ms" for k, v in fixed.items()))
    for route in fixed:  # where it goes: each HTTP call's median
        calls = {k for r in rows if r["pause_route"] == route for k in r["routes_s"] if k != "/update_weights"}
        say(f"  {route}: " + ", ".join(
            f"{k} {statistics.median(r['routes_s'][k] for r in rows if k in r['routes_s'] and r['pause_route'] == route) * 1e3:.1f}"
            for k in sorted(calls)) + " ms")
    return code


def finish(args: argparse.Namespace, rows: list, what: str, extra: dict | None = None) -> int:
    out = {**(extra or {}), "tp": args.tp, "engine": what, "model_mb": rows[0]["wire_bytes"] / 1e6, "rows": rows,
           "median_ratio": statistics.median(r["ratio"] for r in rows),
           "all_bitwise_equal": all(not r["problems"] for r in rows)}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"\n{what} TP{args.tp}, {out['model_mb']:.0f} MB per update (float32), 2 FSDP2 trainer ranks, CPU/Gloo")
        head = ("v", "weightbridge", "gather", "save", "reload", "baseline", "ratio")
        print(f"{head[0]:>3} {head[1]:>13} {head[2]:>8} {head[3]:>8} {head[4]:>8} {head[5]:>9} {head[6]:>6}  check")
        for r in rows:
            print(f"{r['version']:>3} {r['weightbridge_s']:>12.3f}s {r['gather_s']:>7.3f}s {r['save_s']:>7.3f}s "
                  f"{r['reload_s']:>7.3f}s {r['baseline_s']:>8.3f}s {r['ratio']:>6.2f}  "
                  f"{'bitwise equal' if not r['problems'] else r['problems'][:2]}")
        print(f"median baseline / weightbridge: {out['median_ratio']:.2f}x")
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
