"""The committed JSON Schema matches the models; every example validates (schema + semantics)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from weightbridge.spec.resolve import check_spec
from weightbridge.spec.schema import SCHEMA_ID, default_schema_path, spec_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "spec" / "examples").glob("*.yaml"))


def test_schema_check_passes_on_committed_file() -> None:
    proc = subprocess.run([sys.executable, "-m", "weightbridge", "schema", "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_schema_check_detects_drift(tmp_path: Path) -> None:
    stale = tmp_path / "s.json"
    stale.write_text(default_schema_path().read_text().replace('"sync"', '"synk"', 1))
    proc = subprocess.run(
        [sys.executable, "-m", "weightbridge", "schema", "--check", "--path", str(stale)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "out of date" in proc.stderr


def test_schema_header_and_draft07_friendly() -> None:
    schema = spec_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == SCHEMA_ID == "urn:weightbridge:spec:v1"
    text = json.dumps(schema)
    for keyword in ("$defs", "prefixItems", "unevaluatedProperties", "dependentRequired", "$dynamicRef"):
        assert keyword not in text


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert len(EXAMPLES) >= 6, names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_has_schema_modeline(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert target == default_schema_path().resolve()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates_with_draft07_and_2020_12(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    schema = dict(spec_schema())
    jsonschema.Draft202012Validator(schema).validate(data)
    schema07 = {k: v for k, v in schema.items() if k != "$schema"}
    jsonschema.Draft7Validator(schema07).validate(data)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates_semantically(path: Path) -> None:
    resolved, problems = check_spec(path)
    assert problems == [], "\n".join(map(str, problems))
    assert resolved is not None
    assert resolved.trainer.world_size > 0 and resolved.rollout.world_size > 0
