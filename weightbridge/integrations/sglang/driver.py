"""The driver side: where the user's ``sglang.Engine`` lives, or any client of an SGLang HTTP server.

Control calls only; no weights pass here. Every call is SGLang's own weight-update protocol,
``begin_weight_update`` / ``update_weights_from_tensor(load_format=LOADER)`` / ``end_weight_update``,
whose payload is one weightbridge command (:mod:`.commands`) that SGLang hands to the custom
weight loader in every TP worker (:mod:`.worker`)::

    sync = SGLangWeightSync(engine_or_url, "weightbridge.yaml", host=H, port=P, instance=i)  # once
    v = sync.update()        # async: apply the newest version every worker has complete (no wait)
    v = sync.update(7)       # sync: wait until version 7 arrived, apply it
    sync.version             # last applied version; SGLang's weight_version label is str(it)

SGLang's tokenizer manager holds its model-update lock for the call, so no batch runs while the
workers agree on and write a version (the engine's pause is the ``update`` call). The weight
version label travels with the update request (``weight_version``); if the workers applied a
different version (async: a newer one completed meanwhile) or none (an error), the driver sets
the label to what is really served (``update_weight_version``, never aborting requests).
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import shutil
import tempfile
import urllib.request
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightbridge.integrations._engine.driver import InstanceDriver
from weightbridge.integrations.sglang.commands import LOADER, Command, encode, read_reply, reply_path

if TYPE_CHECKING:
    from weightbridge.runtime.options import BridgeOptions

log = logging.getLogger(__name__)


class EngineCallFailed(RuntimeError):
    """SGLang answered a weight-update call with ``success=False`` (e.g. the KV cache could not be
    flushed because requests are running: the weights *were* written). ``replies``: the workers'."""

    def __init__(self, message: str, replies: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.replies = replies


def payload(cmd: Command) -> bytes:
    """One TP rank's ``update_weights_from_tensor`` entry: the command as the name, an empty tensor
    (plain pickle: no shared memory, so it also crosses an HTTP request)."""
    import torch

    return pickle.dumps([(encode(cmd), torch.empty(0))])


class EngineClient:
    """An in-process ``sglang.Engine``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tp_size = int(engine.server_args.tp_size)
        self.where = "sglang.Engine"

    def load(self, data: bytes, *, flush_cache: bool, weight_version: str | None) -> tuple[bool, str]:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[data] * self.tp_size, load_format=LOADER, flush_cache=flush_cache,
            weight_version=weight_version,
        )
        return self.engine.loop.run_until_complete(self.engine.tokenizer_manager.update_weights_from_tensor(obj, None))

    def begin(self) -> tuple[bool, str]:
        return self.engine.begin_weight_update()

    def end(self) -> tuple[bool, str]:
        return self.engine.end_weight_update()

    def weight_version(self) -> str | None:
        return self.engine.get_model_info().get("weight_version")

    def set_weight_version(self, label: str) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightVersionReqInput

        obj = UpdateWeightVersionReqInput(new_version=label, abort_all_requests=False)
        self.engine.loop.run_until_complete(self.engine.tokenizer_manager.update_weight_version(obj))

    def release_memory(self, tags: list[str] | None) -> None:
        self.engine.release_memory_occupation(tags=tags)

    def resume_memory(self, tags: list[str] | None) -> None:
        self.engine.resume_memory_occupation(tags=tags)


class HTTPClient:
    """An SGLang HTTP server (``python -m sglang.launch_server ... --custom-weight-loader LOADER``)."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.tp_size = int(self._request("GET", "/server_info")["tp_size"])
        self.where = self.url

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:  # SGLang answers a failed update with 400 and its message
            try:
                return json.loads(exc.read() or b"{}")
            except ValueError:
                raise RuntimeError(f"{self.url}{path}: HTTP {exc.code}") from exc

    def _call(self, path: str, body: dict[str, Any]) -> tuple[bool, str]:
        out = self._request("POST", path, body)
        return bool(out.get("success")), str(out.get("message", ""))

    def load(self, data: bytes, *, flush_cache: bool, weight_version: str | None) -> tuple[bool, str]:
        b64 = base64.b64encode(data).decode()
        body: dict[str, Any] = {"serialized_named_tensors": [b64] * self.tp_size, "load_format": LOADER,
                                "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self._call("/update_weights_from_tensor", body)

    def begin(self) -> tuple[bool, str]:
        return self._call("/begin_weight_update", {})

    def end(self) -> tuple[bool, str]:
        return self._call("/end_weight_update", {})

    def weight_version(self) -> str | None:
        return self._request("GET", "/model_info").get("weight_version")

    def set_weight_version(self, label: str) -> None:
        self._call("/update_weight_version", {"new_version": label, "abort_all_requests": False})

    def release_memory(self, tags: list[str] | None) -> None:
        self._request("POST", "/release_memory_occupation", {"tags": tags})

    def resume_memory(self, tags: list[str] | None) -> None:
        self._request("POST", "/resume_memory_occupation", {"tags": tags})


def client_for(engine: Any) -> Any:
    """A URL -> :class:`HTTPClient`; an ``sglang.Engine`` -> :class:`EngineClient`; an object that
    already has the client methods (``begin``, ``load``, ``end``, ``weight_version``,
    ``set_weight_version``, ``tp_size``) is used as it is (another transport, or a test)."""
    if isinstance(engine, str):
        return HTTPClient(engine)
    if all(hasattr(engine, a) for a in ("begin", "load", "end", "weight_version", "set_weight_version", "tp_size")):
        return engine
    return EngineClient(engine)


class SGLangWeightSync(InstanceDriver):
    """Connects one SGLang engine (one rollout instance of the spec) to the bridge."""

    def __init__(self, engine: Any, spec: str | Path, *, host: str, port: int, instance: int = 0,
                 staging: bool | None = None, probe: str = "check", cache_dir: str | None = None,
                 options: BridgeOptions | None = None, reply_dir: str | Path | None = "auto",
                 flush_cache: bool = True, api_key: str | None = None, **moved: Any) -> None:
        """``engine``: an ``sglang.Engine`` (started with ``custom_weight_loader=[LOADER]``) or the URL
        of an SGLang HTTP server (started with ``--custom-weight-loader LOADER``). ``options``: the
        workers' :class:`~weightbridge.bridge.BridgeOptions` (``prefix``; ``on_round`` only as a
        registered test hook, which reaches the workers by name:
        :mod:`weightbridge.integrations._engine.hooks`; no ``data_plane``). The init command is
        sealed with the job secret, which the workers check against their own environment's.
        ``reply_dir``: where the workers write their replies ("auto": a fresh temporary directory,
        right when the engine runs on this host; None: no replies, failures are then known only
        from the versions on the control store). ``flush_cache``: SGLang's flush of the KV cache
        after each applied update. ``api_key``: the HTTP server's admin key (``--admin-api-key``),
        sent as a bearer token."""
        prepared = self._connect(spec, host=host, port=port, instance=instance, staging=staging, probe=probe,
                                 cache_dir=cache_dir, options=options, moved=moved)
        self.client = HTTPClient(engine, api_key=api_key) if isinstance(engine, str) else client_for(engine)
        self.flush_cache = flush_cache
        self.reply_dir = tempfile.mkdtemp(prefix="wb-sglang-") if reply_dir == "auto" else reply_dir
        # an "auto" directory is this object's: removed by close(), a failed init, garbage collection
        # or interpreter exit, whichever comes first (a driver nobody closes leaves nothing in /tmp)
        self._remove_reply_dir = (weakref.finalize(self, shutil.rmtree, self.reply_dir, True)
                                  if reply_dir == "auto" else None)
        self._seq = 0
        self.sleeping: set[str] = set()  # SGLang's memory tags this driver released (sleep())
        try:
            self.initial_label = self.client.weight_version()
            self.call("init", **prepared.sealed())
        except BaseException:
            self._drop_reply_dir()
            raise

    # -- the protocol -----------------------------------------------------------------------------
    def call(self, op: str, *, weight_version: str | None = None, flush_cache: bool = False, raise_errors: bool = True,
             **fields: Any) -> list[dict[str, Any]]:
        """Send one command to every TP worker (one SGLang weight-update session); their replies in
        TP-rank order (empty without ``reply_dir``). Raises the first worker's typed error."""
        from weightbridge.errors import error_from_data

        self._seq += 1
        cmd = Command(op=op, seq=self._seq, reply_dir=None if self.reply_dir is None else str(self.reply_dir), **fields)
        ok, message = self.client.begin()
        if not ok:
            raise RuntimeError(f"{self.client.where}: begin_weight_update failed: {message}")
        try:
            ok, message = self.client.load(payload(cmd), flush_cache=flush_cache, weight_version=weight_version)
        finally:
            ok_end, message_end = self.client.end()
        replies = self._replies(op, every=ok) if self.reply_dir is not None else []
        if raise_errors:
            for reply in replies:
                if reply.get("error") is not None:
                    raise error_from_data(reply["error"])
        if not ok:
            raise EngineCallFailed(f"{self.client.where}: update_weights_from_tensor ({op}) failed: {message}", replies)
        if not ok_end:
            raise EngineCallFailed(f"{self.client.where}: end_weight_update failed: {message_end}", replies)
        return replies

    def _replies(self, op: str, every: bool = True) -> list[dict[str, Any]]:
        """The workers' replies to the last command; ``every``: each TP rank must have answered (after
        SGLang reported success); else those present (SGLang may have refused before any worker ran)."""
        from weightbridge.errors import ProtocolError

        replies = []
        for tp_rank in range(self.client.tp_size):
            reply = read_reply(self.reply_dir, self._seq, tp_rank)
            reply_path(self.reply_dir, self._seq, tp_rank).unlink(missing_ok=True)  # read once: none pile up
            if reply is None and not every:
                continue
            if reply is None:
                raise ProtocolError(f"rollout instance {self.instance}", f"SGLang TP rank {tp_rank} did not answer "
                                    f"{op} #{self._seq} in {self.reply_dir} (is it on this host's filesystem?)")
            replies.append(reply)
        return replies

    def update(self, version: int | None = None, *, timeout_s: float | None = None) -> int | None:
        """Apply ``version`` (wait for it, up to ``timeout_s``) or, with None, the newest complete one.

        Returns the version now live, or None when ``version`` is None and nothing newer is
        complete. Raises the workers' typed error (``DeadlineExceeded``, ``PeerFailed``, ...); the
        engine keeps serving the previous weights then, labelled as before, except in place
        (``sync.staging`` false), where the workers write as the bytes arrive: a failed update leaves
        them torn until the next complete one. After :meth:`sleep`, the weights are resumed before
        the update and the rest after it succeeded.
        """
        previous = self.version
        want = version if version is not None else self.newer_staged()
        if want is None:
            return None
        from weightbridge.integrations._engine.driver import awake_for_update

        with awake_for_update(bool(self.sleeping), self._resume):
            return self._update(want, version, previous, timeout_s)

    def sleep(self) -> None:
        """Release SGLang's memory (``release_memory_occupation``: weights and KV cache; SGLang needs
        ``enable_memory_saver``) after every worker released what its bridge keeps between updates (a
        staging copy stays: put it in host memory, ``sync.staging_memory``). The next :meth:`update`
        resumes the weights, updates, then resumes the rest."""
        self.call("release")
        self.client.release_memory(None)
        self.sleeping = {"weights", "kv_cache", "cuda_graph"}

    def _resume(self, tags: list[str]) -> None:
        """Resume the released tags among ``tags`` (``kv_cache``: and every other released one)."""
        wanted = [t for t in tags if t in self.sleeping]
        if "kv_cache" in tags:
            wanted += sorted(self.sleeping - {"weights", "kv_cache"})
        if wanted:
            self.client.resume_memory(wanted)
            self.sleeping -= set(wanted)

    def _update(self, want: int, version: int | None, previous: int | None, timeout_s: float | None) -> int | None:
        label = str(want)
        try:
            replies = self.call("update", version=want, timeout_s=float(timeout_s or self.timeout_s),
                                weight_version=label, flush_cache=self.flush_cache)
            applied = self._applied(replies, previous)
        except EngineCallFailed as exc:  # SGLang's own step failed after the workers wrote (or not)
            self.version = self._applied(exc.replies, previous)
            self._relabel("", self.version)
            raise
        except BaseException:
            self._relabel(label, previous)
            raise
        self._relabel(label, applied)
        self.version = applied
        if applied is None or (version is not None and applied < version):
            from weightbridge.errors import ProtocolError

            raise ProtocolError(f"rollout instance {self.instance}", f"update({version}) left version {applied} live")
        return applied if (version is not None or applied != previous) else None

    def _applied(self, replies: list[dict[str, Any]], previous: int | None) -> int | None:
        """What every worker now serves: their replies (each names the version it applied), or, without
        replies, the instance's applied acks on the control store."""
        if not replies:
            return self.view.applied()
        versions = {r.get("version") for r in replies}
        if len(versions) != 1:
            from weightbridge.errors import ProtocolError

            raise ProtocolError(f"rollout instance {self.instance}", f"TP workers applied different versions "
                                f"{sorted(versions, key=str)}")
        applied = versions.pop()
        return previous if applied is None else int(applied)

    def _relabel(self, sent: str, served: int | None) -> None:
        """SGLang recorded ``sent`` as its weight version; make it name what is served."""
        label = str(served) if served is not None else self.initial_label
        if label is not None and label != sent:
            try:
                self.client.set_weight_version(label)
            except Exception as exc:  # noqa: BLE001 - the update's own outcome matters more
                log.warning("rollout instance %d: could not set SGLang's weight_version to %s: %s",
                            self.instance, label, exc)

    # -- diagnostics (tests, the conformance suite) ----------------------------------------------
    def poll(self) -> list[dict[str, Any]]:
        """Every worker's ``bridge.poll()``: ``{"staged", "version", "error"}`` per TP rank."""
        return self.call("poll", raise_errors=False)

    def status(self) -> list[dict[str, Any]]:
        return self.call("status")

    def check(self, checkpoint_dir: str | Path) -> list[str]:
        """Bitwise check of every worker against SGLang's own load of ``checkpoint_dir``; empty: equal."""
        return [p for r in self.call("check", checkpoint=str(checkpoint_dir)) for p in r["problems"]]

    def probed_layout(self, tp_rank: int) -> dict[str, Any] | None:
        return self.call("probed")[tp_rank]["layout"]

    def buffers(self, tp_rank: int) -> dict[str, Any]:
        """The worker's receive buffers (its checkpoint-format shard), read back bit-exact."""
        from safetensors.torch import load_file

        replies = self.call("buffers")  # each TP rank wrote {reply_dir}/{seq}-{tp_rank}.safetensors
        paths = [reply_path(self.reply_dir, self._seq, rank, "safetensors") for rank in range(len(replies))]
        try:
            return load_file(paths[tp_rank])
        finally:
            for path in paths:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Leave the bridge in every worker (the engine keeps serving its weights)."""
        try:
            self.call("close")
        finally:
            self._drop_reply_dir()

    def _drop_reply_dir(self) -> None:
        """Remove the "auto" reply directory (no more replies are read then)."""
        if self._remove_reply_dir is not None:
            self._remove_reply_dir()
            self.reply_dir = None
