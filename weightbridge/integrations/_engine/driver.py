"""What every engine's driver keeps: the checked spec, the instance's versions on the control store.

A driver lives where the engine's handle is (``vllm.LLM``, ``sglang.Engine``, a client of their
HTTP servers) and sends control calls only. :class:`InstanceDriver` validates the spec before any
call (:func:`~weightbridge.integrations._engine.init_command.prepare`) and reads the versions of
its rollout instance through the bridge's :class:`~weightbridge.bridge.InstanceView` (never raw
store keys); the engine-specific subclass sends the init command and the updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightbridge.integrations._engine.init_command import Prepared, prepare

if TYPE_CHECKING:
    from weightbridge.runtime.options import BridgeOptions

WEIGHTS, KV_CACHE = "weights", "kv_cache"  # vLLM's and SGLang's memory tags


@contextmanager
def awake_for_update(asleep: bool, wake: Callable[[list[str]], Any]) -> Iterator[None]:
    """An update of an engine that may be asleep (vLLM's ``sleep``, SGLang's ``release_memory_occupation``):
    the weights are woken first (``wake(["weights"])``: the update writes into them), the KV cache only
    once the update succeeded (``wake(["kv_cache"])``), so the update never has the KV cache's memory
    against it. A failed update leaves the KV cache asleep (the engine is not made to serve torn or old
    weights) and raises."""
    if asleep:
        wake([WEIGHTS])
    yield
    if asleep:
        wake([KV_CACHE])


class InstanceDriver:
    """The engine-independent state of a driver of one rollout instance."""

    def _connect(self, spec: str | Path, *, host: str, port: int, instance: int, staging: bool | None, probe: str,
                 cache_dir: str | None, options: BridgeOptions | None, moved: dict[str, Any]) -> Prepared:
        """Check the spec (its errors, with file:line, before any call) and open the instance's view."""
        from weightbridge.bridge import InstanceView

        prepared = prepare(spec, host=host, port=port, instance=instance, staging=staging, probe=probe,
                           cache_dir=cache_dir, options=options, where=type(self).__name__, moved=moved)
        self.resolved = prepared.resolved
        self.instance = instance
        self.prefix = prepared.prefix
        self.timeout_s = prepared.timeout_s
        self.version: int | None = None  # what every worker applied last (read back, never assumed)
        self.view = InstanceView.connect(self.resolved, instance, host=host, port=port, prefix=self.prefix,
                                         timeout_s=self.timeout_s)
        self.rollout_ranks = list(self.view.ranks)
        return prepared

    def staged(self) -> int | None:
        """The newest version every worker of this instance has complete, or None."""
        return self.view.staged()

    def newer_staged(self) -> int | None:
        """The version ``update()`` without a version applies: the staged one if newer than the live one."""
        ready = self.staged()
        return None if ready is None or (self.version is not None and ready <= self.version) else ready
