"""``weightbridge presets [NAME] [--json]``: the presets, their mesh axes and the local tensors they produce."""

from __future__ import annotations

import argparse
import sys

from weightbridge.cli.common import EXIT_OK, EXIT_USAGE, print_json
from weightbridge.layout.presets import PRESET_NAMES, Preset, load_preset


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list framework presets, or show one preset's rules")
    p.add_argument("name", nargs="?", choices=PRESET_NAMES)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _rule_lines(preset: Preset) -> list[dict[str, object]]:
    out = []
    for r in preset.rules:
        parts = [p.canonical for p in r.parts()]
        kind = "concat" if r.concat else "interleave" if r.interleave else "stack" if r.stack else "single"
        if r.stack:
            kind = "stack+" + ("concat" if r.concat else "single")
        out.append({"local": r.local, "kind": kind, "canonical": parts, "when": r.when, "dtype": r.dtype})
    return out


def run(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list(PRESET_NAMES)
    presets = [load_preset(n) for n in names]
    if args.json:
        print_json(
            [
                {
                    "name": p.name,
                    "family": p.family.name,
                    "mesh_axes": list(p.family.user_axes) + [a for a, _ in p.family.defaults],
                    "params": p.params,
                    "doc": p.doc,
                    "checked_against": p.checked_against,
                    "rules": _rule_lines(p) if args.name else len(p.rules),
                }
                for p in presets
            ]
        )
        return EXIT_OK
    from rich.console import Console
    from rich.markup import escape

    console = Console(soft_wrap=True, highlight=False)
    for p in presets:
        axes = ", ".join(list(p.family.user_axes) + [a for a, _ in p.family.defaults])
        console.print(f"[bold]{p.name}[/] (mesh axes: {axes}; params: {p.params or '-'})")
        console.print(f"  {escape(p.doc)}")
        if p.checked_against:
            console.print(f"  [dim]checked against: {escape(', '.join(p.checked_against))}[/]")
            if args.name:
                for arch, how in p.checked_against.items():
                    console.print(f"    {escape(arch)}: {escape(how)}")
        if args.name:
            for r in _rule_lines(p):
                src = " + ".join(str(c) for c in r["canonical"])  # type: ignore[union-attr]
                extra = f"  [dim]when {r['when']}[/]" if r["when"] else ""
                console.print(f"  {escape(str(r['local']))}  <- {escape('[' + str(r['kind']) + ']')} {escape(src)}{extra}")
        console.print()
    if not presets:
        print("no presets", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
