"""``weightbridge probe --loader MODULE:FACTORY SPEC --side S --rank R -o OUT.json``.

Probing runs the engine's own loader, so it needs Python code that builds the engine
rank: ``FACTORY(resolved_spec, side, rank)`` (importable from the current directory)
returns either an object with ``load_weights(iterable)`` and ``params()`` /
``destinations()`` (name -> tensor), or a pair ``(load_weights, destinations)``. The
canonical tensors come from the spec's ``model:``. The probed IR is written as JSON with
its layout hash (atomically); ``--check`` also compares it with the spec's expansion of
that rank (exit 1 on a difference, like ``weightbridge diff``).

Exit codes: 0 ok, 1 the probe found numerical changes or (``--check``) a difference,
2 user error (bad spec or arguments, a loader that cannot be imported or raises, an output path
that cannot be written: checked before probing, so nothing is written).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from weightbridge.cli.common import (
    EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError, check_output_path, excerpt, load_rank_or_report, positive_int, show,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="recover one rank's layout IR from an engine's own load_weights")
    p.add_argument("spec", metavar="SPEC", help="spec whose model: gives the canonical tensors")
    p.add_argument(
        "--loader", required=True, metavar="MODULE:FACTORY", help="builds the engine rank (see the module doc)"
    )
    p.add_argument("--side", choices=("trainer", "rollout"), default="rollout")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("-o", "--output", required=True, help="probe JSON to write")
    p.add_argument("--max-probe-bytes", type=positive_int, default=None, help="decode-state bound per probing round")
    p.add_argument("--no-verify", action="store_true", help="skip the verification load")
    p.add_argument("--check", action="store_true", help="also diff against the spec's expansion of this rank")
    p.set_defaults(func=run)


_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _factory(spec: str):
    mod_name, _, attr = spec.partition(":")
    if not _DOTTED.match(mod_name) or not _DOTTED.match(attr) or len(spec) > 500:
        raise ValueError(f"--loader {show(spec)}: expected MODULE:FACTORY (dotted Python names)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"--loader {show(spec)}: cannot import {mod_name}: {excerpt(str(exc))}") from exc
    except Exception as exc:  # the module's own code failed while importing
        raise ValueError(
            f"--loader {show(spec)}: importing {mod_name} raised {type(exc).__name__}: {excerpt(str(exc))}"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--loader {show(spec)}: {mod_name} has no {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--loader {show(spec)}: {attr} is not callable")
    return obj


def run(args: argparse.Namespace) -> int:
    from weightbridge.probe import DEFAULT_MAX_PROBE_BYTES, probe_loader, write_probe_json
    from weightbridge.probe.diff import diff_layouts, format_diff

    output = check_output_path(args.output, "-o")
    loaded = load_rank_or_report(args.spec, args.side, args.rank)
    if loaded is None:
        return EXIT_USAGE
    resolved, want = loaded
    try:
        factory = _factory(args.loader)
    except ValueError as exc:
        print(f"weightbridge probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        built = factory(resolved, args.side, args.rank)
        if isinstance(built, tuple):
            load_weights, destinations = built
        else:
            load_weights = built.load_weights
            destinations = getattr(built, "destinations", None) or built.params
    except Exception as exc:  # the user's factory: its failure is a user error
        raise UsageError(f"--loader {show(args.loader)} failed: {type(exc).__name__}: {excerpt(str(exc))}") from None
    try:
        res = probe_loader(
            resolved.canonical,
            load_weights,
            destinations,
            side=args.side,
            rank=args.rank,
            instance=want.instance,
            local_rank=want.local_rank,
            coords=dict(want.coords),
            max_probe_bytes=args.max_probe_bytes or DEFAULT_MAX_PROBE_BYTES,
            verify=not args.no_verify,
        )
    except Exception as exc:  # probing runs the user's load_weights: what it raises is the loader's
        raise UsageError(
            f"probing with --loader {show(args.loader)} failed: {type(exc).__name__}: {excerpt(str(exc))}"
        ) from None
    try:
        digest = write_probe_json(res, output)
    except OSError as exc:
        raise UsageError(f"-o {excerpt(args.output)}: cannot write: {exc.strerror or exc}") from None
    print(res.summary())
    print(f"wrote {output} (hash {digest})")
    pin_rank = want.local_rank if args.side == "rollout" else args.rank
    print(f"fingerprint {res.fingerprint}; to pin it in the spec: {args.side}: {{pins: {{{pin_rank}: '{res.fingerprint}'}}}}")
    status = EXIT_OK if (res.verified or args.no_verify) and not res.changed else EXIT_FAIL
    if args.check:
        diffs = diff_layouts(res.layout, want)
        if diffs:
            print(f"{len(diffs)} tensor(s) differ from {args.spec}:{args.side}:{args.rank}:")
            print(format_diff(diffs))
            status = EXIT_FAIL
        else:
            print(f"identical to {args.spec}:{args.side}:{args.rank}")
    return status
