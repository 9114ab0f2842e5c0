"""weightbridge: move updated weights from RL trainers to rollout engines.

The pure core (``weightbridge.spec``, ``weightbridge.layout``, ``weightbridge.plan``)
imports no ``torch`` and runs without a process group. Names below are imported
lazily, so ``import weightbridge`` stays cheap (and ``weightbridge.load_spec`` needs no torch).

* ``load_spec(path_or_text)`` -> :class:`ResolvedSpec` (raises :class:`SpecErrors` with every problem);
* ``TrainerBridge`` / ``RolloutBridge`` / ``ColocatedBridge``: the runtime (``weightbridge.bridge``);
  ``BridgeOptions``: their per-process options (store key prefix, test hooks);
* ``open_store(host, port, is_master=..., timeout_s=...)``: host the control store outside
  trainer rank 0, so ranks may stop in any order (bridges then get ``store=`` or ``host``/``port``);
* ``trainer_tensors(model)``: a trainer rank's tensors by name (DTensor parameters' local shards and
  the persistent buffers that are checkpoint tensors), what ``TrainerBridge`` takes.
"""

from __future__ import annotations

from weightbridge._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "load_spec": "weightbridge.spec.resolve",
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
    "ReceiveStats": "weightbridge.bridge",
    "InstanceView": "weightbridge.bridge",
    "BridgeOptions": "weightbridge.bridge",
    "BridgeError": "weightbridge.errors",
    "PeerFailed": "weightbridge.errors",
    "DeadlineExceeded": "weightbridge.errors",
    "HandshakeMismatch": "weightbridge.errors",
    "DeviceConflict": "weightbridge.errors",
    "TornModelError": "weightbridge.errors",
    "NothingToApply": "weightbridge.errors",
    "StoreUnreachable": "weightbridge.errors",
    "AuthError": "weightbridge.errors",
    "ForgedMessage": "weightbridge.errors",
    "TransportError": "weightbridge.transport.errors",
    "open_store": "weightbridge.transport.store",
    "trainer_tensors": "weightbridge.tensors",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
