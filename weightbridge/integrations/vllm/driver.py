"""The driver side: where the user's ``vllm.LLM`` lives. Control calls only; no weights pass here.

::

    sync = VLLMWeightSync(llm, "weightbridge.yaml", host=H, port=P, instance=i)   # once
    v = sync.update()          # async: apply the newest version the workers have complete (no wait)
    v = sync.update(7)         # sync: wait until version 7 arrived, apply it
    sync.version               # last applied version (also llm.get_weight_version())

Each ``update`` is vLLM's weight-update protocol: ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``, each a ``collective_rpc`` the engine core runs
between engine steps, so generation never sees a half-written model. In the workers each
``update_weights`` is the bridge's instance-level apply (``RolloutBridge.apply_instance``), so all
TP/PP workers apply the same version. The driver reads the instance's versions through the
bridge's :class:`~weightbridge.bridge.InstanceView` (never raw store keys): ``update()`` with no
version skips the protocol when nothing new is complete, and ``version`` is what every worker applied.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightbridge.integrations._engine.driver import InstanceDriver
from weightbridge.integrations.vllm.protocol import BACKEND

if TYPE_CHECKING:
    from weightbridge.runtime.options import BridgeOptions

log = logging.getLogger(__name__)


class VLLMWeightSync(InstanceDriver):
    """Connects one ``vllm.LLM`` (one rollout instance of the spec) to the bridge."""

    def __init__(self, llm: Any, spec: str | Path, *, host: str, port: int, instance: int = 0,
                 staging: bool | None = None, probe: str = "check", cache_dir: str | None = None,
                 options: BridgeOptions | None = None, **moved: Any) -> None:
        """``options``: the workers' :class:`~weightbridge.bridge.BridgeOptions` (``prefix``; ``on_round``
        only as a registered test hook, which reaches the workers by name:
        :mod:`weightbridge.integrations._engine.hooks`; no ``data_plane``). The init command is
        sealed with the job secret (``secret``, ``$WEIGHTBRIDGE_SECRET`` or the spec's
        ``sync.secret_file``), which the workers check against their own environment's.
        ``staging`` (default: the spec's) applies to every worker. The default wait of :meth:`update` is
        the spec's ``sync.timeout_s`` (``timeout_s=`` here is a ``TypeError`` saying so, as in ``from_spec``)."""
        backend = getattr(getattr(llm.llm_engine.vllm_config, "weight_transfer_config", None), "backend", None)
        if backend != BACKEND:
            raise ValueError(
                f"the LLM's weight_transfer_config.backend is {backend!r}: create it with "
                f"LLM(..., weight_transfer_config=WeightTransferConfig(backend={BACKEND!r}))"
            )
        prepared = self._connect(spec, host=host, port=port, instance=instance, staging=staging, probe=probe,
                                 cache_dir=cache_dir, options=options, moved=moved)
        self.llm = llm
        llm.init_weight_transfer_engine({"init_info": prepared.sealed()})

    def sleep(self, level: int = 1) -> None:
        """Put the engine to sleep (``LLM.sleep(level)``) after every worker released what its bridge keeps
        between updates (wire slabs; a staging copy stays: put it in host memory, ``sync.staging_memory``).
        The next :meth:`update` wakes the weights, updates, then wakes the KV cache (with ``level=2`` the
        update must bring every weight: a full push, no deltas)."""
        self.llm.collective_rpc("weightbridge_release")
        self.llm.sleep(level=level)

    def update(self, version: int | None = None, *, timeout_s: float | None = None) -> int | None:
        """Apply ``version`` (wait for it, up to ``timeout_s``) or, with None, the newest complete one.

        Returns the version now live, or None when ``version`` is None and nothing newer is
        complete. Raises what the workers raise (``DeadlineExceeded``, ``PeerFailed``, ...) wrapped
        by vLLM's RPC; the engine keeps serving the previous weights in that case, except in place
        (``sync.staging`` false), where the workers write as the bytes arrive: a failed update
        leaves them torn until the next complete one. An engine asleep is woken around the update
        (:func:`~weightbridge.integrations._engine.driver.awake_for_update`).
        """
        previous = self.version
        if version is None and self.newer_staged() is None:
            return None
        from weightbridge.integrations._engine.driver import awake_for_update

        with awake_for_update(self.llm.llm_engine.is_sleeping(), lambda tags: self.llm.wake_up(tags=tags)):
            return self._update(version, previous, timeout_s)

    def _update(self, version: int | None, previous: int | None, timeout_s: float | None) -> int | None:
        from weightbridge.integrations.vllm.protocol import update_info

        info = update_info(version, timeout_s or self.timeout_s)
        self.llm.start_weight_update()
        try:
            self.llm.update_weights({"update_info": info})
        except BaseException:
            # The engine keeps serving; finish the protocol, but never let that hide the update's error.
            try:
                self._finish()
            except Exception as exc:  # noqa: BLE001 - logged; the original error is the one raised
                log.warning("rollout instance %d: finishing after a failed update also failed: %s", self.instance, exc)
            raise
        applied = self._finish()
        return applied if (version is not None or applied != previous) else None

    def _finish(self) -> int | None:
        """End vLLM's update protocol with the version the workers now serve (read from the bridge)."""
        from weightbridge.integrations.vllm.protocol import label

        applied = None
        try:
            applied = self.view.applied()
        finally:
            self.llm.finish_weight_update(weight_version=label(applied))
        self.version = applied
        return applied
