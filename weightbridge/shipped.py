"""Files that ship with weightbridge: example specs, the spec schema, guides, docs, examples, engine benchmarks.

Their one source is the repository root (``spec/``, ``integration_guides/``, ``docs/``,
``examples/``, ``LICENSE``, ...). A built wheel carries a copy under ``weightbridge/_shipped/``
(``setup.py`` copies them at build time), so an installed package and a source checkout answer
the same relative paths. Pure: no torch, no process group; any process may call it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

#: What ships, as (directory relative to the repository root, glob patterns inside it).
#: ``setup.py`` reads this table to copy the files into the wheel; tests check both views agree.
SHIPPED: tuple[tuple[str, tuple[str, ...]], ...] = (
    (".", ("README.md", "LICENSE", "AGENTS.md", "llms.txt")),
    ("spec", ("README.md", "schema/*.json", "schema/CHANGELOG.md", "examples/*.yaml")),
    ("integration_guides", ("*.md",)),
    ("docs", ("*.md", "*.png")),
    ("examples", ("README.md", "toy_integration/*.md", "toy_integration/*.py", "toy_integration/*.yaml",
                  "toy_integration/toyrl/*.py", "ray_rl/*.md", "ray_rl/*.py",
                  "engine_suites/*.md", "engine_suites/*.py", "engine_suites/*/*.py",
                  "engine_suites/*/*.yaml", "engine_suites/*/*.json")),
    ("bench", ("vllm_update.py", "sglang_update.py")),  # the engine benchmarks the guides tell users to run
)


class ShippedFileMissing(FileNotFoundError):
    """A file that should ship with weightbridge is not there (a broken install or checkout)."""


def root() -> Path:
    """The directory holding the shipped files: ``weightbridge/_shipped`` of an installed wheel,
    else the source checkout this package was imported from."""
    inside = _PACKAGE / "_shipped"
    if inside.is_dir():
        return inside
    return _PACKAGE.parent


def installed() -> bool:
    """True when running from an installed wheel (the shipped files are read-only package data)."""
    return (_PACKAGE / "_shipped").is_dir()


def path(rel: str) -> Path:
    """Absolute path of a shipped file or directory, e.g. ``path("spec/examples")``."""
    p = root() / rel
    if not p.exists():
        raise ShippedFileMissing(f"{rel} is not in this weightbridge installation ({root()})")
    return p


def files(rel_dir: str = ".") -> list[str]:
    """Every shipped file under ``rel_dir``, as sorted paths relative to :func:`root`."""
    base = root()
    out: set[str] = set()
    for d, patterns in SHIPPED:
        for pat in patterns:
            for p in (base / d).glob(pat):
                if p.is_file():
                    rel = p.relative_to(base).as_posix()
                    if rel_dir in (".", "") or rel == rel_dir or rel.startswith(rel_dir.rstrip("/") + "/"):
                        out.add(rel)
    return sorted(out)


def example_specs() -> dict[str, Path]:
    """The reference specs (``spec/examples/*.yaml``) by name (file stem)."""
    return {Path(rel).stem: root() / rel for rel in files("spec/examples")}


def copy_out(rel_dir: str, dest: Path) -> list[Path]:
    """Copy the shipped files under ``rel_dir`` into ``dest`` (keeping their layout below
    ``rel_dir``); refuses to overwrite. Returns the written paths."""
    names = files(rel_dir)
    if not names:
        raise ShippedFileMissing(f"nothing ships under {rel_dir!r}")
    base = root() / rel_dir
    plan = []
    for rel in names:
        src = root() / rel
        target = dest / src.relative_to(base) if src != base else dest / src.name
        if target.exists():
            raise FileExistsError(f"{target} exists; not overwriting")
        plan.append((src, target))
    written = []
    for src, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        written.append(target)
    return written
