#!/usr/bin/env python
"""Benchmark: a rollout rank's extra memory, measured by the kernel, in units of ``round_bytes``.

For each case, ONE rollout engine (or a plain ``RolloutBridge``) and ONE trainer rank (a plain
process holding the model's canonical tensors, FSDP2 dp 1), Gloo, a Qwen2-style model of about
1.07 GB in bfloat16 (32 layers, hidden 1024, untied embeddings; ``--layers`` etc. change it),
``sync.round_bytes`` 64 MiB. Measured on every rollout rank's process (the worker that holds the
rank: the plain rank's process, vLLM's worker, SGLang's scheduler):

* ``baseline``: the process's resident set (``VmRSS``) before the bridge exists (the engine alone);
* ``init``: the peak resident set (``VmHWM``, reset through ``/proc/PID/clear_refs`` before the
  phase) while the bridge joins (vLLM's ``init_weight_transfer_engine``, SGLang's ``init``, or
  ``RolloutBridge.from_spec``; engines with ``probe="off"``), minus the baseline;
* ``update``: the peak while a version moves and becomes live (the driver's ``update(v)`` while the
  trainer pushes; the plain rank's ``poll()`` + ``apply()``), minus the baseline (so memory the
  bridge keeps between updates counts too); the largest over ``--versions`` updates;
* ``init+probe`` (engines): after that bridge left, a join again with a cold probe cache (the
  engine's loader probed on a copy of the model), above the resident set just before it.

Each is printed divided by ``round_bytes`` (the memory contract, ``docs/memory.md``: in place a
rank holds at most about 2 x ``round_bytes`` more than the engine; staging adds one shard), next
to what the bridge reports about itself where it does (``RolloutBridge.memory()``). glibc is told
to map every allocation above 64 KiB on its own (``MALLOC_MMAP_THRESHOLD_``) so that freed memory
leaves the resident set and peaks are not hidden by memory kept from an earlier phase.

Cases (``--cases``, default all; each runs in its own process, one at a time):
``plain`` (in place), ``plain-staging``, ``vllm-tp1``, ``vllm-tp2``, ``sglang-tp1`` (run by the
SGLang venv's Python: ``--sglang-python``, default ``/work/venvs/sglang/bin/python``; skipped
with the reason when it is missing). The engines load dummy weights (``load_format="dummy"``: no
checkpoint on disk); the bytes moved are the trainer's.

    python bench/rollout_memory.py                      # every case (~10 min on 2 cores), ~8 GB RAM
    python bench/rollout_memory.py --cases plain,vllm-tp1 --json --no-probe > a.json
    python bench/rollout_memory.py --combine a.json b.json   # one report over cases run separately

Last line: ``worst in-place extra/round_bytes = X.XX`` over the in-place cases' ``init`` and
``update`` columns (the probe runs once per engine version and config, cached; its column is
separate). ``reported``: what the bridge says of itself (``RolloutBridge.memory()``: allocated
bytes, where the resident set counts only pages touched). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
CASES = ("plain", "plain-staging", "vllm-tp1", "vllm-tp2", "sglang-tp1")
SGLANG_PYTHON = "/work/venvs/sglang/bin/python"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


# -- the kernel's accounting --------------------------------------------------------------------
def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def rss(pid: int) -> int:
    return status_kib(pid, "VmRSS") * 1024


def peak(pid: int) -> int:
    return status_kib(pid, "VmHWM") * 1024


def reset_peak(pid: int) -> None:
    """Reset the process's peak resident set to its current one (Linux >= 4.0)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


