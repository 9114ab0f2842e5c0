"""Code blocks of the integration guides, AGENTS.md and the examples' READMEs.

Fences: ```python run / ```bash run are executed here (from the repository root); ```python norun /
```bash norun are explicitly not runnable here (they need an engine, a GPU or a framework that is not
installed); an unmarked python/bash block is an error. ```yaml spec blocks must validate as specs.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from wbconf_pytest import REPO

WRITTEN_BY_OTHERS = {"mcp.md"}  # its authors mark its blocks; linked from the README
DOCS = sorted([*(p for p in (REPO / "integration_guides").glob("*.md") if p.name not in WRITTEN_BY_OTHERS),
               REPO / "AGENTS.md", REPO / "examples" / "README.md", *(REPO / "examples").glob("*/README.md")])
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
CODE = ("python", "bash", "sh")


def blocks():
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield doc, line, m.group(1), m.group(2).split(), m.group(3)


def _ids(kind: str, lang: tuple[str, ...]):
    found = [(f"{d.relative_to(REPO)}:{n}", lang_, body) for d, n, lang_, words, body in blocks()
             if lang_ in lang and kind in words]
    return pytest.mark.parametrize("where,lang,body", found, ids=[f[0] for f in found])


def test_every_python_and_bash_block_is_marked_run_or_norun():
    bad = [f"{d.relative_to(REPO)}:{n}: ```{lang} {' '.join(w)}" for d, n, lang, w, _ in blocks()
           if lang in CODE and ("run" in w) == ("norun" in w)]
    assert bad == []
    assert sum(1 for _, _, lang, w, _ in blocks() if lang in CODE and "run" in w) >= 5


@_ids("run", CODE)
def test_runnable_blocks_run(where, lang, body, tmp_path):
    cmd = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euo", "pipefail", "-c", body]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@_ids("spec", ("yaml",))
def test_spec_blocks_validate(where, lang, body):
    from weightbridge.spec.resolve import check_text

    resolved, problems = check_text(body, where, base_dir=REPO)
    assert problems == [] and resolved is not None, "\n".join(map(str, problems))


def test_relative_links_resolve():
    missing = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(REPO)} -> {target}")
    assert missing == []
