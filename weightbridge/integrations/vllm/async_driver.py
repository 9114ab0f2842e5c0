"""The driver side for ``vllm.v1.engine.async_llm.AsyncLLM`` (the engine RL frameworks embed).

Control calls only; no weights pass here. Created once per engine (one rollout instance)::

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model_dir, tensor_parallel_size=2,
                                       weight_transfer_config=WeightTransferConfig(backend="weightbridge")))
    sync = await AsyncVLLMWeightSync.create(engine, "weightbridge.yaml", host=H, port=P, instance=i)
    v = await sync.update(7, pause="keep")   # sync mode: wait for 7, apply it, label it "7"
    v = await sync.update(pause="wait")      # async mode: the newest version every worker staged, or None

Why a pause: ``AsyncLLM`` keeps stepping between the protocol's calls (each is one collective RPC
the engine core runs between steps). Without a pause a step could run while the model is between
``start_weight_update`` (checkpoint-format tensors restored on the meta device) and
``finish_weight_update``, and steps between the weights changing and ``weight_version`` changing
would carry the old label. ``update`` therefore runs ``pause_generation(mode)`` ->
start / update / finish(label) -> ``resume_generation()``, so every token's label in
``CompletionOutput.weight_versions`` is the version that sampled it (see
:mod:`weightbridge.integrations.vllm.protocol` for the modes and :func:`version_spans`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightbridge.integrations.vllm.protocol import BACKEND
from weightbridge.integrations._engine.init_command import prepare
from weightbridge.integrations._engine.driver import KV_CACHE, WEIGHTS
from weightbridge.integrations.vllm.protocol import check_pause, label, update_info

if TYPE_CHECKING:
    from weightbridge.runtime.options import BridgeOptions

log = logging.getLogger(__name__)


class AsyncVLLMWeightSync:
    """Connects one ``AsyncLLM`` (one rollout instance of the spec) to the bridge; use :meth:`create`."""

    def __init__(self, engine: Any, prepared: Any, instance: int, view: Any) -> None:
        self.engine = engine
        self.resolved = prepared.resolved
        self.instance = instance
        self.prefix = prepared.prefix
        self.timeout_s = prepared.timeout_s
        self.view = view
        self.version: int | None = None

    @classmethod
    async def create(cls, engine: Any, spec: str | Path, *, host: str, port: int, instance: int = 0,
                     staging: bool | None = None, probe: str = "check", cache_dir: str | None = None,
                     options: BridgeOptions | None = None, initial_version: int | None = None,
                     **moved: Any) -> AsyncVLLMWeightSync:
        """Validate the spec here, then ``init_weight_transfer_engine`` on every worker (each joins the
        bridge as rollout rank ``instance * world_size + worker rank``). Arguments as
        :class:`~weightbridge.integrations.vllm.driver.VLLMWeightSync`; ``initial_version``: label the
        weights the engine started with (``update_weight_version``) instead of ``"default"``."""
        from weightbridge.bridge import InstanceView

        backend = getattr(getattr(engine.vllm_config, "weight_transfer_config", None), "backend", None)
        if backend != BACKEND:
            raise ValueError(
                f"the engine's weight_transfer_config.backend is {backend!r}: create it with "
                f"AsyncEngineArgs(..., weight_transfer_config=WeightTransferConfig(backend={BACKEND!r}))"
            )
        prepared = prepare(spec, host=host, port=port, instance=instance, staging=staging, probe=probe,
                           cache_dir=cache_dir, options=options, where="AsyncVLLMWeightSync.create", moved=moved)
        view = await asyncio.to_thread(InstanceView.connect, prepared.resolved, instance, host=host, port=port,
                                       prefix=prepared.prefix, timeout_s=prepared.timeout_s)
        # vLLM only once the arguments and the spec are checked (a refusal needs no vLLM)
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=prepared.sealed()))
        if initial_version is not None:
            await engine.update_weight_version(label(initial_version))
        return cls(engine, prepared, instance, view)

    async def staged(self) -> int | None:
        """The newest version every worker of this instance has complete, or None."""
        return await asyncio.to_thread(self.view.staged)

    async def update(self, version: int | None = None, *, pause: str = "keep", clear_cache: bool = True,
                     timeout_s: float | None = None) -> int | None:
        """Make ``version`` live (wait for it up to ``timeout_s``) or, with None, the newest complete one.

        ``pause``: what happens to requests in flight (``keep``, ``wait``, ``abort``; see
        :data:`~weightbridge.integrations.vllm.protocol.PAUSE_MODES`); ``clear_cache``: vLLM's
        ``pause_generation(clear_cache=)``, which also drops the KV cache of kept requests (they are
        recomputed by the new weights). Returns the version now live, or None when ``version`` is
        None and nothing newer is complete (then nothing is paused). Raises what the workers raise;
        the engine then keeps serving the previous weights and label, and is resumed.
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        check_pause(pause)
        info = update_info(version, timeout_s or self.timeout_s)
        previous = self.version
        if version is None:
            ready = await self.staged()
            if ready is None or (previous is not None and ready <= previous):
                return None
        asleep = bool(await self.engine.is_sleeping())
        if asleep:  # as awake_for_update: weights first, the KV cache once the update succeeded
            await self.engine.wake_up(tags=[WEIGHTS])
        await self.engine.pause_generation(mode=pause, clear_cache=clear_cache)
        try:
            await self.engine.start_weight_update()
            try:
                await self.engine.update_weights(WeightTransferUpdateRequest(update_info=info))
            except BaseException:
                try:
                    await self._finish()
                except Exception as exc:  # noqa: BLE001 - logged; the update's own error is the one raised
                    log.warning("rollout instance %d: finishing after a failed update also failed: %s",
                                self.instance, exc)
                raise
            applied = await self._finish()
            if asleep:
                await self.engine.wake_up(tags=[KV_CACHE])
        finally:
            await self.engine.resume_generation()
        return applied if (version is not None or applied != previous) else None

    async def sleep(self, level: int = 1) -> None:
        """``AsyncLLM.sleep(level)`` after every worker released what its bridge keeps between updates; the
        next :meth:`update` wakes the weights, updates, then wakes the KV cache (as the ``LLM`` driver's)."""
        await self.engine.collective_rpc("weightbridge_release")
        await self.engine.sleep(level=level)

    async def _finish(self) -> int | None:
        """End the protocol, labelled with the version the workers now serve (read from the bridge)."""
        applied = None
        try:
            applied = await asyncio.to_thread(self.view.applied)
        finally:
            await self.engine.finish_weight_update(label(applied))
        self.version = applied
        return applied

    async def check(self, checkpoint_dir: str | Path) -> list[str]:
        """Every worker's bitwise check against vLLM's own load of ``checkpoint_dir`` (empty: equal);
        needs ``worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension"``."""
        per_worker = await self.engine.collective_rpc("weightbridge_check", args=(str(checkpoint_dir),))
        return [p for problems in per_worker for p in problems]
