"""Factories for the weightbridge conformance suite, and seven documented ways to break the integration.

The suite calls ``build_trainer(ctx)`` in each trainer rank process and ``build_rollout(ctx)`` in
each rollout rank process (see ``weightbridge.testing``). ``BREAKAGES`` maps a name to the
factories that build a deliberately broken integration and the requirement id that must catch it
(``TOYRL_BREAK=<name>`` selects one in ``conftest.py``).
"""

from __future__ import annotations

import dataclasses
import time

from weightbridge.errors import BridgeError, DeadlineExceeded

from toyrl.engine import ToyEngine
from toyrl.model import ToyConfig
from toyrl.trainer import ToyTrainer
from toyrl.weightsync import EngineSync, TrainerSync


def build_trainer(ctx, cls=TrainerSync, secret=None):
    """Trainer rank ``ctx.rank``: a ToyTrainer shard and its sender."""
    trainer = ToyTrainer(ToyConfig(), rank=ctx.rank, world=ctx.world_size)
    return cls(trainer, ctx.spec_path, rank=ctx.rank, **_kwargs(ctx, secret))


def build_rollout(ctx, cls=EngineSync, engine_cls=ToyEngine, secret=None):
    """Rollout rank ``ctx.rank`` (scope "rank"): a ToyEngine TP rank and its receiver."""
    engine = _engine(ctx.resolved(), ctx.rank, engine_cls)
    return cls(engine, ctx.spec_path, rank=ctx.rank, **_kwargs(ctx, secret))


def _engine(resolved, rank, engine_cls=ToyEngine):
    """A fresh ToyEngine for rollout rank ``rank`` of the spec (its TP rank within its instance)."""
    layout = resolved.rollout.ranks[rank]
    return engine_cls(ToyConfig(), tp_rank=layout.local_rank, tp_size=len(resolved.rollout.instance_ranks(0)))


def probe_rank(resolved, side, rank):
    """``weightbridge probe weightbridge.yaml --loader toyrl.conformance:probe_rank --side rollout --rank R``:
    a fresh ToyEngine rank's own loader and its weights, for probing (no bridge, no process group)."""
    if side != "rollout":
        raise ValueError("toyrl's probe factory builds engine ranks: use --side rollout")
    engine = _engine(resolved, rank)
    return engine.load_weights, lambda: engine.params


def _kwargs(ctx, secret=None):
    """The suite's bridge kwargs; ``secret``: the hard-coded-secret breakage (the real integration takes the
    job secret from the environment, ``WEIGHTBRIDGE_SECRET``, like every weightbridge process)."""
    kw = ctx.bridge_kwargs()
    if secret is not None:
        kw["options"] = dataclasses.replace(kw["options"], secret=secret)
    return kw


# ---------------------------------------------------------------------------------------------
# Broken on purpose (each a plausible integration bug)
# ---------------------------------------------------------------------------------------------


class UpFirstEngine(ToyEngine):
    """fused-order: the engine fuses [up; gate] while the spec says [gate; up]."""

    gate_first = False


class LaggingVersionSync(EngineSync):
    """lagging-version: .version reports the version that was live before the last apply()."""

    _before = None

    def apply(self) -> int:
        self._before = self.bridge.version
        return super().apply()

    @property
    def version(self):
        return self._before


class SwallowingSync(EngineSync):
    """swallow-errors: poll() hides bridge failures ("keep serving, retry later")."""

    def poll(self) -> bool:
        try:
            return super().poll()
        except BridgeError:
            return False


class RetryingTrainerSync(TrainerSync):
    """retry-on-deadline: push() retries twice when nobody receives (so it fails late)."""

    def push(self, version: int):
        for _ in range(2):
            try:
                return super().push(version)
            except DeadlineExceeded:
                time.sleep(0.1)
        return super().push(version)


class HiddenTornSync(EngineSync):
    """torn-hidden: .torn reads the engine's own "update in progress" flag, cleared in a finally."""

    @property
    def torn(self) -> bool:
        return False


class GiveUpTrainerSync(TrainerSync):
    """give-up-after-error: push() remembers the first failure and raises it again at every later push."""

    _failed = None

    def push(self, version: int):
        if self._failed is not None:
            raise self._failed
        try:
            return super().push(version)
        except BridgeError as exc:
            self._failed = exc
            raise


# hard-coded-secret: the job secret written in the code, so every process running it holds it
TOY_SECRET = "toyrl-shared-secret-0001"


def _rollout(**kw):
    def factory(ctx):
        return build_rollout(ctx, **kw)
    return factory


def _trainer(**kw):
    def factory(ctx):
        return build_trainer(ctx, **kw)
    return factory


build_rollout_fused_order = _rollout(engine_cls=UpFirstEngine)
build_rollout_lagging_version = _rollout(cls=LaggingVersionSync)
build_rollout_swallow_errors = _rollout(cls=SwallowingSync)
build_trainer_retry_on_deadline = _trainer(cls=RetryingTrainerSync)
build_rollout_torn_hidden = _rollout(cls=HiddenTornSync)
build_trainer_give_up = _trainer(cls=GiveUpTrainerSync)
build_trainer_fixed_secret = _trainer(secret=TOY_SECRET)
build_rollout_fixed_secret = _rollout(secret=TOY_SECRET)

# name -> (trainer factory name, rollout factory name, the requirement that must fail)
BREAKAGES: dict[str, tuple[str, str, str]] = {
    "fused-order": ("build_trainer", "build_rollout_fused_order", "layout.rollout.probe-agrees"),
    "lagging-version": ("build_trainer", "build_rollout_lagging_version", "sync.version.visible"),
    "swallow-errors": ("build_trainer", "build_rollout_swallow_errors", "fault.sender-dies.typed-error"),
    "retry-on-deadline": ("build_trainer_retry_on_deadline", "build_rollout", "fault.no-receiver.deadline"),
    "torn-hidden": ("build_trainer", "build_rollout_torn_hidden", "fault.torn-state.safe"),
    "give-up-after-error": ("build_trainer_give_up", "build_rollout", "async.failed-push.heals"),
    "hard-coded-secret": ("build_trainer_fixed_secret", "build_rollout_fixed_secret",
                          "auth.unauthenticated-sender.refused"),
}


def factories(breakage: str = "") -> tuple[str, str]:
    """``module:name`` of the trainer and rollout factories for ``breakage`` ('' = the real integration)."""
    if not breakage:
        return f"{__name__}:build_trainer", f"{__name__}:build_rollout"
    if breakage not in BREAKAGES:
        raise ValueError(f"unknown breakage {breakage!r}; known: {', '.join(BREAKAGES)}")
    trainer, rollout, _ = BREAKAGES[breakage]
    return f"{__name__}:{trainer}", f"{__name__}:{rollout}"
