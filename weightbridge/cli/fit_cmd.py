"""``weightbridge fit SPEC --side S --probe RANK=PROBE.json ... [-o OUT]``: a spec fitted to live ranks.

Each ``--probe`` is ``weightbridge probe ... -o`` output (or any ``RankLayout`` JSON, e.g. DTensor or
Megatron introspection) of one rank of that side (rollout: local rank within an instance). The
spec's preset facts that reproduce every observed rank are chosen (Megatron layer spec, expert MLP
and etp; FSDP2 fused experts; SGLang CPU padding: :mod:`weightbridge.ops.live_fit`) and the ranks'
fingerprints pinned; the result passes ``weightbridge probe --check`` against the same processes.
Prints the fitted spec (or writes ``-o``) and, on stderr, one line per decided fact.

Exit codes: 0 fitted, 1 no variant reproduces the observations (the nearest difference is shown),
2 user error (bad spec, unreadable probe, output path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weightbridge.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    check_output_path,
    excerpt,
    load_or_report,
    show,
)

MAX_SPEC_CHARS = 1 << 20
MAX_PROBE_BYTES = 64 << 20  # a probe JSON lists one rank's pieces


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit a spec's preset facts to probed live ranks and pin them")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--side", choices=("trainer", "rollout"), required=True)
    p.add_argument("--probe", action="append", required=True, metavar="RANK=PROBE.json",
                   help="one observed rank (repeat for each rank probed)")
    p.add_argument("-o", "--output", help="write the fitted spec here instead of printing it")
    p.set_defaults(func=run)


def _observed(values: list[str]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for value in values:
        rank, sep, path = value.partition("=")
        if not sep or not rank.isdigit() or not path or len(rank) > 7:
            raise UsageError(f"--probe {show(value)}: expected RANK=PROBE.json")
        out[int(rank)] = Path(path)
    return out


def run(args: argparse.Namespace) -> int:
    from weightbridge.ops.live_fit import FitError, fit_side
    from weightbridge.probe import read_probe_json

    output = check_output_path(args.output, "-o") if args.output else None
    try:
        text = Path(args.spec).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{excerpt(args.spec)}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if len(text) > MAX_SPEC_CHARS:
        raise UsageError(f"{excerpt(args.spec)}: {len(text)} characters is not a spec")
    observed = {}
    for rank, path in sorted(_observed(args.probe).items()):
        try:
            if path.stat().st_size > MAX_PROBE_BYTES:
                raise ValueError(f"{path.stat().st_size} bytes is too large for a probe (at most {MAX_PROBE_BYTES})")
            observed[rank] = read_probe_json(path)
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # deep JSON: recursion
            raise UsageError(f"--probe {rank}={excerpt(str(path))}: not a probe JSON ({excerpt(str(exc))})") from None
    if load_or_report(args.spec) is None:  # every problem printed, as validate prints them
        return EXIT_USAGE
    try:
        fit = fit_side(text, args.side, observed, base_dir=Path(args.spec).resolve().parent)
    except FitError as exc:
        print(f"weightbridge fit: {exc}", file=sys.stderr)
        return EXIT_FAIL
    for note in fit.notes:
        print(f"fitted: {note}", file=sys.stderr)
    if output is None:
        sys.stdout.write(fit.text)
    else:
        output.write_text(fit.text)
        print(output)
    return EXIT_OK
