"""vLLM as a conformance-suite rollout unit (``wb_rollout`` with ``wb_rollout_scope`` ``"instance"``).

::

    @pytest.fixture
    def wb_rollout():
        return "weightbridge.integrations.vllm.conformance:build_rollout"

    @pytest.fixture
    def wb_rollout_scope():
        return "instance"

Inside the suite's rank process, :class:`VLLMRolloutUnit` creates a real ``vllm.LLM`` (the spec's
model directory, its rollout ``tp``) with weightbridge's weight-transfer backend, connects it with
:class:`~weightbridge.integrations.vllm.driver.VLLMWeightSync` (the suite's ``bridge_kwargs()``
passed through) and answers the suite through the WorkerExtension RPCs:

* ``poll()``: the workers' ``bridge.poll()`` (``weightbridge_poll``): True when every worker has
  the same complete version staged; a failed receive is re-raised here with its own type;
* ``apply()``: ``VLLMWeightSync.update(v)`` (vLLM's start/update/finish weight-update protocol);
* ``tensors(rank)``: the worker's receive buffers (its checkpoint-format shard, what the reload
  writes into the model); ``probe_layout(rank)``: the layout the worker probed from vLLM's own
  ``load_weights`` at init.

The unit always receives into a staging copy (``staging=True``, also in sync mode): the engine's
reload reads the receive buffers, which then change only on a complete, applied version, so the
unit is never torn. (In-place receive in sync mode is not what this unit exercises.)

Two things specific to running inside the suite's rank process:

* the rank process is a daemonic ``multiprocessing`` child, and vLLM starts its engine-core
  process with ``multiprocessing``, which refuses children of daemonic processes: the unit clears
  the current process's daemon flag first. ``close()`` shuts vLLM down; when the suite kills the
  rank process instead (deadline, fault scenarios), a watchdog process kills vLLM's processes.
* the suite's fault hook (``on_round`` in ``bridge_kwargs()["options"]``) must run in the vLLM worker
  that receives; vLLM sends
  ``init_info`` as msgpack, so it travels pickled as base64 text in the test-only
  ``init_info.on_round`` field (see :class:`~weightbridge.integrations.vllm.engine.WeightbridgeInitInfo`).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import time
from pathlib import Path
from typing import Any

from weightbridge.integrations.vllm import error_from_data, tensors_from_data

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.02  # poll() is one RPC round trip to every worker; pace it on small CPU machines
SHUTDOWN_S = 20.0


def model_dir_of(spec_path: str | Path) -> Path:
    """The checkpoint directory of the spec's ``model.config`` (vLLM loads the model from there)."""
    import yaml

    spec_path = Path(spec_path)
    cfg = (yaml.safe_load(spec_path.read_text()).get("model") or {}).get("config")
    path = Path(cfg) if isinstance(cfg, str) and Path(cfg).is_absolute() else spec_path.parent / str(cfg)
    if not isinstance(cfg, str) or not path.is_file():
        raise ValueError(f"{spec_path}: model.config {path} is not a file (vLLM needs the checkpoint directory)")
    return path.parent


class VLLMRolloutUnit:
    """One vLLM engine instance (all its TP workers) as a conformance-suite :class:`RolloutUnit`."""

    def __init__(self, ctx: Any, **llm_kwargs: Any) -> None:
        from weightbridge.integrations.vllm.cpu_engine import make_llm
        from weightbridge.integrations.vllm.driver import VLLMWeightSync

        resolved = ctx.resolved()
        self.ranks = tuple(ctx.ranks)
        self.label = f"rollout instance {ctx.instance} (ranks {list(self.ranks)})"
        tp = int(resolved.spec.rollout.mesh.get("tp", 1))
        if multiprocessing.current_process().daemon:  # vLLM starts its engine core with multiprocessing
            multiprocessing.current_process().daemon = False
        model_dir = model_dir_of(ctx.spec_path)
        self._watchdog = _start_watchdog()  # before vLLM starts any process
        # The engine core (and at TP 1 the single worker) runs in this rank process: two process
        # starts and vLLM imports fewer, ~25 s per scenario here. TP > 1 keeps vLLM's workers.
        self.llm: Any = make_llm(model_dir, tp, in_process=not llm_kwargs, **llm_kwargs)
        try:
            kw = dict(ctx.bridge_kwargs())
            # The suite's workdir (shared by its scenarios): vLLM's loader is probed once per run.
            cache = Path(ctx.spec_path).resolve().parent.parent / "vllm-probe"
            self.sync = VLLMWeightSync(
                self.llm, ctx.spec_path, host=kw.pop("host"), port=kw.pop("port"), instance=ctx.instance or 0,
                staging=True, probe="check", cache_dir=str(cache), options=kw.pop("options"),
            )
            if kw:
                raise TypeError(f"{self.label}: bridge kwargs this unit does not forward: {sorted(kw)}")
        except BaseException:
            self._shutdown()
            raise
        self._ready: int | None = None
        self._next_poll = 0.0

    # -- the RolloutUnit protocol ---------------------------------------------------------------
    def poll(self) -> bool:
        wait = self._next_poll - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._next_poll = time.monotonic() + POLL_INTERVAL_S
        replies = self.llm.collective_rpc("weightbridge_poll")
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
        try:
            applied = self.sync.update(want)
        except Exception as exc:
            typed = [e for e in self.llm.collective_rpc("weightbridge_last_error") if e is not None]
            if typed:
                raise error_from_data(typed[0]) from exc
            raise
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
        return tensors_from_data(self.llm.collective_rpc("weightbridge_buffers")[self._index(rank)])

    def probe_layout(self, rank: int) -> dict[str, Any]:
        layout = self.llm.collective_rpc("weightbridge_probed_layout")[self._index(rank)]
        if layout is None:
            raise RuntimeError(f"{self.label}: rank {rank} did not probe vLLM's loader (probe='off')")
        return layout

    def close(self) -> None:
        try:
            self.llm.collective_rpc("shutdown_weight_transfer_engine")
        except Exception as exc:  # noqa: BLE001 - a dead engine (fault scenarios) has nothing to shut down
            log.debug("%s: shutdown_weight_transfer_engine: %s", self.label, exc)
        self._shutdown()

    # -- internals ------------------------------------------------------------------------------
    def _index(self, rank: int) -> int:
        if rank not in self.ranks:
            raise ValueError(f"{self.label}: rank {rank} is not one of this instance's ranks {list(self.ranks)}")
        return self.ranks.index(rank)

    def _shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown(timeout=SHUTDOWN_S)
        except Exception as exc:  # noqa: BLE001 - already dead
            log.debug("%s: engine shutdown: %s", self.label, exc)
        del llm
        gc.collect()
        dog, self._watchdog = self._watchdog, None
        if dog is not None:  # started by this unit; vLLM's processes are gone now
            dog.kill()
            dog.wait(5)


# Kills the rank process's descendants (vLLM's engine core and workers) once the rank process is
# gone. The suite's rank processes end with os._exit (no atexit hooks) or SIGKILL (deadline, fault
# scenarios), possibly while the engine is still starting, and vLLM's engine core does not watch
# its parent: without this its processes outlive the scenario. It records descendants while the
# rank lives (they are re-parented once it dies); psutil's kill() never hits a reused pid.
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
    import os
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid())], start_new_session=True)


def build_rollout(ctx: Any) -> VLLMRolloutUnit:
    """``wb_rollout`` factory (scope ``"instance"``): one vLLM engine per rollout instance."""
    return VLLMRolloutUnit(ctx)
