"""Run one SGLang selfcheck case (a ``__main__``: SGLang spawns its scheduler processes).

usage: python sglang_selfcheck_main.py KIND TP WORKDIR REPORT.json STEPS [http] [megatron] [stranger]

``stranger``: after version 1, a client without the job secret sends hostile init commands
(:func:`sglang_stranger.stranger_commands`).
"""

import json
import sys

if __name__ == "__main__":
    from weightbridge.testing._internal.sglang_selfcheck import run

    kind, tp, workdir, out, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    flags = set(sys.argv[6:])
    after = None
    if "stranger" in flags:
        from sglang_stranger import stranger_commands as after
    report = run(kind, tp, workdir, steps=steps, http="http" in flags,
                 trainer_kind="megatron" if "megatron" in flags else "fsdp2", after_update=after)
    with open(out, "w") as f:
        json.dump(report, f, default=str)