class Meter:
    """The peak of a set of processes during phases, relative to each one's baseline."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.base = {p: rss(p) for p in self.pids}

    def start(self) -> None:
        for p in self.pids:
            reset_peak(p)

    def extra(self) -> int:
        """The largest extra over the processes since :meth:`start` (bytes above each baseline)."""
        return max(peak(p) - self.base[p] for p in self.pids)


# -- the model and the spec ---------------------------------------------------------------------
def model_config(args: argparse.Namespace) -> dict[str, Any]:
    return {"hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
            "max_window_layers": args.layers, "num_attention_heads": args.hidden // 64, "num_key_value_heads": 8,
            "vocab_size": args.vocab, "tie_word_embeddings": False, "max_position_embeddings": 256}


def write_config(directory: Path, args: argparse.Namespace) -> Path:
    """A Qwen2 config.json only (the engines load dummy weights)."""
    from weightbridge.testing._internal.vllm_selfcheck import hf_config

    cfg = hf_config("qwen2", **model_config(args))
    cfg.torch_dtype = "bfloat16"
    cfg.architectures = ["Qwen2ForCausalLM"]
    directory.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(directory)
    return directory / "config.json"


def spec_text(config: Path, rollout: dict[str, Any], *, mode: str, round_bytes: int, staging: bool | None,
              timeout_s: float) -> str:
    import yaml

    sync: dict[str, Any] = {"mode": mode, "round_bytes": round_bytes, "transport": "gloo", "timeout_s": timeout_s,
                            "heartbeat_s": 0.5, "max_staleness": 1}
    if staging is not None:
        sync["staging"] = staging
    return yaml.safe_dump({"version": 1, "model": {"config": str(config), "dtype": "bfloat16"},
                           "trainer": {"preset": "fsdp2", "mesh": {"dp": 1}}, "rollout": rollout, "sync": sync},
                          sort_keys=False)


# -- the trainer (one process) ------------------------------------------------------------------
def trainer_rank(job: dict[str, Any]) -> dict[str, Any]:
    """Push ``versions`` versions of the canonical tensors (each a new value), paced by ``bench/go/v``."""
    import torch

    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.tensors import canonical_tensors
    from weightbridge.transport.store import open_store

    resolved = load_spec(job["spec"])
    tensors = canonical_tensors(resolved.canonical, seed=1, dtype="bfloat16")
    store = open_store("127.0.0.1", job["port"], is_master=False, timeout_s=job["timeout_s"])
    bridge = TrainerBridge.from_spec(resolved, rank=0, tensors=tensors, store=store,
                                     options=BridgeOptions(prefix=job["prefix"]))
    seconds = []
    for v in range(1, job["versions"] + 1):
        store.wait([f"bench/go/{v}"])
        with torch.no_grad():
            for t in tensors.values():
                t.add_(1)
        t0 = time.perf_counter()
        bridge.push(v)
        seconds.append(time.perf_counter() - t0)
    bridge.close()
    return {"push_s": seconds}


def start_trainer(job: dict[str, Any]) -> tuple[threading.Thread, list]:
    from weightbridge.localrun import launch

    out: list = []
    th = threading.Thread(target=lambda: out.extend(launch(trainer_rank, [(job,)], timeout_s=job["timeout_s"] * 4)),
                          daemon=True)
    th.start()
    return th, out


def trainer_done(th: threading.Thread, out: list, timeout_s: float) -> None:
    th.join(timeout_s)
    if not out or not out[0].ok:
        why = "no result" if not out else (f"{type(out[0].error).__name__}: {out[0].error}" if out[0].error
                                           else f"exit {out[0].exitcode}")
        raise RuntimeError(f"trainer rank failed: {why}\n{out[0].traceback if out else ''}")


# -- the plain RolloutBridge (one process) ------------------------------------------------------
def plain_rank(job: dict[str, Any]) -> dict[str, Any]:
    """One rollout rank with its live tensors; measures its own process."""
    from weightbridge.bridge import BridgeOptions, RolloutBridge, load_spec
    from weightbridge.tensors import empty_like_layout
    from weightbridge.transport.store import open_store

    resolved = load_spec(job["spec"])
    live = empty_like_layout(resolved.rollout.ranks[0])  # the "engine's" weights (touched: resident)
    store = open_store("127.0.0.1", job["port"], is_master=False, timeout_s=job["timeout_s"])
    pid = os.getpid()
    meter = Meter([pid])
    meter.start()
    bridge = RolloutBridge.from_spec(resolved, rank=0, tensors=live, store=store,
                                     options=BridgeOptions(prefix=job["prefix"]))
    out: dict[str, Any] = {"init": meter.extra(), "update": 0, "reported": _reported(bridge)}
    for v in range(1, job["versions"] + 1):
        meter.start()
        store.set(f"bench/go/{v}", b"1")
        deadline = time.monotonic() + job["timeout_s"]
        while not bridge.poll():
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {v} never arrived")
            time.sleep(0.001)
        bridge.apply()
        out["update"] = max(out["update"], meter.extra())
        out["reported"] = _reported(bridge)
    bridge.close()
    return out


def _reported(bridge: Any) -> dict[str, int] | None:
    memory = getattr(bridge, "memory", None)  # RolloutBridge.memory() where the library reports it
    return memory() if callable(memory) else None


def run_plain(args: argparse.Namespace, staging: bool, work: Path) -> dict[str, Any]:
    from weightbridge.localrun import ensure_env_secret, launch
    from weightbridge.transport.store import open_store

    ensure_env_secret()
    config = write_config(work / "model", args)
    spec = work / "spec.yaml"
    spec.write_text(spec_text(config, {"preset": "hf", "mesh": {"dp": 1}}, mode="sync",
                              round_bytes=args.round_bytes, staging=staging, timeout_s=args.timeout_s))
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout_s)
    job = {"spec": str(spec), "port": master.port, "versions": args.versions, "timeout_s": args.timeout_s,
           "prefix": "bench-mem"}
    th, tout = start_trainer(job)
    res = launch(plain_rank, [(job,)], timeout_s=args.timeout_s * 4)[0]
    if not res.ok:
        raise RuntimeError(f"rollout rank failed: {res.error}\n{res.traceback}")
    trainer_done(th, tout, args.timeout_s)
    return {"ranks": 1, "init_probe": None, "init": res.value["init"], "update": res.value["update"],
            "reported": res.value["reported"]}


# -- engines ------------------------------------------------------------------------------------
def run_engine(args: argparse.Namespace, engine: str, tp: int, work: Path) -> dict[str, Any]:
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.transport.store import open_store

    ensure_env_secret()
    config = write_config(work / "model", args)
    preset = "vllm" if engine == "vllm" else "sglang"
    spec = work / "spec.yaml"
    spec.write_text(spec_text(config, {"preset": preset, "mesh": {"tp": tp}}, mode="sync",
                              round_bytes=args.round_bytes, staging=None, timeout_s=args.timeout_s))
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout_s)
    job = {"spec": str(spec), "port": master.port, "versions": args.versions, "timeout_s": args.timeout_s,
           "prefix": "bench-mem-2"}
    handle, pids, connect, leave, close = (start_vllm if engine == "vllm" else start_sglang)(config.parent, tp)
    try:
        meter = Meter(pids)  # the engine alone
        meter.start()
        th, tout = start_trainer(job)
        sync = connect(spec, master.port, "bench-mem-2", None)  # probe="off": the join itself
        init = meter.extra()
        update = 0
        for v in range(1, args.versions + 1):
            meter.start()
            master.set(f"bench/go/{v}", b"1")
            applied = sync.update(v)
            if applied != v:
                raise RuntimeError(f"update({v}) applied {applied}")
            update = max(update, meter.extra())  # above the engine alone: what the bridge keeps counts
        trainer_done(th, tout, args.timeout_s)
        reported = _engine_reported(engine, sync)
        init_probe = None
        if args.probe:
            leave(sync)
            time.sleep(1.0)
            meter = Meter(pids)  # again after the bridge left: a join with a cold probe cache
            meter.start()
            connect(spec, master.port, "bench-mem-1", str(work / "probe"))
            init_probe = meter.extra()
    finally:
        close(handle)
    return {"ranks": tp, "init_probe": init_probe, "init": init, "update": update, "reported": reported}


def _engine_reported(engine: str, sync: Any) -> Any:
    try:
        status = sync.status() if engine == "sglang" else sync.llm.collective_rpc("weightbridge_status")
    except Exception:  # noqa: BLE001 - an older library reports no memory
        return None
    mem = [s.get("memory") for s in status if isinstance(s, dict)]
    return mem[0] if mem and mem[0] is not None else None


def _children(match: tuple[str, ...]) -> list[int]:
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            text = " ".join([proc.name()] + proc.cmdline())
        except psutil.Error:
            continue
        if any(m in text for m in match):
            found.append(proc.pid)
    return found


def start_vllm(model_dir: Path, tp: int) -> tuple[Any, list[int], Any, Any, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if tp == 2:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    from weightbridge.integrations.vllm import BACKEND
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    llm = LLM(model=str(model_dir), tensor_parallel_size=tp, skip_tokenizer_init=True, enforce_eager=True,
              dtype="bfloat16", load_format="dummy", max_model_len=128, max_num_seqs=4, seed=0,
              weight_transfer_config=WeightTransferConfig(backend=BACKEND),
              worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension")
    pids = _worker_pids("VLLM::Worker", tp)  # one process per worker (vLLM on CPU: TP 1 too)

    def leave(sync: Any) -> None:
        llm.collective_rpc("shutdown_weight_transfer_engine")

    def close(handle: Any) -> None:
        handle.llm_engine.engine_core.shutdown()

    return llm, pids, _connector(VLLMWeightSync, llm), leave, close


def _worker_pids(match: str, tp: int) -> list[int]:
    import psutil

    pids = _children((match,))
    if len(pids) != tp:
        names = [" ".join(p.cmdline())[:80] for p in psutil.Process().children(recursive=True)]
        raise RuntimeError(f"expected {tp} processes matching {match!r}, found {pids}: {names}")
    return pids


def _connector(driver: Any, handle: Any) -> Any:
    """``connect(spec, port, prefix, cache)``: the engine's driver; ``cache`` None: ``probe="off"``."""
    from weightbridge.bridge import BridgeOptions

    def connect(spec: Path, port: int, prefix: str, cache: str | None) -> Any:
        return driver(handle, spec, host="127.0.0.1", port=port, options=BridgeOptions(prefix=prefix),
                      cache_dir=cache, probe="off" if cache is None else "check")

    return connect


