#!/usr/bin/env python
"""GPU check of the data plane: the NCCL path end to end, verified bitwise, with GB/s.

    python bench/gpu_check.py              # a few minutes at most; exits 0 when every check passed

Checks (each in fresh processes, each with a hard wall-clock bound):

1. **cuda+gloo** (any number of GPUs): trainer Megatron TP2 -> 2 x vLLM TP2 with every tensor
   on CUDA (processes share the GPUs), Gloo bridge group: packing from and unpacking into CUDA
   tensors, wire buffers on CPU.
2. **nccl** (needs >= 2 GPUs): one process per GPU, NCCL bridge group, CUDA wire buffers,
   coalesced P2P batches; trainer Megatron TP S -> vLLM TP2 (or TP1) instances on the other GPUs.
   NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so on a
   single-GPU machine this check is reported as SKIPPED (``--try-shared-gpu`` attempts it anyway
   and reports what NCCL says).

Every rollout tensor is compared bitwise with what its IR says it must hold. Each check runs the
data plane twice, alternating: as it ships (large items as messages of their own, zero-copy where
their boxes are contiguous) and all packed (``direct_bytes`` off), and prints the ratio, so one
run on a GPU machine says whether direct messages help or hurt the NCCL path. Prints per check:
status, bytes, seconds, GB/s. Without CUDA it prints a SKIP line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

CHECK_WALL_S = 240.0


def qwen2_config(hidden: int, layers: int, vocab: int, inter: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": 16,
        "num_hidden_layers": layers, "num_key_value_heads": 4, "vocab_size": vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": layers,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02,
    }


def worker(cfg: dict) -> dict:
    import datetime

    from weightbridge.plan import build_plan
    from weightbridge.spec.resolve import check_text
    from weightbridge.transport import Executor, create_bridge_group, open_store
    from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize, needed_names

    r, problems = check_text(cfg["spec"])
    assert r is not None, problems
    plan = build_plan(r.trainer, r.rollout, round_bytes=cfg["round_bytes"])
    assert plan.plan_hash == cfg["plan_hash"], "plans differ across processes"
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    me = rank if side == "trainer" else S + rank
    cuda = not cfg.get("simulate_cpu")
    dev = torch.device("cuda", cfg["gpus"][me]) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=cfg["timeout_s"])
    group = create_bridge_group(
        store, rank=me, world_size=S + R, num_trainers=S, backend=cfg["backend"], timeout_s=cfg["timeout_s"], device=dev
    )
    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    canon = canonical_tensors(r.canonical, seed=3, names=needed_names(layout))
    if side == "trainer":
        local = materialize(layout, canon, device=dev)
        want = None
    else:
        local = empty_like_layout(layout, device=dev, fill=3.0)
        want = materialize(layout, canon, fill=3.0)
    del canon
    # Large items as messages of their own, zero-copy where their boxes are contiguous (the default),
    # and everything packed (the data plane before direct messages), alternating per iteration.
    variants = {"direct": Executor(plan, group, side=side, rank=rank, device=dev, checksums=cfg["checksums"]),
                "packed": Executor(plan, group, side=side, rank=rank, device=dev, checksums=cfg["checksums"],
                                   direct_bytes=1 << 62)}

    def barrier() -> None:
        t = torch.zeros(1, device=dev if cfg["backend"] == "nccl" else "cpu")
        group.pg.allreduce([t]).wait(datetime.timedelta(seconds=cfg["timeout_s"]))
        sync()

    times: dict[str, list[float]] = {k: [] for k in variants}
    diffs, stats = [], None
    for it in range(cfg["iters"]):
        for name in (("direct", "packed") if it % 2 == 0 else ("packed", "direct")):
            if side == "rollout":
                for t in local.values():
                    t.fill_(3.0)
            barrier()
            t0 = time.perf_counter()
            stats = variants[name].run(local)
            sync()
            barrier()
            times[name].append(time.perf_counter() - t0)
            if side == "rollout":
                diffs = [f"{name}: {d}" for d in diff_tensors({k: v.cpu() for k, v in local.items()}, want)]
                if diffs:
                    break
        if diffs:
            break
    group.close()
    return {"side": side, "rank": rank, "times": times, "diff": diffs, "received": stats.bytes_received if stats else 0,
            "peak": stats.peak_buffer_bytes if stats else 0,
            "zero_copy": (stats.zero_copy_bytes_sent + stats.zero_copy_bytes_received) if stats else 0}


def run_check(name: str, spec: str, backend: str, gpus: list[int], args) -> dict:
    from weightbridge.plan import build_plan
    from weightbridge.spec.resolve import check_text
    from weightbridge.transport import open_store
    from weightbridge.localrun import launch

    r, problems = check_text(spec)
    if r is None:
        return {"check": name, "status": "FAIL", "reason": "; ".join(str(p) for p in problems)}
    round_bytes = args.round_mib << 20
    plan = build_plan(r.trainer, r.rollout, round_bytes=round_bytes)
    S, R = r.trainer.world_size, r.rollout.world_size
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout)
    base = {"spec": spec, "round_bytes": round_bytes, "plan_hash": plan.plan_hash, "port": store.port,
            "timeout_s": args.timeout, "backend": backend, "gpus": gpus, "iters": args.iters, "checksums": args.checksums,
            "simulate_cpu": args.simulate_cpu}
    cfgs = [({**base, "side": "trainer", "rank": t},) for t in range(S)]
    cfgs += [({**base, "side": "rollout", "rank": q},) for q in range(R)]
    results = launch(worker, cfgs, timeout_s=CHECK_WALL_S, start_method="spawn", threads=2)
    bad = [res for res in results if not res.ok]
    if bad:
        res = bad[0]
        why = "timed out (killed)" if res.timed_out else (f"{type(res.error).__name__}: {res.error}" if res.error else f"exit {res.exitcode}")
        return {"check": name, "status": "FAIL", "reason": f"process {res.index}: {why}", "traceback": res.traceback[-2000:]}
    outs = [res.value for res in results]
    rollouts = [o for o in outs if o["side"] == "rollout"]
    diffs = [d for o in rollouts for d in o["diff"]]
    best = {k: min(max(o["times"][k][i] for o in outs) for i in range(len(outs[0]["times"][k]))) for k in ("direct", "packed")}
    received = sum(o["received"] for o in rollouts)
    return {
        "check": name, "status": "PASS" if not diffs else "FAIL", "backend": backend,
        "ranks": f"{S} trainer + {R} rollout on GPUs {sorted(set(gpus))}", "model_bytes": r.canonical.total_bytes(),
        "bytes_received": received, "seconds": best["direct"], "GBps": received / best["direct"] / 1e9,
        "packed_seconds": best["packed"], "packed_over_direct": best["packed"] / best["direct"],
        "zero_copy_bytes": sum(o["zero_copy"] for o in outs),
        "peak_buffer_bytes": max(o["peak"] for o in outs), "reason": "; ".join(diffs[:3]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="weightbridge GPU check (NCCL path)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--round-mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--checksums", action="store_true")
    ap.add_argument("--try-shared-gpu", action="store_true", help="attempt NCCL with several ranks on one GPU")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--simulate-cpu", action="store_true", help=argparse.SUPPRESS)  # check 1 on CPU tensors (self-test)
    args = ap.parse_args(argv)

    if not torch.cuda.is_available() and not args.simulate_cpu:
        print("SKIP: no CUDA device (torch.cuda.is_available() is False); the NCCL path needs a GPU machine.")
        return 0
    n = torch.cuda.device_count() if not args.simulate_cpu else 1
    tmp = Path(tempfile.mkdtemp(prefix="wb-gpucheck-"))
    cfg_path = tmp / "config.json"
    cfg_path.write_text(json.dumps(qwen2_config(args.hidden, args.layers, args.vocab, args.intermediate)))
    model = f"model: {{config: {json.dumps(str(cfg_path))}}}"
    results = []
    t_start = time.monotonic()

    # 1. CUDA tensors over Gloo: 2 trainer + 4 rollout processes sharing the GPUs.
    spec1 = f"{model}\nversion: 1\ntrainer: {{preset: megatron, mesh: {{tp: 2}}}}\nrollout: {{preset: vllm, instances: 2, mesh: {{tp: 2}}}}\n"
    results.append(run_check("cuda+gloo", spec1, "gloo", [i % n for i in range(6)], args))

    # 2. NCCL: one process per GPU.
    if args.simulate_cpu:
        pass
    elif n >= 2 or args.try_shared_gpu:
        world = n if n >= 2 else 2
        s = 1
        while s * 2 <= world // 2 and s * 2 <= 4:
            s *= 2
        rr = world - s
        rtp = 2 if rr % 2 == 0 else 1
        spec2 = (f"{model}\nversion: 1\ntrainer: {{preset: megatron, mesh: {{tp: {s}}}}}\n"
                 f"rollout: {{preset: vllm, instances: {rr // rtp}, mesh: {{tp: {rtp}}}}}\n")
        res = run_check("nccl", spec2, "nccl", [i % n for i in range(world)], args)
        if n < 2 and res["status"] == "FAIL":
            res = {"check": "nccl", "status": "SKIPPED", "reason": f"NCCL with {world} ranks on 1 GPU: {res['reason']}"}
        results.append(res)
    else:
        results.append({"check": "nccl", "status": "SKIPPED",
                        "reason": f"{n} GPU: NCCL needs one GPU per rank (it refuses two ranks of one communicator on "
                                  "the same GPU); run on a machine with >= 2 GPUs, or --try-shared-gpu to see NCCL's answer"})

    if args.json:
        print(json.dumps({"gpus": n, "seconds": time.monotonic() - t_start, "checks": results}, indent=2))
    else:
        gpu = torch.cuda.get_device_name(0) if not args.simulate_cpu else "CPU (simulated)"
        print(f"weightbridge GPU check: {n} x {gpu}, torch {torch.__version__}")
        for res in results:
            if res["status"] == "PASS":
                print(f"  {res['check']:<10} PASS  {res['ranks']}: {res['bytes_received'] / 1e6:.1f} MB in "
                      f"{res['seconds']:.3f} s = {res['GBps']:.2f} GB/s (bitwise verified; peak wire buffers "
                      f"{res['peak_buffer_bytes'] / 1e6:.1f} MB/rank)")
                print(f"  {'':<10}       all packed (direct_bytes off): {res['packed_seconds']:.3f} s; packed / direct = "
                      f"{res['packed_over_direct']:.2f} ({res['zero_copy_bytes'] / 1e6:.1f} MB moved zero-copy, both ends)")
            else:
                print(f"  {res['check']:<10} {res['status']}  {res.get('reason', '')}")
                if res.get("traceback"):
                    print(res["traceback"])
        print(f"total {time.monotonic() - t_start:.1f} s")
    return 0 if all(res["status"] in ("PASS", "SKIPPED") for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
