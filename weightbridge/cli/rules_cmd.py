"""``weightbridge rules SPEC --side S PROBE.json [PROBE.json ...] [--json]``.

Writes the spec rules that make one side's expansion equal its probe files, where the side's
preset has none (:func:`weightbridge.ops.rules_from_probe.rules_from_probes`): one probe JSON per
rank of one instance (``weightbridge probe -o``, or the file a vLLM engine names when it refuses a
spec). Prints YAML to add under the side's ``rules:``; tensors the rule vocabulary cannot say are
listed on stderr. The rules are checked by expanding the spec with them and diffing every rank
against its probe.

Exit codes: 0 the spec with these rules expands to every probe, 1 differences remain (printed),
2 user error (bad spec, unreadable probe, wrong number of probes).
"""

from __future__ import annotations

import argparse
import sys

from weightbridge.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, PATH_MAX, UsageError, excerpt, load_or_report, print_json

MAX_PROBES = 4096


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rules", help="write the spec rules that make a side expand to its probe files")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("probes", metavar="PROBE.json", nargs="+", help="one probe JSON per rank of one instance")
    p.add_argument("--side", choices=("trainer", "rollout"), default="rollout")
    p.add_argument("--instance", type=int, default=0, help="the rollout instance the probes are of")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from weightbridge.ops.rules_from_probe import rules_from_probes
    from weightbridge.probe.diff import SourceError, load_source

    if len(args.probes) > MAX_PROBES:
        raise UsageError(f"{len(args.probes):,} probe files; at most {MAX_PROBES:,} (one per rank of one instance)")
    if load_or_report(args.spec) is None:
        return EXIT_USAGE
    probes = []
    for path in args.probes:
        if len(path) > PATH_MAX or "\0" in path or not path.endswith(".json"):
            raise UsageError(f"{excerpt(path)}: expected a probe .json file")
        try:
            probes.append(load_source(path))
        except SourceError as exc:
            raise UsageError(excerpt(str(exc), 600)) from None
        except OSError as exc:
            raise UsageError(f"cannot read {excerpt(path)}: {exc.strerror or exc}") from None
        except RecursionError:
            raise UsageError(f"{excerpt(path)}: nested too deeply to be a layout JSON") from None
    try:
        found = rules_from_probes(args.spec, args.side, probes, instance=args.instance)
    except ValueError as exc:
        raise UsageError(excerpt(str(exc), 600)) from None
    if args.json:
        print_json({"rules": found.rules, "unexplained": [list(u) for u in found.unexplained],
                    "remaining": found.remaining, "ok": found.ok})
    else:
        print(f"# {args.side} rules for {args.spec} from {len(probes)} probe(s); add them under {args.side}: rules:")
        sys.stdout.write(found.yaml())
        for name, why in found.unexplained:
            print(f"not expressible as a rule: {name}: {why}", file=sys.stderr)
        if found.ok:
            print(f"# checked: the spec with these rules expands to every probe", file=sys.stdout)
        else:
            print("still different after adding them:\n" + "\n".join(found.remaining), file=sys.stderr)
    return EXIT_OK if found.ok else EXIT_FAIL
