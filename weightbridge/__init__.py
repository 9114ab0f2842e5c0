"""weightbridge: move updated weights from RL trainers to rollout engines.

The pure core (``weightbridge.spec``, ``weightbridge.layout``, ``weightbridge.plan``)
imports no ``torch`` and runs without a process group. Names below are imported
lazily, so ``import weightbridge`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "resolve_spec": "weightbridge.spec.resolve",
    "check_spec": "weightbridge.spec.resolve",
    "check_text": "weightbridge.spec.resolve",
    "ResolvedSpec": "weightbridge.spec.resolve",
    "SpecErrors": "weightbridge.spec.errors",
    "SpecProblem": "weightbridge.spec.errors",
    "CanonicalModel": "weightbridge.layout.ir",
    "CanonicalTensor": "weightbridge.layout.ir",
    "LocalTensor": "weightbridge.layout.ir",
    "Piece": "weightbridge.layout.ir",
    "RankLayout": "weightbridge.layout.ir",
    "SideLayout": "weightbridge.layout.ir",
    "load_canonical": "weightbridge.canonical",
    "build_plan": "weightbridge.plan",
    "validate_plan": "weightbridge.plan",
    "plan_metrics": "weightbridge.plan",
    "TransferPlan": "weightbridge.plan",
    "TrainerBridge": "weightbridge.bridge",
    "RolloutBridge": "weightbridge.bridge",
    "ColocatedBridge": "weightbridge.bridge",
    "PushStats": "weightbridge.bridge",
    "BridgeError": "weightbridge.errors",
    "PeerFailed": "weightbridge.sync.errors",
    "DeadlineExceeded": "weightbridge.sync.errors",
    "HandshakeMismatch": "weightbridge.sync.errors",
    "TornModelError": "weightbridge.sync.errors",
    "TransportError": "weightbridge.transport.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'weightbridge' has no attribute {name!r}")