def start_sglang(model_dir: Path, tp: int) -> tuple[Any, list[int], Any, Any, Any]:
    from weightbridge.integrations.sglang.driver import SGLangWeightSync
    from weightbridge.integrations.sglang.cpu_engine import make_engine

    # mem_fraction_static: SGLang sizes its static memory from the host's; the selfcheck's 0.05 leaves a
    # 1 GB model no room for the (max_total_tokens-capped) KV cache
    engine = make_engine(model_dir, tp, dtype="bfloat16", load_format="dummy", mem_fraction_static=0.2)
    pids = _worker_pids("scheduler", tp)

    def leave(sync: Any) -> None:
        sync.close()

    def close(handle: Any) -> None:
        handle.shutdown()

    return engine, pids, _connector(SGLangWeightSync, engine), leave, close


# -- driver -------------------------------------------------------------------------------------
def run_case(args: argparse.Namespace, case: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"wb-bench-mem-{case}-"))
    if case in ("plain", "plain-staging"):
        out = run_plain(args, case == "plain-staging", work)
    else:
        engine, tp = case.split("-tp")
        out = run_engine(args, engine, int(tp), work)
    return {"case": case, **out}


def model_bytes(args: argparse.Namespace) -> int:
    h, i, n, v = args.hidden, args.intermediate, args.layers, args.vocab
    kv = 8 * 64
    layer = h * h * 2 + 2 * h * kv + h + 2 * kv + 3 * h * i + 2 * h
    return 2 * (n * layer + 2 * v * h + h)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this process (the driver runs each so)
    ap.add_argument("--versions", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--round-bytes", type=int, default=64 * MiB)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--sglang-python", default=SGLANG_PYTHON)
    ap.add_argument("--no-probe", dest="probe", action="store_false",
                    help="engines: skip the join with a cold probe cache (its column '-'; it takes minutes on 2 cores)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--combine", nargs="+", metavar="JSON",
                    help="no run: one report over the rows of earlier --json outputs (cases run one at a time)")
    args = ap.parse_args()
    if args.combine:
        return report(args, combined_rows(args, args.combine))
    if not sys.platform.startswith("linux"):
        print("rollout_memory.py reads /proc: Linux only", file=sys.stderr)
        return 2
    if args.case:
        print("RESULT " + json.dumps(run_case(args, args.case)), flush=True)
        return 0
    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        if case not in CASES:
            ap.error(f"unknown case {case!r} (one of {', '.join(CASES)})")
        python = sys.executable
        if case.startswith("sglang"):
            python = args.sglang_python
            if not Path(python).exists():
                rows.append({"case": case, "skipped": f"no SGLang venv at {python} (--sglang-python)"})
                continue
        argv = [python, __file__, "--case", case, "--versions", str(args.versions), "--hidden", str(args.hidden),
                "--intermediate", str(args.intermediate), "--layers", str(args.layers), "--vocab", str(args.vocab),
                "--round-bytes", str(args.round_bytes), "--timeout-s", str(args.timeout_s)] + ([] if args.probe else ["--no-probe"])
        env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).parents[1]))}
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout_s * 6)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            rows.append({"case": case, "failed": f"exit {proc.returncode}", "tail": tail})
            print(f"{case}: FAILED (exit {proc.returncode})\n{tail}", file=sys.stderr)
            continue
        row = json.loads(lines[-1][len("RESULT "):])
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{case}: done in {row['seconds']:.0f}s", file=sys.stderr, flush=True)
    return report(args, rows)


