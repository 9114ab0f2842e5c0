"""The online drivers' own logic without vLLM: version spans, the HTTP client, the update sequence.

``VLLMServers`` talks to a real HTTP server here (stdlib ``http.server``) that answers like vLLM's
routes; the real ``vllm serve`` path is tests/vllm_engine/test_vllm_server.py.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightbridge.transport.store import open_store

SPEC = """version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
sync: {mode: async, timeout_s: 5}
"""


# -- version spans ---------------------------------------------------------------------------------

def test_version_spans_read_vllm_objects_and_json_alike():
    from weightbridge.integrations.vllm.protocol import VersionSpan, version_spans

    objs = SimpleNamespace(weight_versions=[SimpleNamespace(version="default", start=0, end=3),
                                            SimpleNamespace(version="7", start=3, end=9)])
    as_json = {"weight_versions": [{"version": "default", "start": 0, "end": 3}, {"version": "7", "start": 3, "end": 9}]}
    want = [VersionSpan(None, 0, 3, "default"), VersionSpan(7, 3, 9, "7")]
    assert version_spans(objs) == want and version_spans(as_json) == want


@pytest.mark.parametrize("raw", [
    None, [], "7", [{"version": "x1", "start": 0, "end": 2}], [{"version": "1", "start": 1, "end": 2}],
    [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 3, "end": 4}],
    [{"version": "1", "start": 0, "end": 0}], [{"version": "1", "start": 0}], [{"version": 1, "start": 0, "end": 1}],
    [{"version": "١", "start": 0, "end": 1}], [{"version": "1", "start": True, "end": 2}],
])
def test_version_spans_refuse_what_vllm_never_sends(raw):
    from weightbridge.integrations.vllm.protocol import version_spans

    with pytest.raises(ValueError):
        version_spans({"weight_versions": raw})


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({"version": _json, "start": _json, "end": _json}) | _json, max_size=4))
def test_version_spans_of_any_json_are_spans_or_a_value_error(raw):
    from weightbridge.integrations.vllm.protocol import version_spans

    try:
        spans = version_spans({"weight_versions": raw})
    except ValueError:
        return
    assert spans[0].start == 0 and all(a.end == b.start for a, b in zip(spans, spans[1:]))


def test_update_info_and_pause_refuse_bad_values():
    from weightbridge.integrations.vllm.protocol import check_pause, update_info

    assert update_info(3, 10) == {"version": 3, "timeout_s": 10.0} and update_info(None, 1)["version"] is None
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ValueError):
            update_info(bad, 10)
    with pytest.raises(ValueError, match="keep"):
        check_pause("drop")


# -- a server that answers like vLLM's routes -------------------------------------------------------

class FakeRoutes(BaseHTTPRequestHandler):
    calls: list = []
    fail: dict = {}  # route -> (status, body)
    reply: dict = {}  # route -> raw bytes

    def _handle(self):
        route, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.calls.append((route, query, body))
        status, payload = self.fail.get(route, (200, None))
        raw = self.reply.get(route, json.dumps(payload if payload is not None else {"ok": True}).encode())
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _handle

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    FakeRoutes.calls, FakeRoutes.reply = [], {}
    FakeRoutes.fail = {"/reset_prefix_cache": (200, {"success": True})}  # what vLLM answers when it reset
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeRoutes)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _ack(store, rank, version, stage="applied"):
    from weightbridge.sync.auth import signer_from_env
    from weightbridge.sync.messages import Ack, Keys, encode

    key = Keys("wb").ack(stage, rank)
    store.set(key, signer_from_env().seal(key, encode(Ack(rank=rank, version=version, seq=version, epoch=1,
                                                                stage=stage))))
    store.check([key])  # set sends no reply: return once the store has it, as Board.ack does


def test_the_http_client_names_the_server_and_route_on_every_failure(fake):
    from weightbridge.integrations.vllm.server import MAX_REPLY_BYTES, ServerError, VLLMServer

    server = VLLMServer(fake, timeout_s=5)
    FakeRoutes.fail["/start_weight_update"] = (500, {"error": {"message": "Worker failed with error 'boom'"}})
    with pytest.raises(ServerError, match=r"start_weight_update -> 500: .*boom") as info:
        server.call("/start_weight_update")
    assert info.value.url == fake and info.value.status == 500
    FakeRoutes.reply["/weight_info"] = b"<html>"
    with pytest.raises(ServerError, match="not JSON"):
        server.weight_version()
    FakeRoutes.reply["/weight_info"] = b"[" * (MAX_REPLY_BYTES + 1)
    with pytest.raises(ServerError, match="reply over"):
        server.weight_version()
    with pytest.raises(ServerError, match="no answer") as info:
        VLLMServer("http://127.0.0.1:9", timeout_s=2).call("/health", method="GET")
    assert info.value.status == 0
    with pytest.raises(ValueError, match="http"):
        VLLMServer("file:///etc/passwd")


def test_a_server_recreates_only_weightbridge_errors(fake):
    from weightbridge.errors import DeadlineExceeded
    from weightbridge.integrations.vllm.server import VLLMServer

    server = VLLMServer(fake, timeout_s=5)
    typed = {"type": "weightbridge.errors:DeadlineExceeded", "message": "rollout 0: waited",
             "attrs": {"rank": "rollout 0", "waiting_for": "version 3", "timeout_s": 5.0}}
    FakeRoutes.fail["/collective_rpc"] = (200, {"results": [None, typed]})
    err = server.typed_error()
    assert isinstance(err, DeadlineExceeded) and err.rank == "rollout 0"
    hostile = {"type": "os:system", "message": "x", "attrs": {}}
    FakeRoutes.fail["/collective_rpc"] = (200, {"results": [hostile]})
    assert server.typed_error() is None


def test_servers_update_inside_pause_and_resume_with_the_applied_label(fake):
    from weightbridge.integrations._engine.init_command import InitGate
    from weightbridge.integrations.vllm.server import ServerError, VLLMServers

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    servers = VLLMServers([fake], SPEC, host="127.0.0.1", port=store.port, probe="off", pause="wait")
    servers.init(initial_version=0, ready_timeout_s=5)
    assert [c[0] for c in FakeRoutes.calls] == ["/health", "/init_weight_transfer_engine", "/update_weight_version"]
    init_info = FakeRoutes.calls[1][2]["init_info"]
    assert InitGate().open(init_info["payload"], init_info["seal"], "worker").instance == 0  # sealed, fresh
    assert FakeRoutes.calls[2][2] == {"new_version": "0"}
    FakeRoutes.calls.clear()
    assert servers.update() == [None] and FakeRoutes.calls == []  # nothing staged: nothing paused
    for r in (0, 1):
        _ack(store, r, 5)
    assert servers.update(5, clear_cache=False) == [5]
    assert [c[0] for c in FakeRoutes.calls] == ["/sleep", "/start_weight_update", "/update_weights",
                                                "/finish_weight_update", "/wake_up"]
    assert FakeRoutes.calls[0][1] == "level=0&mode=wait" and FakeRoutes.calls[4][1] == "tags=scheduling"
    assert FakeRoutes.calls[2][2] == {"update_info": {"version": 5, "timeout_s": 5.0}}
    assert FakeRoutes.calls[3][2] == {"weight_version": "5"}
    FakeRoutes.calls.clear()  # clearing the cache resets the prefix cache, running requests included
    for r in (0, 1):
        _ack(store, r, 6)
    assert servers.update(6) == [6]
    assert [c[:2] for c in FakeRoutes.calls[:2]] == [
        ("/sleep", "level=0&mode=wait"), ("/reset_prefix_cache", "reset_running_requests=true&reset_external=true")]
    FakeRoutes.calls.clear()  # a cache vLLM could not reset: resumed, nothing updated, the server named
    FakeRoutes.fail["/reset_prefix_cache"] = (200, {"success": False})
    with pytest.raises(ServerError, match="reset_prefix_cache.*cache not reset"):
        servers.update(6)
    assert [c[0] for c in FakeRoutes.calls] == ["/sleep", "/reset_prefix_cache", "/wake_up"]


def test_servers_with_pause_route_pause_use_vllms_pause_and_resume(fake):
    from weightbridge.integrations.vllm.server import VLLMServers

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    servers = VLLMServers([fake], SPEC, host="127.0.0.1", port=store.port, probe="off", pause_route="pause")
    for r in (0, 1):
        _ack(store, r, 5)
    assert servers.update(5) == [5]
    assert [c[:2] for c in FakeRoutes.calls] == [
        ("/pause", "mode=keep&clear_cache=true"), ("/start_weight_update", ""), ("/update_weights", ""),
        ("/finish_weight_update", ""), ("/resume", "")]
    with pytest.raises(ValueError, match="pause_route"):
        VLLMServers([fake], SPEC, host="127.0.0.1", port=store.port, pause_route="none")


_BLOCK_VLLM = """
import sys
tried = []
class RefuseVllm:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "vllm":
            tried.append(name)
            raise ImportError("refused: " + name)
