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
passed through) and reaches the workers through the driver's commands (``poll``, ``buffers``,
``probed``). What every engine's unit shares (polling, applying, staging, the watchdog, the fault
hook by name): :class:`weightbridge.integrations._engine.conformance.EngineRolloutUnit`.
"""

from __future__ import annotations

from typing import Any

from weightbridge.integrations._engine.conformance import EngineRolloutUnit


class SGLangRolloutUnit(EngineRolloutUnit):
    """One SGLang engine instance (all its TP workers) as a conformance-suite :class:`RolloutUnit`."""

    POLL_INTERVAL_S = 0.05  # poll() is one SGLang weight-update session
    probe_cache = "sglang-probe"

    def __init__(self, ctx: Any, **engine_kwargs: Any) -> None:
        """``engine_kwargs``: more ``sglang.Engine`` arguments (over
        :data:`~weightbridge.integrations.sglang.cpu_engine.ENGINE_ARGS`). No checkpoint is needed:
        without weights beside the spec's ``model.config`` (or with ``model.bundled``) SGLang builds
        the model with dummy weights (:func:`~weightbridge.integrations._engine.conformance.engine_model`)."""
        from weightbridge.integrations._engine.conformance import engine_model
        from weightbridge.integrations.sglang.cpu_engine import make_engine
        from weightbridge.integrations.sglang.driver import SGLangWeightSync

        tp = int(ctx.resolved().spec.rollout.mesh.get("tp", 1))
        model_dir, has_weights = engine_model(ctx.spec_path, ctx.workdir)
        if not has_weights:
            engine_kwargs.setdefault("load_format", "dummy")
        self._start(ctx, lambda: make_engine(model_dir, tp, **engine_kwargs),
                    lambda **kw: SGLangWeightSync(self.engine, ctx.spec_path, staging=True, probe="check", **kw))

    def _poll_workers(self) -> list[dict[str, Any]]:
        return self.sync.poll()

    def _buffers(self, index: int) -> dict[str, Any]:
        return self.sync.buffers(index)

    def _probed(self, index: int) -> dict[str, Any] | None:
        return self.sync.probed_layout(index)

    def _leave(self) -> None:
        self.sync.close()

    def _stop_engine(self, engine: Any) -> None:
        engine.shutdown()


def build_rollout(ctx: Any) -> SGLangRolloutUnit:
    """``wb_rollout`` factory (scope ``"instance"``): one SGLang engine per rollout instance."""
    return SGLangRolloutUnit(ctx)


# What an SGLang engine needs from the suite (ConformanceSuite uses these unless the class sets its
# own): an engine start takes 25-150 s on a small CPU machine; every command is an SGLang session.
build_rollout.suite_settings = {"startup_s": 300.0, "timeout_s": 15.0}
