"""Run one vLLM selfcheck (a subprocess of the tests: vLLM spawns workers, so this is a __main__)."""

import json
import sys

if __name__ == "__main__":
    from weightbridge.testing._internal.vllm_selfcheck import run

    kind, tp, workdir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    transport = sys.argv[6] if len(sys.argv) > 6 else "gloo"
    report = run(kind, tp, workdir, steps=steps, log=lambda m: print(m, flush=True), transport=transport)
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