sys.meta_path.insert(0, RefuseVllm())
from weightbridge.integrations.vllm import VLLMServers
from weightbridge.integrations.vllm.server import VLLMServer
print(sorted(tried), sorted(m for m in sys.modules if m.split(".")[0] == "vllm"))
"""


def test_importing_the_http_only_servers_client_imports_no_vllm():
    """Issue 33: the trainer that drives ``vllm serve`` over HTTP imported all of vLLM (~5 s) through
    the package's import-time backend registration; it now registers only where vLLM is loaded."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _BLOCK_VLLM], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"


def test_a_failed_server_update_is_finished_resumed_and_raised_typed(fake):
    from weightbridge.errors import PeerFailed
    from weightbridge.integrations.vllm.server import VLLMServers

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    servers = VLLMServers([fake], SPEC, host="127.0.0.1", port=store.port, probe="off")
    FakeRoutes.fail["/update_weights"] = (500, {"error": {"message": "Worker failed"}})
    typed = {"type": "weightbridge.errors:PeerFailed", "message": "rollout 1: trainer 0 failed",
             "attrs": {"rank": "rollout 1", "peer": "trainer 0", "message": "oom"}}
    FakeRoutes.fail["/collective_rpc"] = (200, {"results": [None, typed]})
    with pytest.raises(PeerFailed, match="trainer 0"):
        servers.update(2)
    routes = [c[0] for c in FakeRoutes.calls]
    assert routes == ["/sleep", "/reset_prefix_cache", "/start_weight_update", "/update_weights",
                      "/collective_rpc", "/finish_weight_update", "/wake_up"]
    assert FakeRoutes.calls[5][2] is None  # nothing applied: vLLM's label stays


def test_servers_refuse_a_url_count_that_is_not_the_spec_instances(fake):
    from weightbridge.integrations.vllm.server import VLLMServers

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    with pytest.raises(ValueError, match="2 server URLs for the spec's 1 rollout instance"):
        VLLMServers([fake, fake], SPEC, host="127.0.0.1", port=store.port)
    with pytest.raises(ValueError, match="pause"):
        VLLMServers([fake], SPEC, host="127.0.0.1", port=store.port, pause="later")