def combined_rows(args: argparse.Namespace, paths: list[str]) -> list[dict[str, Any]]:
    """The rows of earlier ``--json`` outputs (the JSON object alone, or followed by the table), which must
    have measured with this run's ``--round-bytes`` and model; a case measured twice: the later file's."""
    rows: dict[str, dict[str, Any]] = {}
    for path in paths:
        text = Path(path).read_text()
        data, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
        if data["round_bytes"] != args.round_bytes or data["model_bytes"] != model_bytes(args):
            raise SystemExit(f"{path}: measured with round_bytes {data['round_bytes']} and a model of "
                             f"{data['model_bytes']} bytes, not {args.round_bytes} and {model_bytes(args)}")
        rows.update({r["case"]: r for r in data["rows"]})
    return [rows[c] for c in CASES if c in rows]


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    rb = args.round_bytes
    in_place = [r for r in rows if "init" in r and r["case"] != "plain-staging"]
    worst = max((max(r["init"], r["update"]) / rb for r in in_place), default=float("nan"))
    if args.json:
        print(json.dumps({"round_bytes": rb, "model_bytes": model_bytes(args), "rows": rows, "worst": worst}, indent=1))
    print(f"\nrollout rank extra memory (peak resident set above the engine alone), model "
          f"{model_bytes(args) / 1e9:.2f} GB bf16, round_bytes {rb / MiB:.0f} MiB, {args.versions} update(s)")
    print(f"{'case':<15} {'ranks':>5} {'init+probe':>11} {'init':>7} {'update':>7}   (x round_bytes)  reported")
    for r in rows:
        if "init" not in r:
            print(f"{r['case']:<15} {r.get('skipped') or r.get('failed')}")
            continue
        probe = "-" if r["init_probe"] is None else f"{r['init_probe'] / rb:.2f}"
        print(f"{r['case']:<15} {r['ranks']:>5} {probe:>11} {r['init'] / rb:>7.2f} {r['update'] / rb:>7.2f}"
              f"   {'' if r.get('reported') is None else json.dumps(r['reported'])}")
    print(f"worst in-place extra/round_bytes = {worst:.2f}")
    return 0 if all("init" in r or "skipped" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
