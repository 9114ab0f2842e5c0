"""A client without the job secret sending init commands to a running SGLang engine's workers.

Used by ``sglang_selfcheck_main.py stranger`` after version 1 (every TP worker runs the sync
phase's bridge): through the same admin API the driver uses (for an HTTP server: its
``/update_weights_from_tensor`` route), it sends the old wire format's pickled hook (a pickle that
creates a marker file if anything unpickled it), an unsealed init and one with a forged seal, each
making the workers join the stranger's own store. Returns what it saw.
"""

from __future__ import annotations

import base64
import json
import pickle
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any


class Touch:
    """Unpickling this creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def stranger_commands(version: int, engine: Any, sync: Any) -> dict[str, Any] | None:
    from weightbridge.integrations._engine.hooks import HookRef
    from weightbridge.integrations._engine.init_command import InitPayload
    from weightbridge.integrations.sglang.commands import PREFIX, Command, read_reply
    from weightbridge.integrations.sglang.driver import client_for, payload

    if version != 1:
        return None
    client = client_for(engine)  # the HTTP route itself for a server URL
    replies = Path(tempfile.mkdtemp(prefix="wb-stranger-"))
    marker = replies / "pwned"
    spec = "version: 1\nmodel: {bundled: tiny-qwen2}\ntrainer: {preset: fsdp2}\nrollout: {preset: sglang}\n"
    mine = InitPayload(spec=spec, host="127.0.0.1", port=1, prefix="stranger", nonce=secrets.token_hex(16),
                       issued_at=time.time(), test_hook=HookRef(name="suite.kill-after-round", params={})
                       ).model_dump_json()
    old = PREFIX + json.dumps({"op": "init", "seq": 1, "reply_dir": str(replies), "spec": spec, "host": "127.0.0.1",
                               "port": 1, "on_round": base64.b64encode(pickle.dumps(Touch(marker))).decode()})
    import torch

    sends = {
        "pickled hook": pickle.dumps([(old, torch.empty(0))]),
        "unsealed": payload(Command(op="init", seq=2, reply_dir=str(replies), payload=mine)),
        "forged": payload(Command(op="init", seq=3, reply_dir=str(replies), payload=mine, seal="00" * 16)),
    }
    before = sync.status()
    seen: dict[str, Any] = {}
    for seq, (name, data) in enumerate(sends.items(), 1):
        client.begin()
        try:
            ok, message = client.load(data, flush_cache=False, weight_version=None)
        finally:
            client.end()
        answers = [read_reply(replies, seq, tp) for tp in range(client.tp_size)]
        seen[name] = {"ok": ok, "errors": [None if a is None or a["error"] is None
                                           else f"{a['error']['type']}: {a['error']['message']}" for a in answers]}
    after = sync.status()
    seen["marker"] = marker.exists()
    seen["before"] = [(w["rank"], w["version"], w["history"]) for w in before]
    seen["after"] = [(w["rank"], w["version"], w["history"]) for w in after]
    seen["last_errors"] = [None if w["last_error"] is None else w["last_error"]["type"] for w in after]
    return seen
