"""``docs/architectures.md``'s table matches the architecture zoo and the presets.

Every zoo architecture (``weightbridge.testing._internal.zoo_models.ARCHS``) is a row with its
transformers ``model_type``; a TP column says "bitwise" exactly for the TPs the zoo runs it at; the
rules column counts its spec rules per side ("none" when it has none); the ``vllm`` and ``fsdp2``
presets' ``checked_against`` name exactly the rows verified on vLLM. Pure: no engine, no torch.
"""

from __future__ import annotations

import re

from weightbridge import shipped
from weightbridge.layout.presets import load_preset
from weightbridge.testing._internal.zoo_models import ARCHS


def _rows() -> dict[str, dict[str, str]]:
    text = shipped.path("docs/architectures.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) == len(header) and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_every_zoo_architecture_is_a_row_with_its_model_type() -> None:
    rows = _rows()
    assert sorted(rows) == sorted(ARCHS)
    for name, arch in ARCHS.items():
        assert rows[name]["`model_type`"] == f"`{arch.model_type}`", name


def test_tp_columns_say_bitwise_exactly_where_the_zoo_runs() -> None:
    for name, row in _rows().items():
        for tp in (1, 2):
            cell = row[f"vLLM TP {tp}"]
            assert (cell == "bitwise") == (tp in ARCHS[name].tps), (name, tp, cell)


def test_rules_column_counts_the_zoo_rules() -> None:
    for name, row in _rows().items():
        arch = ARCHS[name]
        cell = row["rules beyond the presets"]
        if not arch.rollout_rules and not arch.trainer_rules:
            assert cell == "none", (name, cell)
            continue
        for side, rules in (("rollout", arch.rollout_rules), ("trainer", arch.trainer_rules)):
            m = re.search(rf"{side}: (\d+)", cell)
            assert (int(m.group(1)) if m else 0) == len(rules), (name, side, cell)


def test_presets_say_what_they_were_checked_against() -> None:
    verified = {n for n, row in _rows().items() if "bitwise" in (row["vLLM TP 1"], row["vLLM TP 2"])}
    assert set(load_preset("vllm").checked_against) == verified
    assert set(load_preset("fsdp2").checked_against) == set(ARCHS)
    for name in ("megatron", "sglang"):
        assert load_preset(name).checked_against, name
