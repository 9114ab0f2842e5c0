"""SGLang as a conformance-suite rollout unit (``wb_rollout`` with ``wb_rollout_scope`` ``"instance"``).

::

    @pytest.fixture
    def wb_rollout():
        return "weightbridge.integrations.sglang.conformance:build_rollout"

    @pytest.fixture
    def wb_rollout_scope():
        return "instance"

Inside the suite's rank process, :class:`SGLangRolloutUnit` starts a real ``sglang.Engine`` (the
spec's model directory, its rollout ``tp``, weightbridge's custom weight loader), connects it with
:class:`~weightbridge.integrations.sglang.driver.SGLangWeightSync` (the suite's ``bridge_kwargs()``
passed through) and answers the suite through the driver's commands:

* ``poll()``: the workers' ``bridge.poll()`` (command ``poll``): True when every worker has the same
  complete version staged; a failed receive is re-raised here with its own type;
* ``apply()``: ``SGLangWeightSync.update(v)`` (SGLang's begin / update_weights_from_tensor / end);
* ``tensors(rank)``: the worker's receive buffers (its checkpoint-format shard, what SGLang's direct
  load writes into the model); ``probe_layout(rank)``: the layout the worker probed from SGLang's
  own ``load_weights`` at init.

The unit always receives into a staging copy (``staging=True``): the buffers change only on a
complete, applied version, so the unit is never torn. SGLang starts its scheduler processes with
``multiprocessing``, which refuses children of daemonic processes: the unit clears the rank
process's daemon flag; a watchdog kills SGLang's processes when the suite kills the rank process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from weightbridge.integrations.vllm.conformance import _start_watchdog, model_dir_of

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05  # poll() is one SGLang weight-update session; pace it on small CPU machines


class SGLangRolloutUnit:
    """One SGLang engine instance (all its TP workers) as a conformance-suite :class:`RolloutUnit`."""

    def __init__(self, ctx: Any, **engine_kwargs: Any) -> None:
        from weightbridge.integrations.sglang.cpu_engine import make_engine
        from weightbridge.integrations.sglang.driver import SGLangWeightSync

        resolved = ctx.resolved()
        self.ranks = tuple(ctx.ranks)
        self.label = f"rollout instance {ctx.instance} (ranks {list(self.ranks)})"
        tp = int(resolved.spec.rollout.mesh.get("tp", 1))
        if multiprocessing.current_process().daemon:  # SGLang starts its schedulers with multiprocessing
            multiprocessing.current_process().daemon = False
        self._watchdog = _start_watchdog()  # before SGLang starts any process
        from weightbridge.integrations.sglang.worker import TEST_HOOKS_ENV

        os.environ[TEST_HOOKS_ENV] = "1"  # the suite's fault hook travels pickled to the workers
        self.engine: Any = make_engine(model_dir_of(ctx.spec_path), tp, **engine_kwargs)
        try:
            kw = dict(ctx.bridge_kwargs())
            cache = Path(ctx.spec_path).resolve().parent.parent / "sglang-probe"  # once per suite run
            self.sync = SGLangWeightSync(
                self.engine, ctx.spec_path, host=kw.pop("host"), port=kw.pop("port"), instance=ctx.instance or 0,
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
        from weightbridge.errors import error_from_data

        wait = self._next_poll - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._next_poll = time.monotonic() + POLL_INTERVAL_S
        replies = self.sync.poll()
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
        applied = self.sync.update(want)
        if applied is None:
            from weightbridge.errors import ProtocolError

            raise ProtocolError(self.label, f"update({want}) returned no version")
        return applied

    @property
    def version(self) -> int | None:
        return self.sync.version

    @property
    def torn(self) -> bool:
        return False  # staging: the buffers change only on a complete version (see module doc)

    def tensors(self, rank: int) -> dict[str, Any]:
        return self.sync.buffers(self._index(rank))

    def probe_layout(self, rank: int) -> dict[str, Any]:
        layout = self.sync.probed_layout(self._index(rank))
        if layout is None:
            raise RuntimeError(f"{self.label}: rank {rank} did not probe SGLang's loader (probe='off')")
        return layout

    def close(self) -> None:
        try:
            self.sync.close()
        except Exception as exc:  # noqa: BLE001 - a dead engine (fault scenarios) has nothing to close
            log.debug("%s: close: %s", self.label, exc)
        self._shutdown()

    # -- internals ------------------------------------------------------------------------------
    def _index(self, rank: int) -> int:
        if rank not in self.ranks:
            raise ValueError(f"{self.label}: rank {rank} is not one of this instance's ranks {list(self.ranks)}")
        return self.ranks.index(rank)

    def _shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                engine.shutdown()
            except Exception as exc:  # noqa: BLE001 - already dead
                log.debug("%s: engine shutdown: %s", self.label, exc)
        dog, self._watchdog = self._watchdog, None
        if dog is not None:
            dog.kill()
            dog.wait(5)


def build_rollout(ctx: Any) -> SGLangRolloutUnit:
    """``wb_rollout`` factory (scope ``"instance"``): one SGLang engine per rollout instance."""
    return SGLangRolloutUnit(ctx)
