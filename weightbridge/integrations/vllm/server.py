"""The trainer side of ``vllm serve``: weightbridge updates driven through vLLM's own HTTP routes.

Each server is one rollout instance of the spec (``urls[i]`` is instance ``i``), started with the
backend and vLLM's RL routes::

    VLLM_SERVER_DEV_MODE=1 WEIGHTBRIDGE_SECRET=... vllm serve MODEL --tensor-parallel-size 2 \\
        --weight-transfer-config '{"backend": "weightbridge"}' \\
        --worker-extension-cls weightbridge.integrations.vllm.WorkerExtension   # for check() and typed errors

The routes used (all vLLM's; ``VLLM_SERVER_DEV_MODE=1`` registers them): ``/init_weight_transfer_engine``,
``/sleep?level=0&mode=`` + ``/reset_prefix_cache`` + ``/wake_up?tags=scheduling`` (or ``/pause`` +
``/resume``, ``pause_route="pause"``), ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/weight_info``; ``/collective_rpc`` for the ``WorkerExtension`` calls (the bitwise
check, the typed error of a failed update). No weights travel over HTTP: the servers' workers
receive their shards from the trainer ranks through the bridge.

One call per version, on the trainer process that drives the servers (usually trainer rank 0;
every other trainer rank calls ``bridge.push(v)`` as usual)::

    servers = VLLMServers(["http://a:8000", "http://b:8000"], "weightbridge.yaml", host=H, port=P)
    servers.init()                       # once (and again after a server restart)
    servers.push(bridge, v)              # push v and make it live on every server

``push`` follows the spec's ``sync.mode``: in ``sync`` mode the servers' ``update_weights`` receive
while the trainer sends (they run together: ``bridge.push`` returns when every worker applied
``v``); in ``async`` mode ``bridge.push`` returns once every worker staged ``v`` (received while
the servers kept serving) and the servers then apply it, each paused (the scheduler stopped)
(so generation never runs on a half-updated model and every output token's version label is
right; see :mod:`weightbridge.integrations.vllm.protocol`).

All HTTP calls have deadlines; a server that fails raises :class:`ServerError` naming its URL, or
the worker's typed weightbridge error when the server can report it.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightbridge.errors import BridgeError
from weightbridge.integrations._engine.init_command import prepare
from weightbridge.integrations.vllm.protocol import check_pause, label, update_info

if TYPE_CHECKING:
    from weightbridge.runtime.options import BridgeOptions

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 16 << 20  # a reply larger than this is not one of these routes' answers


class ServerError(BridgeError):
    """An HTTP call to ``url`` + ``route`` failed (``status`` 0: no HTTP answer); ``detail``: the body."""

    def __init__(self, url: str, route: str, status: int, detail: str) -> None:
        self.url = url
        self.route = route
        self.status = status
        self.detail = detail
        super().__init__(f"vLLM server {url}: {route} -> {status or 'no answer'}: {detail[:2000]}")


class VLLMServer:
    """One ``vllm serve`` process's HTTP routes (blocking calls with deadlines)."""

    def __init__(self, url: str, *, timeout_s: float = 300.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"server URL must be http(s)://host:port, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.call_s: dict[str, float] = {}  # route -> its last call's wall time (diagnostics, the bench)

    def call(self, route: str, body: dict[str, Any] | None = None, *, method: str = "POST",
             query: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        """``route``'s JSON answer (None for an empty one); :class:`ServerError` on failure."""
        target = self.url + route + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(target, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read(MAX_REPLY_BYTES + 1)
            self.call_s[route] = time.perf_counter() - t0
        except urllib.error.HTTPError as exc:
            raise ServerError(self.url, route, exc.code, exc.read(64 << 10).decode(errors="replace")) from None
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            raise ServerError(self.url, route, 0, f"{type(exc).__name__}: {exc}") from None
        if len(raw) > MAX_REPLY_BYTES:
            raise ServerError(self.url, route, 200, f"reply over {MAX_REPLY_BYTES} bytes")
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:
            raise ServerError(self.url, route, 200, f"not JSON: {raw[:200]!r}") from None

    def wait_ready(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> None:
        """Block until ``GET /health`` answers 200 (the engine is up), or raise :class:`ServerError`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.call("/health", method="GET", timeout_s=10)
                return
            except ServerError as exc:
                if time.monotonic() + poll_s > deadline:
                    raise ServerError(self.url, "/health", exc.status, f"not ready after {timeout_s:.0f}s: "
                                      f"{exc.detail}") from None
            time.sleep(poll_s)

    def weight_version(self) -> str:
        """vLLM's current weight label (``GET /weight_info``)."""
        reply = self.call("/weight_info", method="GET")
        if not isinstance(reply, dict) or not isinstance(reply.get("weight_version"), str):
            raise ServerError(self.url, "/weight_info", 200, f"unexpected answer {reply!r}"[:300])
        return reply["weight_version"]

    def collective_rpc(self, method: str, args: tuple[str, ...] = (), kwargs: dict[str, str] | None = None, *,
                       timeout_s: float | None = None) -> list[Any]:
        """``POST /collective_rpc`` (dev mode; string arguments only): one result per worker."""
        reply = self.call("/collective_rpc", {"method": method, "args": list(args), "kwargs": dict(kwargs or {})},
                          timeout_s=timeout_s)
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list):
            raise ServerError(self.url, "/collective_rpc", 200, f"unexpected answer {reply!r}"[:300])
        return results

    def typed_error(self) -> BaseException | None:
        """The typed weightbridge error of the last failed update on any worker (needs the
        ``WorkerExtension``), or None. Only :mod:`weightbridge.errors` types are re-created."""
        from weightbridge.errors import error_from_data

        try:
            results = self.collective_rpc("weightbridge_last_error", timeout_s=30)
        except ServerError:
            return None
        for data in results:
            if isinstance(data, dict) and str(data.get("type", "")).startswith("weightbridge.errors:"):
                try:
                    return error_from_data(data)
                except Exception:  # noqa: BLE001 - an unreadable report is no typed error
                    continue
        return None


class VLLMServers:
    """The trainer's handle on every ``vllm serve`` of the spec's rollout (``urls[i]`` = instance ``i``).

    ``pause``/``clear_cache``: the default of :meth:`update` (vLLM's ``/pause`` choices, see
    :data:`~weightbridge.integrations.vllm.protocol.PAUSE_MODES`). Other arguments as
    :class:`~weightbridge.integrations.vllm.driver.VLLMWeightSync`; ``host``/``port``: the bridge's
    control store, which the servers' workers join. ``store``: read the instances' versions through
    this store client instead of opening a connection of its own (it is used from this object's
    HTTP threads). ``pause_route``: how a server is paused around an update, ``"sleep"`` (default:
    vLLM's level-0 sleep and ``/wake_up?tags=scheduling``, the scheduler's pause without ``/pause``'s
    fixed 20 ms wait) or ``"pause"`` (``/pause`` ... ``/resume``; it also clears multimodal caches).
    """

    def __init__(self, urls: list[str], spec: str | Path, *, host: str, port: int, staging: bool | None = None,
                 probe: str = "check", cache_dir: str | None = None, options: BridgeOptions | None = None,
                 pause: str = "keep", clear_cache: bool = True, http_timeout_s: float | None = None,
                 store: Any = None, pause_route: str = "sleep", **moved: Any) -> None:
        from weightbridge.bridge import InstanceView

        if not urls:
            raise ValueError("no server URLs")
        self.pause, self.clear_cache = check_pause(pause), clear_cache
        if pause_route not in ("sleep", "pause"):
            raise ValueError(f"pause_route must be 'sleep' or 'pause', got {pause_route!r}")
        self.pause_route = pause_route
        prepared = prepare(spec, host=host, port=port, instance=0, staging=staging, probe=probe,
                           cache_dir=cache_dir, options=options, where="VLLMServers", moved=moved)
        resolved = prepared.resolved
        if len(urls) != resolved.rollout.num_instances:
            raise ValueError(f"{len(urls)} server URLs for the spec's {resolved.rollout.num_instances} rollout "
                             "instance(s): give one URL per instance, in instance order")
        self.prepared = prepared  # init commands are sealed per send (fresh: a replay is refused)
        self.resolved = resolved
        self.timeout_s = prepared.timeout_s
        # An update waits up to timeout_s in the workers, plus the pause ("wait" drains requests).
        http = float(http_timeout_s or 2 * self.timeout_s + 60)
        self.servers = [VLLMServer(u, timeout_s=http) for u in urls]
        prefix = prepared.prefix
        if store is not None:
            self.views = [InstanceView(resolved, i, store, prefix=prefix, timeout_s=self.timeout_s)
                          for i in range(len(urls))]
        else:
            self.views = [InstanceView.connect(resolved, i, host=host, port=port, prefix=prefix,
                                               timeout_s=self.timeout_s) for i in range(len(urls))]
        self.versions: list[int | None] = [None] * len(urls)
        # Per server, its last update's wall time ("total") and the /update_weights call's part of it (the
        # workers receiving and loading the weights); the rest is the fixed cost of control and pausing
        # (each route's last call's time is there too, by route).
        self.last_update_s: list[dict[str, float] | None] = [None] * len(urls)
        # one thread per server, plus push()'s update running beside the trainer's push
        self._pool = ThreadPoolExecutor(max_workers=len(urls) + 1, thread_name_prefix="wb-vllm-http")

    # -- setup --------------------------------------------------------------------------------
    def init(self, *, initial_version: int | None = None, ready_timeout_s: float = 600.0) -> None:
        """Every server's workers check the spec against their engine and join the bridge
        (``/init_weight_transfer_engine``), once the server answers ``/health`` (waits up to
        ``ready_timeout_s``: trainers often start before the servers are up). ``initial_version``:
        label the weights the servers loaded at start with this version (``/update_weight_version``)
        instead of ``"default"``."""

        def one(i: int) -> None:
            server = self.servers[i]
            server.wait_ready(ready_timeout_s)
            try:
                server.call("/init_weight_transfer_engine", {"init_info": self.prepared.sealed(instance=i)})
            except ServerError as exc:
                raise (server.typed_error() or exc) from exc
            if initial_version is not None:
                server.call("/update_weight_version", {"new_version": label(initial_version)})

        self._all(one)

    # -- updates ------------------------------------------------------------------------------
    def update(self, version: int | None = None, *, pause: str | None = None, clear_cache: bool | None = None,
               timeout_s: float | None = None) -> list[int | None]:
        """Make ``version`` live on every server (each waits for it up to ``timeout_s``), or with None
        the newest version each has complete. Returns each server's live version (None: nothing newer).
        Each server: pause (``/sleep?level=0`` [+ ``/reset_prefix_cache``], or ``/pause``, see
        ``pause_route``) -> ``/start_weight_update`` -> ``/update_weights`` -> ``/finish_weight_update``
        (labelled with the version its workers applied) -> resume (``/wake_up?tags=scheduling`` or
        ``/resume``). A server is paused even when idle: a request may arrive at any moment, and tokens
        generated between ``/update_weights`` and the label would carry the old version's label."""
        mode = check_pause(pause or self.pause)
        clear = self.clear_cache if clear_cache is None else clear_cache
        info = update_info(version, timeout_s or self.timeout_s)
        return self._all(lambda i: self._update_one(i, version, info, mode, clear))

    def push(self, bridge: Any, version: int, *, tensors: Any = None, pause: str | None = None,
             clear_cache: bool | None = None) -> Any:
        """Push ``version`` from this trainer rank and make it live on every server; returns the push's
        :class:`~weightbridge.bridge.PushStats`. Every other trainer rank calls ``bridge.push(version)``
        at the same time (a collective over the trainer ranks)."""
        if self.resolved.sync.mode == "sync":
            pending = self._pool.submit(self.update, version, pause=pause, clear_cache=clear_cache)
            try:
                stats = bridge.push(version, tensors=tensors)
            except BaseException:
                try:
                    pending.result()  # the servers' own deadlines bound this wait
                except Exception as exc:  # noqa: BLE001 - the push's error is the cause; this one follows it
                    log.warning("after the failed push of version %d the servers failed too: %s", version, exc)
                raise
            applied = pending.result()
        else:
            stats = bridge.push(version, tensors=tensors)
            applied = self.update(version, pause=pause, clear_cache=clear_cache)
        if any(a is None or a < version for a in applied):
            raise BridgeError(f"version {version} pushed, but the servers now serve {applied}")
        return stats

    def _update_one(self, i: int, version: int | None, info: dict[str, Any], mode: str, clear: bool) -> int | None:
        server, view = self.servers[i], self.views[i]
        previous = self.versions[i]
        if version is None:
            ready = view.staged()
            if ready is None or (previous is not None and ready <= previous):
                return None
        t0 = time.perf_counter()
        server.call_s = {}  # this update's calls only
        self._pause(server, mode, clear)
        try:
            server.call("/start_weight_update")
            t1 = time.perf_counter()
            try:
                server.call("/update_weights", {"update_info": info})
                t2 = time.perf_counter()
            except ServerError as exc:
                typed = server.typed_error()
                try:
                    self._finish(i)
                except Exception as again:  # noqa: BLE001 - logged; the update's own error is raised
                    log.warning("%s: finishing after a failed update also failed: %s", server.url, again)
                raise (typed or exc) from exc
            applied = self._finish(i)
        finally:
            server.call("/resume" if self.pause_route == "pause" else "/wake_up", query=self._resume_query)
        self.last_update_s[i] = {**server.call_s, "total": time.perf_counter() - t0, "update_weights": t2 - t1}
        return applied if (version is not None or applied != previous) else None

    def _pause(self, server: VLLMServer, mode: str, clear: bool) -> None:
        """Stop the server's scheduler (``mode``: what happens to requests in flight) and, with ``clear``,
        drop its prefix cache (KV computed by the old weights; running requests recompute).

        ``pause_route="sleep"``: vLLM's level-0 sleep (the scheduler's own pause, the same
        ``pause_scheduler(mode)`` as ``/pause``) plus ``/reset_prefix_cache`` with the running requests;
        ``/pause`` itself adds a fixed 20 ms ``asyncio.sleep`` in the API server (vLLM 0.32's
        ``AsyncLLM.pause_generation``) that a small model's update pays on every step.
        ``pause_route="pause"``: ``/pause`` (also clears multimodal caches: use it for vision models)."""
        if self.pause_route == "pause":
            server.call("/pause", query={"mode": mode, "clear_cache": str(clear).lower()})
            return
        server.call("/sleep", query={"level": 0, "mode": mode})
        if clear:
            reply = server.call("/reset_prefix_cache", query={"reset_running_requests": "true",
                                                              "reset_external": "true"})
            if not (isinstance(reply, dict) and reply.get("success") is True):
                server.call("/wake_up", query=self._resume_query)
                raise ServerError(server.url, "/reset_prefix_cache", 200, f"cache not reset: {reply!r}"[:300])

    @property
    def _resume_query(self) -> dict[str, str] | None:
        return None if self.pause_route == "pause" else {"tags": "scheduling"}

    def _finish(self, i: int) -> int | None:
        applied = None
        try:
            applied = self.views[i].applied()
        finally:
            tag = label(applied)
            self.servers[i].call("/finish_weight_update", None if tag is None else {"weight_version": tag})
        self.versions[i] = applied
        return applied

    # -- inspection ---------------------------------------------------------------------------
    def weight_versions(self) -> list[str]:
        """Each server's current label (``/weight_info``)."""
        return self._all(lambda i: self.servers[i].weight_version())

    def check(self, checkpoint_dir: str | Path) -> list[list[str]]:
        """Per server, every worker's bitwise check against vLLM's own load of ``checkpoint_dir``
        (empty: equal). Needs the ``WorkerExtension`` (``--worker-extension-cls``)."""
        return self._all(lambda i: [p for problems in self.servers[i].collective_rpc(
            "weightbridge_check", (str(checkpoint_dir),)) for p in problems])

    def shutdown(self) -> None:
        """Every server leaves the bridge (``/shutdown_weight_transfer_engine``); they keep serving."""
        try:
            self._all(lambda i: self.servers[i].call("/shutdown_weight_transfer_engine"))
        finally:
            self._pool.shutdown(wait=False)

    def _all(self, fn: Any) -> list[Any]:
        """``fn(i)`` for every server at once; raises the first failure after all finished."""
        futures = [self._pool.submit(fn, i) for i in range(len(self.servers))]
        errors = [f.exception() for f in futures]
        for exc in errors:
            if exc is not None:
                raise exc
        return [f.result() for f in futures]
