"""What a single-GPU machine says about weightbridge's GPU path, in one command of at most 8 minutes.

    python bench/gpu_readiness.py                   # a GPU machine, from a checkout
    python -m weightbridge.testing._internal.gpu_readiness    # the same, from an installed wheel
    python bench/gpu_readiness.py --dry-run         # CPU: the script itself (CI runs it)

Writes ``gpu_readiness.json`` and ``gpu_readiness.log`` under ``--out`` and exits 0 when every stage
passed. Stages, each in fresh processes under its own
deadline, within one budget (``--budget-s``, 480 s):

1. ``versions``: Python, torch, CUDA, NCCL, the GPU (name, memory, UUID), this host's identity, the
   private torch APIs of ``_torch_compat`` present;
2. ``nccl_calls``: every private torch/NCCL call the library makes, on one-rank groups (non-blocking
   communicator init, coalesced P2P, abort, shutdown, Gloo options, version counters, batched
   copies), and a group creation aborted at its deadline while the other rank never comes;
3. ``executor``: the executor's CUDA path end to end through the in-process loopback stand-in for
   NCCL (device slabs, zero-copy, checksums at odd offsets, delta, thread overlap, callers on
   non-default streams whose writes land late), bitwise;
4. ``micro``: GB/s of the device checksum, delta encode and pack (many small items, batched);
5. ``cuda_gloo``: ``bench/gpu_check.py``'s CUDA tensors + Gloo check (6 processes on the GPU);
6. ``two_ranks_one_gpu``: two bridge ranks on the one GPU with ``transport: auto`` (NCCL): both must
   refuse in the handshake with ``DeviceConflict``; then what NCCL itself does with such a group
   (informational);
7. ``cuda_ipc``: a trainer and a rollout bridge rank as two processes on the one GPU with
   ``sync.transport: ipc`` (the colocated data plane: one exported slab per sender, the receiver's
   mapping cached), three versions bitwise, no ``/dev/shm`` segment left (dry run: ``shm``, the same
   protocol through ``/dev/shm``).

``--dry-run`` runs every stage's code on CPU with stand-ins (the loopback NCCL, a recording stand-in
for CUDA streams, a stated GPU identity) and small sizes: it validates the script, not the GPU.
How to carry it to a machine without internet: ``docs/gpu_readiness.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from weightbridge.testing._internal import gpu_stages
from weightbridge.localrun import launch

SPEC_PAIR = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 1}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 1}}
sync: {mode: sync, timeout_s: 10, heartbeat_s: 0.2}
"""


def sizes(dry: bool, args: Any) -> dict:
    """What the stages move: small on CPU (the script's own check), GPU-sized otherwise."""
    return {"dry": dry, "round_bytes": 64 << 10, "wall_s": 60.0, "abort_timeout_s": 2.0 if dry else 5.0,
            "sleep_cycles": 50_000_000, "checksum_mib": args.checksum_mib or (4 if dry else 512),
            "pack_items": args.pack_items or (2000 if dry else 20000)}


def _launched(fn: Any, cfg: dict, limit_s: float) -> dict:
    """``fn(cfg)`` in a fresh process (CUDA: spawned) under ``limit_s``."""
    [res] = launch(fn, [(cfg,)], timeout_s=limit_s, start_method="forkserver" if cfg["dry"] else "spawn")
    if res.ok:
        return res.value
    why = f"killed at its {limit_s:.0f} s deadline" if res.timed_out else (
        f"{type(res.error).__name__}: {res.error}" if res.error else f"exit code {res.exitcode}")
    return {"status": "FAIL", "reason": why, "traceback": res.traceback[-3000:]}


# -- 5. bench/gpu_check.py's CUDA + Gloo check -------------------------------------------------------------
def stage_cuda_gloo(cfg: dict, out: Path, limit_s: float) -> dict:
    from weightbridge.testing._internal.gpu_check import qwen2_config, run_check

    dims = (1, 256, 1024, 512) if cfg["dry"] else (4, 2048, 32768, 5632)
    config = out / "gpu_check_config.json"
    config.write_text(json.dumps(qwen2_config(dims[1], dims[0], dims[2], dims[3])))
    spec = (f"model: {{config: {json.dumps(str(config))}}}\nversion: 1\n"
            "trainer: {preset: megatron, mesh: {tp: 2}}\nrollout: {preset: vllm, instances: 2, mesh: {tp: 2}}\n")
    args = SimpleNamespace(round_mib=1 if cfg["dry"] else 64, timeout=30.0, iters=1 if cfg["dry"] else 2,
                           checksums=True, simulate_cpu=cfg["dry"])
    res = run_check("cuda+gloo", spec, "gloo", [0] * 6, args, wall_s=max(10.0, limit_s - 5))
    res["status"] = res.get("status", "FAIL")
    return res


