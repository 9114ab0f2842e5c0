"""The JSON Schema of spec v1, generated from :mod:`weightbridge.spec.models`.

Committed as ``spec/schema/weightbridge.v1.schema.json`` (shipped in the wheel, see
:mod:`weightbridge.shipped`); ``weightbridge schema
--check`` fails when the committed file drifts from the models. Definitions live
under ``definitions`` (not ``$defs``) and no tuple keywords are used, so draft-07
editors read it too.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from weightbridge.spec.models import SPEC_VERSION, Spec

SCHEMA_ID = f"urn:weightbridge:spec:v{SPEC_VERSION}"
SCHEMA_FILENAME = f"weightbridge.v{SPEC_VERSION}.schema.json"


@cache
def spec_schema() -> dict[str, Any]:
    raw = Spec.model_json_schema(ref_template="#/definitions/{model}")
    defs = raw.pop("$defs", {})
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "weightbridge spec v1",
    }
    out.update(raw)
    out["definitions"] = defs
    return out


def schema_text() -> str:
    return json.dumps(spec_schema(), indent=2, sort_keys=False) + "\n"


def default_schema_path() -> Path:
    """``spec/schema/<file>`` as shipped: in the source checkout, or the wheel's read-only copy."""
    from weightbridge import shipped

    return shipped.root() / "spec" / "schema" / SCHEMA_FILENAME
