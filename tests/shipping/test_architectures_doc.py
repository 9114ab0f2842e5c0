"""``docs/architectures.md``'s table matches the architecture zoo and the presets.

Every zoo architecture (``weightbridge.testing._internal.zoo_models.ARCHS``) is a row with its
transformers ``model_type``; a TP column says "bitwise (R)" or "fails (R)" exactly for the TPs the
zoo runs it at, ``R`` naming a run the doc's "Runs" list records (date and commit); the CI column says which TPs
every CI run checks exactly as ``zoo_ci.always`` picks them (on CI's host, which has no AMX) and
"rotation" for the others; the rules column counts its spec rules per side ("none" when it has
none); the ``vllm`` and ``fsdp2`` presets' ``checked_against`` name exactly the rows verified on
vLLM. Pure: no engine, no torch.
"""

from __future__ import annotations

import re

from weightbridge import shipped
from weightbridge.layout.presets import load_preset
from weightbridge.testing._internal.zoo_ci import always
from weightbridge.testing._internal.zoo_models import ARCHS


def _text() -> str:
    return shipped.path("docs/architectures.md").read_text()


def _runs() -> set[str]:
    """The labels of the "Runs" list: ``* **(A)** date, commit ...``."""
    section = _text().split("\n## Runs\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\* \*\*\(([A-Z])\)\*\* 20\d\d-\d\d-\d\d, `[0-9a-f]{7,}`", section, re.M))


def _rows() -> dict[str, dict[str, str]]:
    text = _text()
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


def test_tp_columns_say_bitwise_exactly_where_the_zoo_runs_and_name_a_recorded_run() -> None:
    runs = _runs()
    assert runs, "docs/architectures.md has no recorded run"
    for name, row in _rows().items():
        for tp in (1, 2):
            cell = row[f"vLLM TP {tp}"]
            m = re.fullmatch(r"(?:bitwise|fails) \(([A-Z])\)", cell)
            assert bool(m) == (tp in ARCHS[name].tps), (name, tp, cell)
            assert not m or m.group(1) in runs, (name, tp, cell, runs)


def test_ci_column_says_what_every_ci_run_checks() -> None:
    every_run: dict[str, list[int]] = {}
    for case in always(host_has_amx=False):  # CI's host has no AMX tiles
        every_run.setdefault(case.arch, [])
        if case.tp not in every_run[case.arch]:
            every_run[case.arch].append(case.tp)
    for name, row in _rows().items():
        want = f"every run: TP {', TP '.join(map(str, sorted(every_run[name])))}" if name in every_run else "rotation"
        assert row["CI"] == want, (name, row["CI"], want)


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
    verified = {n for n, row in _rows().items() if row["vLLM TP 1"].startswith("bitwise")
                or row["vLLM TP 2"].startswith("bitwise")}
    assert set(load_preset("vllm").checked_against) == verified
    assert set(load_preset("fsdp2").checked_against) == set(ARCHS)
    for name in ("megatron", "sglang"):
        assert load_preset(name).checked_against, name
