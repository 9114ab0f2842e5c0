"""Run the AsyncLLM check (a subprocess of the tests: vLLM spawns workers, so this is a __main__)."""

import json
import sys

if __name__ == "__main__":
    from weightbridge.testing._internal.vllm_async_check import run

    kind, tp, workdir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    report = run(kind, tp, workdir, log=lambda m: print(m, flush=True))
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
