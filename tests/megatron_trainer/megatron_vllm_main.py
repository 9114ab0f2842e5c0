"""One vLLM selfcheck with the Megatron-Core trainer (a subprocess of the tests: vLLM spawns workers).

``python megatron_vllm_main.py KIND TP WORKDIR REPORT.json [STEPS]``
"""

import json
import sys

if __name__ == "__main__":
    from weightbridge.testing._internal.vllm_selfcheck import run

    kind, tp, workdir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    report = run(kind, tp, workdir, steps=steps, trainer_kind="megatron", log=lambda m: print(m, flush=True))
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
