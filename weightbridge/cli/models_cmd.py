"""``weightbridge models [NAME_OR_PATH] [--json]``: list bundled models or summarise one.

Without an argument: one row per bundled config (params and totals). With one:
the canonical tensors of a bundled name, a HF ``config.json`` (or a directory
holding one) or a safetensors checkpoint (file, index, or directory holding
``*.safetensors`` — preferred over its config.json), grouped by name pattern.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from weightbridge.canonical import CanonicalSourceError, bundled_names, load_canonical
from weightbridge.canonical.describe import human_bytes, human_count, summarize
from weightbridge.cli.common import check_path_arg
from weightbridge.ops.models import source_for


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "models", help="list bundled models, or show a model's canonical tensors", description=__doc__
    )
    p.add_argument("model", nargs="?", metavar="NAME_OR_PATH", help="bundled name, config.json, or checkpoint path")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--dtype", default=None, help="override the model's default floating dtype")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.model is not None:
        check_path_arg(args.model, "NAME_OR_PATH")
    try:
        if args.model is None:
            return _list(args)
        summary = summarize(load_canonical(source_for(args.model, args.dtype), Path.cwd()))
    except CanonicalSourceError as exc:
        print(f"weightbridge models: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = []
    for name in bundled_names():
        s = summarize(load_canonical(source_for(name, args.dtype), Path.cwd()))
        rows.append({"name": name, "params": s["params"], "totals": s["totals"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title="bundled models")
    for col in ("name", "type", "layers", "hidden", "heads/kv", "experts", "tensors", "parameters", "bytes"):
        table.add_column(col, justify="left" if col in ("name", "type") else "right")
    for r in rows:
        p, t = r["params"], r["totals"]
        experts = p.get("num_experts", 0)
        exp_txt = f"{experts}+{p.get('num_shared_experts', 0)}s" if experts else "-"
        table.add_row(
            r["name"],
            str(p.get("model_type", "?")),
            str(p.get("num_layers", "?")),
            str(p.get("hidden_size", "?")),
            f"{p.get('num_heads', '?')}/{p.get('num_kv_heads', '?')}",
            exp_txt,
            f"{t['tensors']:,}",
            human_count(t["numel"]),
            human_bytes(t["bytes"]),
        )
    _console().print(table)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    console = _console()
    console.print(f"[bold]{summary['source']}[/bold]")
    console.print(", ".join(f"{k}={v}" for k, v in summary["params"].items()))
    table = Table()
    for col in ("pattern", "count", "shape", "dtype", "bytes"):
        table.add_column(col, justify="right" if col in ("count", "bytes") else "left")
    for g in summary["groups"]:
        shapes = " | ".join(str(s) for s in g["shapes"])
        table.add_row(g["pattern"], str(g["count"]), shapes, ",".join(g["dtypes"]), human_bytes(g["bytes"]))
    console.print(table)
    t = summary["totals"]
    dtypes = ", ".join(f"{d}: {v['tensors']:,} tensors" for d, v in t["by_dtype"].items())
    console.print(
        f"total: {t['tensors']:,} tensors, {human_count(t['numel'])} parameters, {human_bytes(t['bytes'])} ({dtypes})"
    )


def _console() -> Any:
    """A rich console; wide when not on a terminal so piped tables are not truncated."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)