# -- 6. two bridge ranks on one GPU ------------------------------------------------------------------
def pair_rank(cfg: dict) -> dict:
    """A trainer or rollout bridge rank of :data:`SPEC_PAIR` on the one GPU (dry: on CPU, its data plane
    stating NCCL on a stand-in GPU); returns the typed error it got, or that it got none."""
    from weightbridge.bridge import BridgeOptions, RolloutBridge, TrainerBridge, load_spec
    from weightbridge.errors import BridgeError
    from weightbridge.tensors import canonical_tensors, empty_like_layout, materialize
    from weightbridge.testing._internal.cuda_standin import StatedIdentityPlane
    from weightbridge.transport.errors import TransportError
    from weightbridge.transport.store import open_store

    r = load_spec(SPEC_PAIR)
    dev = torch.device("cpu") if cfg["dry"] else torch.device("cuda", 0)
    plane = StatedIdentityPlane({"backend": "nccl", "device": "GPU-dry-run", "label": "cuda:0"}) if cfg["dry"] else None
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=10)
    options = BridgeOptions(data_plane=plane)
    try:
        if cfg["side"] == "trainer":
            tensors = materialize(r.trainer.ranks[0], canonical_tensors(r.canonical, seed=1), device=dev)
            bridge = TrainerBridge.from_spec(r, rank=0, tensors=tensors, store=store, options=options)
            try:
                bridge.push(1)
            finally:
                bridge.close()
        else:
            tensors = empty_like_layout(r.rollout.ranks[0], device=dev)
            bridge = RolloutBridge.from_spec(r, rank=0, tensors=tensors, store=store, staging=False, options=options)
            try:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    bridge.poll()
                    time.sleep(0.01)
            finally:
                bridge.close()
    except (BridgeError, TransportError) as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None, "message": "no error"}


def raw_nccl_rank(cfg: dict) -> dict:
    """One rank of a raw two-rank NCCL bridge group on the one GPU (no handshake): what NCCL does."""
    from weightbridge.transport.group import create_bridge_group
    from weightbridge.transport.store import open_store

    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=30)
    t0 = time.monotonic()
    try:
        group = create_bridge_group(store, rank=cfg["rank"], world_size=2, num_trainers=1, backend="nccl",
                                    timeout_s=10, device=torch.device("cuda", 0), prefix="raw")
    except Exception as exc:  # noqa: BLE001 - what happened is the result
        return {"outcome": type(exc).__name__, "message": str(exc)[:500], "seconds": round(time.monotonic() - t0, 2)}
    group.close()
    return {"outcome": "created", "seconds": round(time.monotonic() - t0, 2)}


def stage_two_ranks(cfg: dict, out: Path, limit_s: float) -> dict:
    from weightbridge.transport.store import open_store

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    method = "forkserver" if cfg["dry"] else "spawn"
    args = [({**cfg, "side": side, "port": store.port},) for side in ("trainer", "rollout")]
    results = launch(pair_rank, args, timeout_s=limit_s / 2, start_method=method)
    got = [res.value if res.ok else {"error": "no result", "message": res.traceback[-500:] or f"exit {res.exitcode}"}
           for res in results]
    ok = all(g["error"] == "DeviceConflict" and "trainer 0 and rollout 0 are both on" in g["message"] for g in got)
    res: dict[str, Any] = {"status": "PASS" if ok else "FAIL", "bridge": got,
                           "expected": "DeviceConflict on both ranks, before any NCCL call"}
    if cfg["dry"]:
        res["raw_nccl"] = "not attempted in a dry run"
        return res
    raw = launch(raw_nccl_rank, [({"rank": k, "port": store.port},) for k in range(2)], timeout_s=limit_s / 2 - 2,
                 start_method="spawn")
    res["raw_nccl"] = [r.value if r.ok else {"outcome": "killed" if r.timed_out else "crashed",
                                             "message": r.traceback[-500:]} for r in raw]
    return res


