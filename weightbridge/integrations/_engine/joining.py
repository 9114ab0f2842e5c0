"""A worker's join of the bridge from an init command, in two steps so a refusal changes nothing.

:func:`admit` (the command's seal and freshness, the test hook, the spec, this worker's rank of
the spec against the engine's mesh) and then the engine's probe check touch nothing the worker
runs; only then does the worker leave the bridge it ran (if any) and call :func:`open_bridge`. A refused, forged or
mismatched re-init therefore leaves the running bridge as it was. Called in the engine's worker
thread (vLLM: ``init_transfer_engine``; SGLang: the ``init`` command).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightbridge.errors import EngineMismatch
from weightbridge.integrations._engine import hooks
from weightbridge.integrations._engine.init_command import InitGate, InitPayload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admitted:
    """An init command that passed every check, and what this worker is in the spec."""

    cmd: InitPayload
    resolved: Any  # ResolvedSpec
    layout: Any  # this worker's RankLayout (rollout rank instance * ranks-per-instance + index)
    me: str  # "rollout R (instance I, <engine> <worker>)"
    on_round: Callable[[int], None] | None
    timeout_s: float


def admit(gate: InitGate, payload: Any, seal: Any, *, me: str, engine: str, index: int,
          mesh: Mapping[str, int], world: int, worker: str) -> Admitted:
    """Check an init command for this worker; raises ``InitRefused``, ``SpecErrors`` or ``EngineMismatch``.

    ``index``: this worker's index within its engine (vLLM's worker rank, SGLang's TP rank);
    ``mesh``: the engine's parallel sizes under the spec's mesh names (e.g. ``{"tp": 2, "pp": 1}``),
    which must equal the spec's rollout mesh; ``world``: the engine's worker count; ``worker``:
    how the engine names this worker in messages (``"vLLM worker 1"``).
    """
    from weightbridge.spec.errors import SpecErrors
    from weightbridge.spec.resolve import check_text

    cmd = gate.open(payload, seal, me)
    on_round = hooks.build(cmd.test_hook, me)
    resolved, problems = check_text(cmd.spec, cmd.spec_name, Path(cmd.base_dir) if cmd.base_dir else None)
    if problems or resolved is None:
        raise SpecErrors(problems)
    rollout = resolved.rollout
    if not 0 <= cmd.instance < rollout.num_instances:
        raise EngineMismatch(me, f"instance {cmd.instance} out of range: the spec has {rollout.num_instances}")
    ranks = sorted(rollout.instance_ranks(cmd.instance), key=lambda r: r.local_rank)
    spec_mesh = resolved.spec.rollout.mesh
    have = {k: int(spec_mesh.get(k, 1)) for k in mesh}
    if len(ranks) != world or have != dict(mesh):
        sizes = ", ".join(f"{k} {v}" for k, v in mesh.items())
        raise EngineMismatch(me, f"the spec's rollout mesh {have} ({len(ranks)} ranks per instance) does not match "
                                 f"this {engine} engine ({sizes}, {world} workers)")
    layout = ranks[index]
    return Admitted(cmd, resolved, layout, f"rollout {layout.rank} (instance {cmd.instance}, {worker})", on_round,
                    float(cmd.timeout_s or resolved.sync.timeout_s))


def open_bridge(admitted: Admitted, device: Any = None) -> Any:
    """The worker's :class:`~weightbridge.bridge.RolloutBridge`, streaming (no receive buffers: each update
    writes into the sink its call gives) with its tensors on ``device``; logged as the worker's join."""
    from weightbridge.bridge import BridgeOptions, RolloutBridge

    cmd = admitted.cmd
    bridge = RolloutBridge.from_spec(
        admitted.resolved, rank=admitted.layout.rank, tensors=None, host=cmd.host, port=cmd.port,
        staging=cmd.staging, device=device, options=BridgeOptions(prefix=cmd.prefix, on_round=admitted.on_round),
    )
    log.info("weightbridge: %s joined (%d local tensors, staging=%s)", admitted.me, len(admitted.layout.tensors),
             bridge.staging)
    return bridge


def written_shard(written: Mapping[str, Any], bridge: Any) -> dict[str, Any]:
    """A worker's checkpoint-format shard as last written into its model (its ``buffers``): with test hooks,
    ``written`` (the copies of what was written); else the bridge's staging copy (async: it may already hold
    a newer, unapplied version); else nothing (a streaming worker keeps no copy)."""
    if written:
        return dict(written)
    staging = bridge.staging_tensors if bridge is not None else None
    return dict(staging) if staging else {}


def poll_report(bridge: Any) -> dict[str, Any]:
    """The worker's ``bridge.poll()`` for its driver: ``{"staged", "version", "error"}``; ``error`` is
    None or a failed receive's typed error as plain data (:func:`~weightbridge.errors.error_data`)."""
    from weightbridge.errors import BridgeError, error_data

    out: dict[str, Any] = {"staged": None, "version": bridge.version, "error": None}
    try:
        bridge.poll()
    except BridgeError as exc:
        out["error"] = error_data(exc)
    out["staged"] = bridge.staged_version
    return out
