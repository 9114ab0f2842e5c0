"""``weightbridge-mcp`` without the ``mcp`` extra says how to install it, with no traceback (issue 26: a
wheel installed without extras printed a raw ImportError traceback)."""

from __future__ import annotations

import subprocess
import sys

# The SDK refused at import, as in an environment without the extra (phase 1 of CI has none anyway).
WITHOUT_MCP = r"""
import sys
class RefuseMcp:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mcp":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, RefuseMcp())
from mcp_server.launch import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_console_script_without_the_sdk_prints_the_install_hint() -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MCP, "--root", "."], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "pip install 'weightbridge-rl[mcp]'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and proc.stdout == ""
