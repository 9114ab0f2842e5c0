"""FP8 rollout targets over real processes (Gloo): trainers quantise, rollouts receive FP8 + scales, bitwise.

Two FSDP2 trainer ranks (float32 master weights) push three versions to a vLLM-layout rollout at
TP 2 that serves the attention and MLP weights as FP8 with 128x128 block scales (its receive
tensors: ``qkv_proj.weight`` float8_e4m3fn, ``qkv_proj.weight_scale_inv`` float32, ...). 64 KiB
rounds cut the FP8 items inside blocks, so senders quantise around what they send. After every
push each rollout rank holds, bit for bit, what vLLM's quantiser makes of the bf16 checkpoint;
also with ``sync.delta: on`` (1% of the elements change per version: FP8 and scale buckets travel as
the elements that changed).
"""

from __future__ import annotations

import pytest

import fp8_workers as W
from weightbridge.spec.resolve import load_spec
from weightbridge.localrun import launch
from weightbridge.transport.store import open_store

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("delta", ["off", "on"])
def test_trainers_quantise_and_rollouts_hold_vllms_fp8_bitwise(tmp_path, delta):
    text = W.spec_text(W.write_config(tmp_path), delta=delta)
    r = load_spec(text)
    assert r.rollout.quant and r.rollout.ranks[0].tensor("model.layers.0.self_attn.qkv_proj.weight").dtype == "float8_e4m3fn"
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    procs = [("trainer", text, t, store.port, [1, 2, 3]) for t in range(2)]
    procs += [("rollout", text, q, store.port, [1, 2, 3]) for q in range(2)]
    res = launch(W.main, procs, timeout_s=90)
    for x in res:
        assert x.ok, (x.error, x.traceback, x.timed_out)
    if delta == "on":  # pushes 2 and 3 send FP8 and scale buckets as deltas
        assert all(e[3] > 0 for t in (0, 1) for e in res[t].value if e[0] == "pushed" and e[1] > 1), res[0].value
    for q in (2, 3):
        applied = [e for e in res[q].value if e[0] == "applied"]
        assert [e[1] for e in applied] == [1, 2, 3]
        assert all(e[2] == [] for e in applied), applied
        assert applied[0][3]["model.layers.0.mlp.gate_up_proj.weight_scale_inv"] == "float32"
