"""The cost model with delta updates (``price_delta``) and ``weightbridge plan --change-rate``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from weightbridge.plan import build_plan
from weightbridge.plan.cost import DELTA_HEADER_BYTES, delta_bucket_bytes, price, price_delta
from weightbridge.plan.network import network_model
from weightbridge.spec.resolve import resolve_spec
from weightbridge.shipped import path as shipped_path

SPEC = "spec/examples/qwen2.5-7b_megatron-tp4pp2dp2_to_vllm-tp2x8.yaml"


@pytest.fixture(scope="module")
def plan():
    r = resolve_spec(shipped_path(SPEC))
    return build_plan(r.trainer, r.rollout, round_bytes=int(r.sync.round_bytes), network=network_model("h100"))


def test_fewer_changes_cost_fewer_bytes_and_never_more_than_full(plan):
    net = network_model("h100")
    full, _ = price(plan, net)
    headers = DELTA_HEADER_BYTES * sum(len(r.buckets) for r in plan.rounds)
    previous = -1.0
    for f in (0.0, 1e-4, 1e-3, 0.01, 0.1, 0.3, 1.0):
        seconds, wire = price_delta(plan, net, f)
        assert wire >= previous and wire <= plan.wire_bytes + headers
        previous = wire
    assert price_delta(plan, net, 0.0)[1] == headers
    # bf16 at 1% changed: positions ~1 byte + a 1-byte difference per change = ~1% of the 2-byte payload
    assert 0.005 * plan.wire_bytes < price_delta(plan, net, 0.01)[1] < 0.015 * plan.wire_bytes
    assert price_delta(plan, net, 0.01)[0] < 0.3 * full  # the codec passes (HBM) do not dominate on an H100
    slow_mem = network_model({"preset": "cpu-gloo", "hbm_gbyte_per_s": 0.1})
    assert price_delta(plan, slow_mem, 0.01)[0] > price(plan, slow_mem)[0]  # where memory is slow, they do
    with pytest.raises(ValueError):
        price_delta(plan, net, 1.5)


def test_bucket_estimate_by_element_size(plan):
    b = plan.rounds[0].buckets[0]
    assert {it.dtype for it in b.items} == {"bfloat16"}
    elements = b.nbytes // 2  # all changed: a bitmap and a one-byte difference each
    assert delta_bucket_bytes(b.items, 1.0) == DELTA_HEADER_BYTES + elements / 8 + elements
    fp32 = [it._replace(dtype="float32", nbytes=2 * it.nbytes) for it in b.items]
    assert delta_bucket_bytes(fp32, 1.0) == DELTA_HEADER_BYTES + 2 * b.nbytes  # raw values: capped at full
    assert delta_bucket_bytes(fp32, 0.01) < 0.05 * 2 * b.nbytes


def _plan_json(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weightbridge", "plan", str(shipped_path(SPEC)), "--json", *extra],
                          capture_output=True, text=True, timeout=300)


def test_plan_cli_reports_the_time_with_deltas():
    out = _plan_json("--change-rate", "0.01")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert m["change_rate"] == 0.01 and 0 < m["delta_wire_bytes"] < m["wire_bytes"]
    assert 0 < m["predicted_delta_seconds"] < m["predicted_seconds"]
    plain = json.loads(_plan_json().stdout)
    assert (plain["change_rate"], plain["delta_wire_bytes"], plain["predicted_delta_seconds"]) == (None, None, None)


@pytest.mark.parametrize("bad", ["-0.1", "1.01", "nan", "x"])
def test_plan_cli_refuses_a_bad_change_rate(bad):
    out = _plan_json("--change-rate", bad)
    assert out.returncode == 2 and "--change-rate" in out.stderr and "Traceback" not in out.stderr
