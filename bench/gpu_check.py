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

Every rollout tensor is compared bitwise with what its IR says it must hold (the checks:
:mod:`weightbridge.testing._internal.gpu_check`; ``bench/gpu_readiness.py`` runs check 1 on a single GPU). Each check runs the
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

from weightbridge.testing._internal.gpu_check import qwen2_config, run_check


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
