"""An engine instance as a conformance-suite rollout unit (``wb_rollout_scope`` ``"instance"``): the shared part.

:class:`EngineRolloutUnit` answers the suite for one engine instance (all its workers) through an
engine-specific subclass (:mod:`weightbridge.integrations.vllm.conformance`,
:mod:`weightbridge.integrations.sglang.conformance`) that starts the engine, connects its driver
with the suite's ``bridge_kwargs()`` and reaches the workers:

* ``poll()``: every worker's ``bridge.poll()`` (:meth:`_poll_workers`): True when every worker
  has the same complete version staged; a failed receive is re-raised here with its own type;
* ``apply()``: the driver's ``update(v)``;
* ``tensors(rank)``: the worker's receive buffers (its checkpoint-format shard, what the engine's
  load writes into the model); ``probe_layout(rank)``: the layout the worker probed from the
  engine's own ``load_weights`` at init.

The unit always receives into a staging copy (``staging=True``): the receive buffers change only
on a complete, applied version, so the unit is never torn.

Running inside the suite's rank process: the rank process is a daemonic ``multiprocessing`` child,
and the engines start their processes with ``multiprocessing``, which refuses children of daemonic
processes: :meth:`_start` clears the daemon flag first. ``close()`` shuts the engine down; when the
suite kills the rank process instead (deadline, fault scenarios), a watchdog process kills the
engine's processes. The suite's fault hook (``on_round`` in ``bridge_kwargs()["options"]``) runs
in the engine's workers: it travels by name (:mod:`.hooks`), and :meth:`_start` enables test hooks
in the environment the engine's processes inherit.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weightbridge.integrations._engine.hooks import TEST_HOOKS_ENV

log = logging.getLogger(__name__)


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def engine_model(spec_path: str | Path, workdir: str | Path) -> tuple[Path, bool]:
    """The directory the engine loads the spec's model from, and whether it holds weights.

    No checkpoint on disk is needed: the suite compares what the engine received with what the
    trainer sent, never with a file. ``model.config`` (a ``config.json`` or its directory): that
    directory, with its weights when it has any, else the engine builds the model from the config
    with dummy weights (``load_format="dummy"``); ``model.bundled``: its config written to
    ``workdir/engine-model/config.json``, dummy weights; ``model.safetensors``: that checkpoint's
    directory (it must hold the ``config.json``). Raises ``ValueError`` naming the spec otherwise."""
    import shutil

    import yaml

    from weightbridge.canonical.bundled import model_config_json

    spec_path = Path(spec_path)
    model = (yaml.safe_load(spec_path.read_text()) or {}).get("model") or {}
    config = model_config_json(model, spec_path.parent)
    if isinstance(model.get("bundled"), str) and config is not None:
        target = Path(workdir) / "engine-model"
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / f"config.json.{os.getpid()}.tmp"  # every instance of the run writes it: atomically
        shutil.copyfile(config, tmp)
        os.replace(tmp, target / "config.json")
        return target, False
    key = "config" if config is not None else "safetensors"
    if config is None and isinstance(model.get("safetensors"), str):
        path = Path(model["safetensors"])
        config = (path if path.is_absolute() else spec_path.parent / path)
        config = (config if config.is_dir() else config.parent) / "config.json"
    if config is None:
        raise ValueError(f"{spec_path}: the engine needs the model's config: give model.config (a config.json, "
                         "weights beside it optional) or model.bundled")
    if not config.is_file():
        raise ValueError(f"{spec_path}: model.{key}: no config.json in {config.parent} (the engine builds the "
                         "model from it; point model.config at the model's config.json)")
    folder = config.parent
    return folder, any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES)


class EngineRolloutUnit:
    """One engine instance as a :class:`~weightbridge.testing.RolloutUnit`; subclasses set
    ``POLL_INTERVAL_S`` and implement the ``_`` methods below :meth:`close`."""

    POLL_INTERVAL_S = 0.05  # poll() is a round trip to every worker; paced on small CPU machines
    probe_cache = "probe"  # the probe cache's directory in the suite's workdir (once per suite run)

    def _start(self, ctx: Any, start_engine: Callable[[], Any], connect: Callable[..., Any]) -> None:
        """Start the engine (``start_engine()``) and its driver (``connect(host=, port=, instance=,
        cache_dir=, options=)``); ``self.engine`` and ``self.sync`` are set, or the engine is stopped."""
        self.ranks = tuple(ctx.ranks)
        self.label = f"rollout instance {ctx.instance} (ranks {list(self.ranks)})"
        if multiprocessing.current_process().daemon:  # the engines start processes with multiprocessing
            multiprocessing.current_process().daemon = False
        self._watchdog = _start_watchdog()  # before the engine starts any process
        os.environ[TEST_HOOKS_ENV] = "1"  # the suite's fault hook reaches the workers by name
        self._ready: int | None = None
        self._next_poll = 0.0
        self.engine: Any = start_engine()
        try:
            kw = dict(ctx.bridge_kwargs())
            cache = Path(ctx.spec_path).resolve().parent.parent / self.probe_cache
            self.sync = connect(host=kw.pop("host"), port=kw.pop("port"), instance=ctx.instance or 0,
                                cache_dir=str(cache), options=kw.pop("options"))
            if kw:
                raise TypeError(f"{self.label}: bridge kwargs this unit does not forward: {sorted(kw)}")
        except BaseException:
            self._shutdown()
            raise

    # -- the RolloutUnit protocol ---------------------------------------------------------------
    def poll(self) -> bool:
        from weightbridge.errors import error_from_data

        wait = self._next_poll - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._next_poll = time.monotonic() + self.POLL_INTERVAL_S
        replies = self._poll_workers()
        for reply in replies:
            if reply["error"] is not None:
                raise error_from_data(reply["error"])
        staged = {reply["staged"] for reply in replies}
        self._ready = staged.pop() if len(staged) == 1 and None not in staged else None
        return self._ready is not None

    def apply(self) -> int:
        if self._ready is None and not self.poll():
            if self.sync.version is None:
                from weightbridge.errors import NothingToApply

                raise NothingToApply(self.label)
            return self.sync.version
        want, self._ready = self._ready, None
        applied = self._update(want)
        if applied is None:
            from weightbridge.errors import ProtocolError

            raise ProtocolError(self.label, f"update({want}) returned no version")
        return applied

    @property
    def version(self) -> int | None:
        return self.sync.version

    @property
    def torn(self) -> bool:
        return False  # staging: the receive buffers change only on a complete version (see module doc)

    def tensors(self, rank: int) -> dict[str, Any]:
        return self._buffers(self._index(rank))

    def probe_layout(self, rank: int) -> dict[str, Any]:
        layout = self._probed(self._index(rank))
        if layout is None:
            raise RuntimeError(f"{self.label}: rank {rank} did not probe the engine's loader (probe='off')")
        return layout

    def close(self) -> None:
        try:
            self._leave()
        except Exception as exc:  # noqa: BLE001 - a dead engine (fault scenarios) has nothing to close
            log.debug("%s: leaving the bridge: %s", self.label, exc)
        self._shutdown()

    # -- the engine-specific part ---------------------------------------------------------------
    def _poll_workers(self) -> list[dict[str, Any]]:
        """Every worker's ``{"staged", "error", ...}`` after its ``bridge.poll()``."""
        raise NotImplementedError

    def _update(self, version: int) -> int | None:
        return self.sync.update(version)

    def _buffers(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def _probed(self, index: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def _leave(self) -> None:
        """Every worker leaves the bridge (the engine keeps running)."""
        raise NotImplementedError

    def _stop_engine(self, engine: Any) -> None:
        raise NotImplementedError

    # -- internals ------------------------------------------------------------------------------
    def _index(self, rank: int) -> int:
        if rank not in self.ranks:
            raise ValueError(f"{self.label}: rank {rank} is not one of this instance's ranks {list(self.ranks)}")
        return self.ranks.index(rank)

    def _shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                self._stop_engine(engine)
            except Exception as exc:  # noqa: BLE001 - already dead
                log.debug("%s: engine shutdown: %s", self.label, exc)
            del engine  # the last reference: vLLM ends its processes in finalizers
            gc.collect()
        dog, self._watchdog = self._watchdog, None
        if dog is not None:  # started by this unit; the engine's processes are gone now
            dog.kill()
            dog.wait(5)


# Kills the rank process's descendants (the engine's processes) once the rank process is gone.
# The suite's rank processes end with os._exit (no atexit hooks) or SIGKILL (deadline, fault
# scenarios), possibly while the engine is still starting, and the engines' processes do not watch
# their parent: without this they outlive the scenario. It records descendants while the rank
# lives (they are re-parented once it dies); psutil's kill() never hits a reused pid.
WATCHDOG = r"""
import os, sys, time
import psutil
parent, me, seen = int(sys.argv[1]), os.getpid(), {}
while os.getppid() == parent:
    try:
        seen.update((c.pid, c) for c in psutil.Process(parent).children(recursive=True) if c.pid != me)
    except psutil.Error:
        break
    time.sleep(0.25)
for proc in seen.values():
    try:
        proc.kill()
    except psutil.Error:
        pass
"""


def _start_watchdog() -> Any:
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid())], start_new_session=True)
