"""Soak and hostile-client campaign of issue 13 (the harness is ``weightbridge.testing._internal.soak`` / ``.hostile``).

    python bench/soak.py --trials 52 --seed 1 --modes sync,async --json out.json
    python bench/soak.py --trials 0 --hostile --modes sync          # hostile-client mode only

This process is the harness parent: it hosts the control store (or starts ``weightbridge store`` when
that command exists; ``--store``), launches each trial's job (2 trainer ranks, 2 one-rank rollout
instances, a victim killed with SIGKILL at its phase and restarted), prints one progress line per
trial on stderr and the per-cell table on stdout. ``--trials N`` cycles through a seeded shuffle of
every (mode x staging/in-place x victim x phase) cell: 52 cells for both modes (victim ``store-host``:
trainer 0 hosting the store, killed mid-transfer; its bar is that every survivor raises in time). Exit status 0 when
every cell (and hostile step) meets the issue's bar, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from weightbridge.testing._internal import hostile as H
from weightbridge.testing._internal import soak as S


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=52, help="kill trials (cycling through the cells; default 52, every cell once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="sync,async", help="comma-separated: sync,async")
    p.add_argument("--victims", default=",".join(S.VICTIMS), help="comma-separated subset of " + ",".join(S.VICTIMS))
    p.add_argument("--phases", default=",".join(S.PHASES), help="comma-separated subset of " + ",".join(S.PHASES))
    p.add_argument("--timeout-s", type=float, default=4.0, help="the job's sync.timeout_s (default 4)")
    p.add_argument("--slack-s", type=float, default=2.0, help="allowed raise latency over timeout_s (default 2)")
    p.add_argument("--store", choices=["auto", "parent", "cli"], default="auto",
                   help="who hosts the control store: this process, or a `weightbridge store` process (auto: cli if it exists)")
    p.add_argument("--hostile", action="store_true", help="also run the hostile-client steps (per mode)")
    p.add_argument("--hostile-all", action="store_true", help="every garbage kind under every key (else one kind per key)")
    p.add_argument("--hostile-limit", type=int, default=None, help="at most this many garbage steps per mode")
    p.add_argument("--hostile-budget-s", type=float, default=None, help="stop starting hostile jobs after this long")
    p.add_argument("--json", default=None, help="write every trial's details and the tables here")
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    cells = S.all_cells(modes, victims=a.victims.split(","), phases=a.phases.split(","))
    trials = S.run_soak(a.trials, a.seed, cells=cells, timeout_s=a.timeout_s, store_kind=a.store, progress=log) \
        if a.trials else []
    rows = S.summarize(trials)
    ok = S.passed(rows, a.slack_s)
    report: dict = {"config": vars(a), "trials": trials, "cells": rows}
    if rows:
        print(f"soak: {len(trials)} trials, timeout_s {a.timeout_s}, store {trials[0]['store']}, {time.time() - t0:.0f}s")
        print(S.format_table(rows))
    if a.hostile:
        res = H.run_hostile(a.seed, modes=modes, all_kinds=a.hostile_all, timeout_s=a.timeout_s, store_kind=a.store,
                            limit=a.hostile_limit, budget_s=a.hostile_budget_s, progress=log)
        hrows = H.summarize_hostile(res)
        ok = ok and H.hostile_passed(hrows) and not res["not_run"]
        report["hostile"] = {**res, "rows": hrows}
        print(f"\nhostile: {len(res['steps'])} steps, store {res['store']}"
              + (f", {res['not_run']} not run (budget)" if res["not_run"] else "")
              + (f"; keys not covered: {', '.join(res['uncovered'])}" if res["uncovered"] else ""))
        print(H.format_hostile(hrows))
    report["passed"] = ok
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"\n{'PASSED' if ok else 'FAILED'}: the issue's bar (0 hangs, 0 untyped, 0 wrong, 0 early, "
          f"latency <= timeout_s + {a.slack_s:g}s, all healed){' and the hostile steps' if a.hostile else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
