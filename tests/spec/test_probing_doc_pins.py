"""docs/probing.md tells the truth about pins: its spec blocks validate, pinned fingerprints included."""

from __future__ import annotations

import re
from pathlib import Path

from weightbridge.spec.resolve import check_text

DOC = Path(__file__).resolve().parents[2] / "docs" / "probing.md"


def test_probing_doc_spec_blocks_validate_with_their_pins() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```yaml spec\n(.*?)```", text, flags=re.S)
    assert any("pins:" in b for b in blocks)
    for block in blocks:
        resolved, problems = check_text(block, "docs/probing.md")
        assert problems == [], "\n".join(map(str, problems))
        assert resolved is not None
    assert "cannot pin" not in text