# -- 7. two processes on one GPU through CUDA IPC -------------------------------------------------------------
IPC_VERSIONS = (1, 2, 3)


def ipc_rank(cfg: dict) -> dict:
    """A trainer or rollout bridge rank of :data:`SPEC_PAIR` with ``sync.transport: ipc`` on the one GPU (dry:
    ``shm`` on CPU, the same protocol through ``/dev/shm``): the trainer pushes :data:`IPC_VERSIONS`, the
    rollout rank receives each one and compares it bitwise with the canonical weights of that version."""
    from weightbridge.bridge import RolloutBridge, TrainerBridge, load_spec
    from weightbridge.tensors import canonical_tensors, empty_like_layout, layout_mismatches, materialize
    from weightbridge.transport.store import open_store

    transport = "shm" if cfg["dry"] else "ipc"
    r = load_spec(SPEC_PAIR.replace("heartbeat_s: 0.2}", f"heartbeat_s: 0.2, transport: {transport}}}"))
    dev = torch.device("cpu") if cfg["dry"] else torch.device("cuda", 0)
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=10)
    res: dict[str, Any] = {"side": cfg["side"], "transport": transport, "versions": [], "mismatches": []}
    if cfg["side"] == "trainer":
        layout = r.trainer.ranks[0]
        tensors = materialize(layout, canonical_tensors(r.canonical, seed=0), device=dev)
        bridge = TrainerBridge.from_spec(r, rank=0, tensors=tensors, store=store)
        try:
            for v in IPC_VERSIONS:
                fresh = materialize(layout, canonical_tensors(r.canonical, seed=v), device=dev)
                with torch.no_grad():
                    for name, t in tensors.items():
                        t.copy_(fresh[name])
                stats = bridge.push(v)
                res["versions"].append(v)
                res.setdefault("push_s", []).append(round(stats.seconds, 4))
            plane = bridge.data_plane
            res["plane"] = [type(plane).__name__, getattr(plane, "kind", None), getattr(plane, "all_local", None)]
        finally:
            bridge.close()
        return res
    layout = r.rollout.ranks[0]
    tensors = empty_like_layout(layout, device=dev)
    bridge = RolloutBridge.from_spec(r, rank=0, tensors=tensors, store=store, staging=False)
    try:
        deadline = time.monotonic() + cfg["wait_s"]
        while (bridge.version or 0) < IPC_VERSIONS[-1] and time.monotonic() < deadline:
            if bridge.poll():
                v = bridge.apply()
                want = canonical_tensors(r.canonical, seed=v)
                res["versions"].append(v)
                res["mismatches"] += layout_mismatches(layout, {k: t.cpu() for k, t in tensors.items()}, want)
            else:
                time.sleep(0.005)
    finally:
        bridge.close()
    return res


def stage_cuda_ipc(cfg: dict, out: Path, limit_s: float) -> dict:
    """Trainer and rollout bridge ranks as two processes on the one GPU, ``transport: ipc`` (one exported
    slab per sender, the receiver's mapping cached; dry run: ``shm``): every version bitwise, no wire group,
    no ``/dev/shm`` segment of the job left afterwards."""
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.sync.auth import Signer
    from weightbridge.transport.segment import SHM_DIR, job_tag, segments
    from weightbridge.transport.store import open_store

    tag = job_tag(Signer(ensure_env_secret().encode()))
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    method = "forkserver" if cfg["dry"] else "spawn"
    args = [({**cfg, "side": side, "port": store.port, "wait_s": limit_s / 2 - 5},) for side in ("trainer", "rollout")]
    results = launch(ipc_rank, args, timeout_s=limit_s / 2, start_method=method)
    got = [res.value if res.ok else {"error": "no result", "message": (res.traceback or "")[-800:] or
                                     f"exit {res.exitcode}"} for res in results]
    left = segments(SHM_DIR, tag)
    want = list(IPC_VERSIONS)
    ok = (all(g.get("versions") == want and not g.get("mismatches") for g in got)
          and got[0].get("plane") == ["LocalDataPlane", "shm" if cfg["dry"] else "ipc", True] and not left)
    return {"status": "PASS" if ok else "FAIL", "ranks": got, "segments_left": left,
            "expected": f"versions {want} bitwise on the rollout rank through the local plane, no segment left"}


