"""Test hooks that reach engine workers by name, never as code.

The conformance suite injects faults through ``BridgeOptions.on_round`` (a callable the bridge
calls after each round). In-process bridges call it as it is. An engine's workers are other
processes reached through the engine's RPC or HTTP routes, which a stranger can reach too: code
must never travel that way. So a hook that should run in an engine worker is one of the
:data:`REGISTRY` (a fixed map in this file, name -> class), sent as its name and plain JSON
parameters (:class:`HookRef`). The worker builds it only when its *own* environment enables
test hooks (``WEIGHTBRIDGE_TEST_HOOKS=1``, set by the engine conformance units before they start
an engine); otherwise the init is refused (:class:`~weightbridge.errors.InitRefused`).

A registered class has a ``hook_name`` (its key here) and ``hook_params()`` (its constructor's
keyword arguments, JSON scalars); the worker calls ``cls(**params)``.
"""

from __future__ import annotations

import os
import pkgutil
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from weightbridge.errors import InitRefused

TEST_HOOKS_ENV = "WEIGHTBRIDGE_TEST_HOOKS"

# name -> "module:Class"; fixed here (nothing received can add to it)
REGISTRY: MappingProxyType[str, str] = MappingProxyType({
    "suite.kill-after-round": "weightbridge.testing.contract:FaultHook",
})

Scalar = str | int | float | bool | None


class HookRef(BaseModel):
    """A registered hook as it travels: its name and its constructor's keyword arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(max_length=100)
    params: dict[str, Scalar] = Field(default_factory=dict, max_length=32)


def record_writes() -> None:
    """Test harnesses, before an engine starts: enable test hooks in the environment its workers inherit,
    which also makes a streaming worker keep a CPU copy of every tensor it writes into the engine (the
    bitwise check of the checkpoint format: :mod:`weightbridge.integrations._engine.verify`)."""
    os.environ.setdefault(TEST_HOOKS_ENV, "1")


def enabled() -> bool:
    """Whether this process's environment lets init commands carry a test hook."""
    return os.environ.get(TEST_HOOKS_ENV) == "1"


def describe(on_round: Callable[[int], None] | None) -> HookRef | None:
    """Driver side: ``BridgeOptions.on_round`` as a :class:`HookRef`; ``ValueError`` for a callable
    that is not a registered hook (it cannot reach the engine's workers)."""
    if on_round is None:
        return None
    name = getattr(on_round, "hook_name", None)
    cls = type(on_round)
    if name not in REGISTRY or REGISTRY[name] != f"{cls.__module__}:{cls.__qualname__}":
        raise ValueError(
            f"BridgeOptions.on_round={on_round!r} cannot reach the engine's worker processes: only the "
            f"registered test hooks ({', '.join(sorted(REGISTRY))}) can, by name"
        )
    return HookRef(name=name, params=dict(on_round.hook_params()))


def build(ref: HookRef | None, me: str) -> Callable[[int], None] | None:
    """Engine side: the hook ``ref`` names, or :class:`~weightbridge.errors.InitRefused` when this
    process does not enable test hooks, the name is not registered or the parameters do not fit."""
    if ref is None:
        return None
    if not enabled():
        raise InitRefused(me, f"the init carries the test hook {ref.name!r}, and this engine's environment does "
                              f"not enable test hooks ({TEST_HOOKS_ENV}=1: tests only)")
    target = REGISTRY.get(ref.name)
    if target is None:
        raise InitRefused(me, f"unknown test hook {ref.name[:100]!r} (registered: {', '.join(sorted(REGISTRY))})")
    cls: Any = pkgutil.resolve_name(target)
    try:
        return cls(**ref.params)
    except TypeError as exc:
        raise InitRefused(me, f"test hook {ref.name!r}: parameters do not fit ({exc})") from None
