"""The CUDA tensors + Gloo check of ``bench/gpu_check.py`` (also a stage of ``bench/gpu_readiness.py``).

Harness; never imported by product code. :func:`run_check` runs one plan end to end in fresh
processes (``localrun.launch``, spawn: CUDA), every rollout tensor compared bitwise with what its IR
says it must hold, alternating the data plane as it ships (large items as messages of their own,
zero-copy where their boxes are contiguous) and all packed, and returns status, bytes, seconds,
GB/s and the packed / direct ratio. ``simulate_cpu``: the same on CPU tensors (a self-test).
"""

from __future__ import annotations

import time
from typing import Any

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


def run_check(name: str, spec: str, backend: str, gpus: list[int], args: Any, wall_s: float = CHECK_WALL_S) -> dict:
    """One check (``args``: round_mib, timeout, iters, checksums, simulate_cpu); see the module docstring."""
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
    # CUDA: fresh interpreters (spawn); on CPU (simulate_cpu) the forkserver's processes start in milliseconds
    results = launch(worker, cfgs, timeout_s=wall_s, start_method="forkserver" if args.simulate_cpu else "spawn",
                     threads=2)
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
