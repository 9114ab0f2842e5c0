"""The import rules docs/architecture.md states, checked against the code.

* ``spec/``, ``layout/`` and ``plan/`` import no torch (tests/layout_core/test_pure_core.py);
* exactly the modules the document names import ``torch.distributed`` (this file);
* no import cycles, and ``mcp_server`` imports no CLI internals (test_import_graph.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import weightbridge

ROOT = Path(weightbridge.__file__).resolve().parent
DOC = ROOT.parent / "docs" / "architecture.md"
IMPORTS_DIST = re.compile(r"^\s*(import torch\.distributed|from torch\.distributed|from torch import distributed)", re.M)

# The list docs/architecture.md gives, in its words ("import `torch.distributed`: ...").
DIST_MODULES = {"transport/store.py", "transport/store_client.py", "transport/group.py", "probe/dtensor.py",
                "testing/contract.py", "demo/fsdp2.py", "integrations/megatron/cpu_trainer.py",
                "testing/_internal/wire_tamper.py", "_torch_compat.py", "testing/_internal/gpu_stages.py"}


def test_exactly_the_named_modules_import_torch_distributed() -> None:
    found = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if IMPORTS_DIST.search(p.read_text())}
    assert found == DIST_MODULES
    mcp = ROOT.parent / "mcp_server"
    assert not [p.name for p in mcp.glob("*.py") if IMPORTS_DIST.search(p.read_text())]


def test_the_document_names_the_same_modules() -> None:
    text = DOC.read_text()
    [line] = [para for para in text.split("\n\n") if "import `torch.distributed`" in para]
    named = set(re.findall(r"`([a-z0-9_/]+\.py)`", line))
    assert named == DIST_MODULES, line