# (name, function, seconds at most, runs in a launched process of its own)
STAGES: list[tuple[str, Any, float, bool]] = [
    ("versions", gpu_stages.stage_versions, 45, True),
    ("nccl_calls", gpu_stages.stage_nccl_calls, 75, True),
    ("executor", gpu_stages.stage_executor, 100, True),
    ("micro", gpu_stages.stage_micro, 75, True),
    ("cuda_gloo", stage_cuda_gloo, 120, False),
    ("two_ranks_one_gpu", stage_two_ranks, 60, False),
    ("cuda_ipc", stage_cuda_ipc, 60, False),
]


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "gpu_readiness.log").open("w")
    t_start = time.monotonic()

    def say(line: str) -> None:
        line = f"[{time.monotonic() - t_start:6.1f}s] {line}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    dry = args.dry_run or not torch.cuda.is_available()
    if not args.dry_run and dry:
        say("no CUDA device here (torch.cuda.is_available() is False): running the dry run instead")
    cfg = sizes(dry, args)
    wanted = set(args.stages.split(",")) if args.stages else {name for name, *_ in STAGES}
    report: dict[str, Any] = {"dry_run": dry, "torch": torch.__version__, "stages": {}}
    for name, fn, limit, own_process in STAGES:
        if name not in wanted:
            continue
        left = args.budget_s - (time.monotonic() - t_start)
        if limit and left < min(limit, 20):
            report["stages"][name] = {"status": "FAIL", "reason": f"no time left in the {args.budget_s:g} s budget"}
            say(f"{name}: FAIL (budget spent)")
            continue
        limit_s = min(limit, left)
        say(f"{name}: running (at most {limit_s:.0f} s)")
        t0 = time.monotonic()
        try:
            res = _launched(fn, cfg, limit_s) if own_process else fn(cfg, out, limit_s)
        except Exception as exc:  # noqa: BLE001 - a stage's own failure is its result
            res = {"status": "FAIL", "reason": f"{type(exc).__name__}: {exc}"}
        res["seconds"] = round(time.monotonic() - t0, 2)
        report["stages"][name] = res
        say(f"{name}: {res['status']} in {res['seconds']:.1f} s" + (f" ({res['reason']})" if res.get("reason") else ""))
        for check in res.get("checks", []):
            say(f"    {'ok  ' if check['ok'] else 'FAIL'} {check['name']}: "
                + json.dumps(check.get("detail") if check["ok"] else check.get("error"))[:300])
            if not check["ok"] and check.get("traceback"):
                log.write(check["traceback"] + "\n")
        if res.get("traceback"):
            log.write(res["traceback"] + "\n")
    report["seconds"] = round(time.monotonic() - t_start, 1)
    report["status"] = "PASS" if all(s["status"] in ("PASS", "SKIPPED") for s in report["stages"].values()) else "FAIL"
    (out / "gpu_readiness.json").write_text(json.dumps(report, indent=2, default=str))
    say(f"{report['status']} in {report['seconds']:.1f} s: {out / 'gpu_readiness.json'}, {out / 'gpu_readiness.log'}")
    log.close()
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="weightbridge GPU readiness (one GPU, <= 8 minutes)")
    ap.add_argument("--dry-run", action="store_true", help="CPU stand-ins, small sizes: check the script itself")
    ap.add_argument("--out", default=None, help="directory for gpu_readiness.json and .log (default: a new temp dir)")
    ap.add_argument("--stages", default="", help="comma-separated subset of: " + ",".join(n for n, *_ in STAGES))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--checksum-mib", type=int, default=0, help="checksum benchmark size (default 512; dry 4)")
    ap.add_argument("--pack-items", type=int, default=0, help="items in the pack benchmark (default 20000; dry 2000)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="wb-gpu-readiness-")
    return 0 if run(args)["status"] == "PASS" else 1


if __name__ == "__main__":
    # run as the importable module, not as __main__: stage processes import their functions by name
    from weightbridge.testing._internal import gpu_readiness as _module

    sys.exit(_module.main())
