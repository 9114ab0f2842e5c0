"""Checks the wheel installed with its ``mcp`` extra the way an agent meets it (run by .ci/run).

Run with the wheel's venv python from an empty directory (no checkout on sys.path):

    python wheel_check.py --expect-resources resources.json

and once with a checkout environment's python (with the ``mcp`` extra) to record what the checkout serves:

    python .ci/wheel_check.py --write-resources resources.json

Checks: the MCP server (stdio, real SDK client) listing the same resources as the checkout (names and
count), every listed resource readable, and ``run_conformance`` passing on the shipped toy integration
copied out with ``weightbridge examples toy_integration --copy``. Exits non-zero on the first failure.
The wheel without extras (every README command, the demo) is ``.ci/wheel_base_check.py``'s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

BIN = Path(sys.executable).parent


def step(title: str, argv: list[str], timeout: float = 300, **kw) -> str:
    print(f"[wheel] {title}: {' '.join(argv)}", flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        sys.exit(f"[wheel] FAILED {title} (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


async def _mcp(root: Path, toy: Path | None) -> tuple[list[str], dict | None]:
    exe = shutil.which("weightbridge-mcp", path=str(BIN))
    params = StdioServerParameters(command=exe, args=["--root", str(root)], cwd=str(root))
    with anyio.fail_after(900):
        async with Client(params, mode="auto", read_timeout_seconds=900) as c:
            resources = (await c.list_resources()).resources
            names = sorted(str(r.uri) for r in resources)
            for r in resources:
                got = await c.read_resource(r.uri)
                if not got.contents:
                    sys.exit(f"[wheel] FAILED resource {r.uri}: empty")
            result = None
            if toy is not None:
                res = await c.call_tool("run_conformance", {"tests": [str(toy)], "timeout_s": 800})
                if res.is_error:
                    sys.exit(f"[wheel] FAILED run_conformance: {res.content[0].text[:3000]}")
                result = res.structured_content
            return names, result


def main() -> int:
    p = argparse.ArgumentParser()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-resources", type=Path)
    g.add_argument("--expect-resources", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="wb-wheel-") as tmp:
        root = Path(tmp)
        if args.write_resources:
            names, _ = anyio.run(_mcp, root, None)
            args.write_resources.write_text(json.dumps(names, indent=1) + "\n")
            print(f"[wheel] the checkout serves {len(names)} resources")
            return 0
        wb = str(BIN / "weightbridge")
        import weightbridge

        if "site-packages" not in Path(weightbridge.__file__).parts:
            sys.exit(f"[wheel] FAILED: weightbridge imported from {weightbridge.__file__}, not an installed wheel")
        step("copy the toy integration", [wb, "examples", "toy_integration", "--copy", str(root)], cwd=root)
        names, result = anyio.run(_mcp, root, root / "toy_integration")
        expected = json.loads(args.expect_resources.read_text())
        if names != expected:
            sys.exit(f"[wheel] FAILED: the wheel serves {len(names)} resources, the checkout {len(expected)}:\n"
                     f"missing {sorted(set(expected) - set(names))}\nextra {sorted(set(names) - set(expected))}")
        print(f"[wheel] MCP resources: {len(names)}, same names as the checkout")
        if not result["passed"] or result["counts"]["passed"] == 0:
            sys.exit(f"[wheel] FAILED run_conformance on the toy integration: {json.dumps(result)[:3000]}")
        print(f"[wheel] run_conformance on the shipped toy integration: {result['counts']}")
    print("[wheel] all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
