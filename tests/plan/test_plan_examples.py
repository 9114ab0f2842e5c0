"""Every example spec: resolved, planned, validated, measured; and the ``weightbridge plan`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "spec" / "examples").glob("*.yaml"))
TINY = ROOT / "spec" / "examples" / "tiny_fsdp2_to_vllm.yaml"  # the command tests' spec (renamed: they fail)
resolve = pytest.importorskip("weightbridge.spec.resolve")

from weightbridge.plan import build_plan, network_model, plan_metrics, validate_plan  # noqa: E402
from weightbridge.plan.render import BALANCE_LIMIT, balance_reason  # noqa: E402

SLOW = ("deepseek",)
JSON_KEYS = {
    "plan_hash", "num_rounds", "wire_bytes", "min_wire_bytes", "max_sender_bytes", "mean_sender_bytes",
    "max_receiver_bytes", "predicted_seconds", "lower_bound_seconds", "baseline_seconds", "stall_seconds",
    "baseline_stall_seconds", "planning_seconds", "problems",
}


def _params():
    for p in EXAMPLES:
        marks = [pytest.mark.slow] if any(s in p.name for s in SLOW) else []
        yield pytest.param(p, id=p.stem, marks=marks)


def test_the_examples_are_there():
    """An empty glob would parametrize nothing (a skip); the command tests below need the tiny example."""
    assert TINY in EXAMPLES and len(EXAMPLES) > 1, EXAMPLES


@pytest.mark.parametrize("path", list(_params()))
def test_example_plans_exactly_and_balanced(path: Path):
    r = resolve.resolve_spec(path)
    net = network_model(r.network, colocated=r.sync.mode == "colocated")
    plan = build_plan(r.trainer, r.rollout, round_bytes=r.sync.round_bytes, network=net)
    problems = validate_plan(plan, r.trainer, r.rollout, canonical=r.canonical)
    m = plan_metrics(plan, r.trainer, r.rollout, network=net, sync_mode=r.sync.mode,
                     max_staleness=r.sync.max_staleness, problems=problems)
    assert m["problems"] == []
    assert m["wire_bytes"] == m["min_wire_bytes"] > 0
    assert m["max_round_rank_bytes"] <= r.sync.round_bytes
    if m["sender_balance"] > BALANCE_LIMIT:  # allowed only when the layouts force it, with the reason printed
        assert balance_reason(m) is not None and m["sender_balance"] <= m["sender_balance_bound"] * BALANCE_LIMIT
    assert m["predicted_seconds"] >= m["lower_bound_seconds"]
    assert m["baseline_stall_seconds"] > m["stall_seconds"]
    assert JSON_KEYS <= set(m)


def test_plan_command_json_render_and_exit_codes(tmp_path, capsys):
    from weightbridge.cli.main import main

    tiny = TINY
    png = tmp_path / "plan.png"
    assert main(["plan", str(tiny), "--json", "--render", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert JSON_KEYS <= set(out) and out["problems"] == []
    assert png.stat().st_size > 1000
    assert main(["plan", str(tiny), "--receiver-dedup", "off"]) == 0
    text = capsys.readouterr().out
    assert "plan is valid" in text and "sender balance" in text

    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\n")
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "problem" in err

    badnet = tmp_path / "badnet.yaml"
    badnet.write_text(tiny.read_text() + "\nnetwork: {preset: h200, nic: 3}\n")
    assert main(["plan", str(badnet)]) == 2
    assert "$.network.nic" in capsys.readouterr().err
    goodnet = tmp_path / "goodnet.yaml"
    goodnet.write_text(tiny.read_text() + "\nnetwork: {preset: cpu-gloo, ranks_per_node: 2}\n")
    assert main(["plan", str(goodnet), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["network"] == "cpu-gloo"


def test_plan_command_exits_1_when_the_plan_has_problems(monkeypatch, capsys):
    from weightbridge import plan as plan_pkg
    from weightbridge.cli.main import main
    from weightbridge.plan import PlanProblem

    tiny = TINY
    monkeypatch.setattr(plan_pkg, "validate_plan", lambda *a, **k: [PlanProblem("uncovered", "rollout 0 needs x")])
    assert main(["plan", str(tiny)]) == 1
    assert "uncovered" in capsys.readouterr().out
