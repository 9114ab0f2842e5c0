"""Checks the wheel installed with no extras, as the README's first hour has it (run by .ci/run).

Run with the venv's python, that venv's ``bin/`` first on ``PATH``, from an empty directory::

    python wheel_base_check.py

The venv holds torch and the wheel only: no pytest, no MCP SDK (checked first). Then the README's
```` ```bash wheel ```` block, read from the installed package (``weightbridge.shipped``), runs as
one ``bash -e`` script in an empty directory: every command of the README's table, the demo
(verified bitwise) included, must exit 0. Then ``weightbridge-mcp`` must say how to install the
``mcp`` extra, without a traceback. Standard library only (plus the installed weightbridge).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```bash wheel\n(.*?)^```", re.S | re.M)
TIMEOUT_S = 1200


def fail(msg: str) -> None:
    sys.exit(f"[wheel-base] FAILED {msg}")


def readme_block(text: str) -> str:
    """The README's ```` ```bash wheel ```` block (exactly one)."""
    blocks = BLOCK.findall(text)
    if len(blocks) != 1:
        fail(f"the README has {len(blocks)} ```bash wheel blocks, expected 1")
    return blocks[0]


def main() -> int:
    for extra_only in ("pytest", "mcp"):
        if importlib.util.find_spec(extra_only) is not None:
            fail(f"{extra_only} is importable: this check needs a venv with torch and the wheel only")
    import weightbridge
    from weightbridge import shipped

    if not shipped.installed() or "site-packages" not in Path(weightbridge.__file__).parts:
        fail(f"weightbridge imported from {weightbridge.__file__}, not an installed wheel")
    script = readme_block(shipped.path("README.md").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="wb-wheel-base-") as tmp:
        print(f"[wheel-base] the README's wheel block, in {tmp}:\n{script}", flush=True)
        proc = subprocess.run(["bash", "-e", "-x", "-c", script], cwd=tmp, timeout=TIMEOUT_S)
        if proc.returncode != 0:
            fail(f"the README's wheel block: exit {proc.returncode} (the command traced last failed)")
        exe = shutil.which("weightbridge-mcp", path=str(BIN))
        if exe is None:
            fail(f"no weightbridge-mcp in {BIN}")
        proc = subprocess.run([exe, "--root", tmp], capture_output=True, text=True, timeout=120, cwd=tmp)
        if proc.returncode != 1 or "pip install 'weightbridge-rl[mcp]'" not in proc.stderr or "Traceback" in proc.stderr:
            fail(f"weightbridge-mcp without the mcp extra: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        print(f"[wheel-base] weightbridge-mcp without the extra: {proc.stderr.strip()}")
    print("[wheel-base] all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
