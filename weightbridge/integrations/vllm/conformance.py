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
passed through) and reaches the workers through the WorkerExtension RPCs (``weightbridge_poll``,
``weightbridge_buffers``, ``weightbridge_probed_layout``). What every engine's unit shares
(polling, applying, staging, the watchdog, the fault hook by name):
:class:`weightbridge.integrations._engine.conformance.EngineRolloutUnit`.
"""

from __future__ import annotations

from typing import Any

from weightbridge.integrations._engine.conformance import EngineRolloutUnit
from weightbridge.integrations.vllm import error_from_data, tensors_from_data

SHUTDOWN_S = 20.0


class VLLMRolloutUnit(EngineRolloutUnit):
    """One vLLM engine instance (all its TP workers) as a conformance-suite :class:`RolloutUnit`."""

    POLL_INTERVAL_S = 0.02  # poll() is one RPC round trip to every worker
    probe_cache = "vllm-probe"

    def __init__(self, ctx: Any, *, in_process: bool = True, **llm_kwargs: Any) -> None:
        """``llm_kwargs``: more ``vllm.LLM`` arguments (over :func:`~weightbridge.integrations.vllm.cpu_engine.make_llm`'s
        CPU settings). ``in_process``: the engine core (and at TP 1 the single worker) runs in this
        rank process: two process starts and vLLM imports fewer, ~25 s per scenario on a small CPU
        machine; TP > 1 keeps vLLM's workers. No checkpoint is needed: without weights beside the
        spec's ``model.config`` (or with ``model.bundled``) vLLM builds the model with dummy weights
        (:func:`~weightbridge.integrations._engine.conformance.engine_model`)."""
        from weightbridge.integrations._engine.conformance import engine_model
        from weightbridge.integrations.vllm.cpu_engine import make_llm
        from weightbridge.integrations.vllm.driver import VLLMWeightSync

        tp = int(ctx.resolved().spec.rollout.mesh.get("tp", 1))
        model_dir, has_weights = engine_model(ctx.spec_path, ctx.workdir)
        if not has_weights:
            llm_kwargs.setdefault("load_format", "dummy")
        self._start(ctx, lambda: make_llm(model_dir, tp, in_process=in_process, **llm_kwargs),
                    lambda **kw: VLLMWeightSync(self.engine, ctx.spec_path, staging=True, probe="check", **kw))

    def _poll_workers(self) -> list[dict[str, Any]]:
        return self.engine.collective_rpc("weightbridge_poll")

    def _update(self, version: int) -> int | None:
        try:
            return self.sync.update(version)
        except Exception as exc:  # vLLM's RPC re-raises the workers' error untyped: fetch it typed
            typed = [e for e in self.engine.collective_rpc("weightbridge_last_error") if e is not None]
            if typed:
                raise error_from_data(typed[0]) from exc
            raise

    def _buffers(self, index: int) -> dict[str, Any]:
        return tensors_from_data(self.engine.collective_rpc("weightbridge_buffers")[index])

    def _probed(self, index: int) -> dict[str, Any] | None:
        return self.engine.collective_rpc("weightbridge_probed_layout")[index]

    def _leave(self) -> None:
        self.engine.collective_rpc("shutdown_weight_transfer_engine")

    def _stop_engine(self, engine: Any) -> None:
        engine.llm_engine.engine_core.shutdown(timeout=SHUTDOWN_S)


def build_rollout(ctx: Any) -> VLLMRolloutUnit:
    """``wb_rollout`` factory (scope ``"instance"``): one vLLM engine per rollout instance."""
    return VLLMRolloutUnit(ctx)


# What a vLLM engine needs from the suite (ConformanceSuite uses these unless the class sets its own):
# an engine start with the loader probe takes 30-150 s on a small CPU machine, and an update waits
# for the engine's RPCs beside the trainer's push.
build_rollout.suite_settings = {"startup_s": 180.0, "timeout_s": 10.0}
