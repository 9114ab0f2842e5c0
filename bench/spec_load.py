"""Spec resolution time, what one rank pays in ``from_spec`` before planning: cold and warm, per pass.

    python bench/spec_load.py                          # the DeepSeek-V3 example, 3 runs of each
    python bench/spec_load.py --spec PATH --runs 5 --json

Every run is a fresh interpreter pinned to one CPU core that imports the spec layer and calls
``load_spec`` (what ``TrainerBridge.from_spec`` / ``RolloutBridge.from_spec`` call). ``cold``: an
empty canonical-model cache (``WEIGHTBRIDGE_CACHE_DIR`` in a new temporary directory), as on a
fresh machine; ``warm``: the cache one earlier run filled. Reported per run: the import, the
resolve, and where the resolve went (passes of :mod:`weightbridge.spec.resolve`; expansion split
into the expander's setup, rule compilation and per-rank expansion; tiling, coverage; ``other``:
YAML, the validated spec and its hash, pins). Wall seconds; read the split, not the absolutes, on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = ROOT / "spec" / "examples" / "deepseek-v3_megatron-pp16ep16_to_vllm-tp8ep8x16.yaml"
PASSES = ("schema", "models", "canonical", "expander setup", "compile rules", "expand ranks", "tiling",
          "coverage", "other")


def _child(spec: str) -> None:
    """One run: time the import and every pass of ``load_spec`` (printed as one JSON line)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    from weightbridge.layout import expand
    from weightbridge.spec import resolve, sides
    imported = time.perf_counter() - t0
    spent: dict[str, float] = defaultdict(float)

    def timed(owner, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            ts = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - ts

        setattr(owner, attr, wrapper)

    timed(resolve, "_schema_pass", "schema")
    timed(resolve, "_model_pass", "models")
    timed(resolve, "_canonical_pass", "canonical")
    timed(expand._Expander, "__init__", "expander setup")
    timed(expand._Expander, "compile_rules", "compile rules")
    timed(expand._Expander, "expand_rank", "expand ranks")
    timed(sides, "tiling_problems", "tiling")
    timed(sides, "uncovered", "coverage")
    ts = time.perf_counter()
    resolved = resolve.load_spec(spec)
    total = time.perf_counter() - ts
    spent["other"] = total - sum(spent.values())  # YAML, the validated spec and its hash, pins
    print(json.dumps({"import": imported, "resolve": total, "passes": dict(spent),
                      "ranks": [resolved.trainer.world_size, resolved.rollout.world_size]}))


def _run(spec: str, cache: str) -> dict:
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env,
                         timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"spec_load child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(DEFAULT_SPEC))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return 0
    rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="wb-spec-load-") as tmp:
        warm_cache = os.path.join(tmp, "warm")
        _run(args.spec, warm_cache)  # fills the warm cache
        for i in range(args.runs):  # alternate, so both see the same machine
            rows["cold"].append(_run(args.spec, os.path.join(tmp, f"cold{i}")))
            rows["warm"].append(_run(args.spec, warm_cache))
    if args.json:
        print(json.dumps({"spec": args.spec, **rows}, indent=2))
        return 0
    ranks = rows["warm"][0]["ranks"]
    print(f"load_spec({Path(args.spec).name}): {ranks[0]} trainer + {ranks[1]} rollout ranks, "
          f"{args.runs} fresh processes each, one core, wall seconds (median [min-max])")
    for kind, runs in rows.items():
        def cell(values: list[float]) -> str:
            return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

        print(f"  {kind:5s} import {cell([r['import'] for r in runs])}  resolve {cell([r['resolve'] for r in runs])}")
        split = "  ".join(f"{p} {statistics.median([r['passes'].get(p, 0.0) for r in runs]):.2f}" for p in PASSES)
        print(f"        {split}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
