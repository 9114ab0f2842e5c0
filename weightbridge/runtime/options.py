"""``BridgeOptions``: the per-process options of ``from_spec`` (where on the store, test hooks).

Everything every rank must agree on (checksums, receiver de-replication, heartbeat, deadline,
round size, how many instances a push waits for) is in the spec's ``sync:`` section, so the spec
hash compared at the handshake guarantees agreement. What is left per process is here, plus
``host`` / ``port`` / ``store`` and (rollout) ``staging`` on ``from_spec`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BridgeOptions", "reject_moved"]


@dataclass(frozen=True)
class BridgeOptions:
    """Per-process options of ``TrainerBridge`` / ``RolloutBridge.from_spec`` (picklable when its hooks are).

    ``prefix``: the control-store key prefix of this bridge (several bridges on one store, e.g. one
    per phase, each use their own; every rank of one bridge passes the same). ``on_round``:
    called with the round index after each round this rank sends or receives (progress; the
    conformance suite's fault injection). ``data_plane``: a
    :class:`~weightbridge.sync.dataplane.DataPlane` replacing the transport (tests). ``before_push``
    (trainer ranks): called at the start of every ``push``, before anything is announced or sent; what
    it raises, ``push`` raises, having changed nothing (e.g. Megatron's deferred parameter all-gather:
    :func:`weightbridge.integrations.megatron.param_sync_hook`). ``secret``:
    the job secret (the same on every rank of the bridge), taking precedence over
    ``$WEIGHTBRIDGE_SECRET`` and the spec's ``sync.secret_file`` (:mod:`weightbridge.sync.auth`);
    never shown in the options' ``repr``.
    """

    prefix: str = "wb"
    on_round: Callable[[int], None] | None = None
    before_push: Callable[[], None] | None = None
    data_plane: Any = None  # weightbridge.sync.dataplane.DataPlane | None
    secret: str | bytes | None = field(default=None, repr=False)


# Keyword arguments ``from_spec`` took before they moved: where each went.
_MOVED = {
    "checksums": "set sync.checksums in the spec",
    "receiver_dedup": "set sync.receiver_dedup in the spec",
    "heartbeat_s": "set sync.heartbeat_s in the spec",
    "min_instances": "set sync.min_instances in the spec",
    "timeout_s": "set sync.timeout_s in the spec",
    "round_bytes": "set sync.round_bytes in the spec",
    "prefix": "pass options=BridgeOptions(prefix=...)",
    "on_round": "pass options=BridgeOptions(on_round=...)",
    "data_plane": "pass options=BridgeOptions(data_plane=...)",
}


def reject_moved(where: str, given: Mapping[str, Any]) -> None:
    """``TypeError`` for keyword arguments ``where`` no longer takes, saying where each went."""
    if not given:
        return
    hints = []
    for name in sorted(given):
        hint = _MOVED.get(name)
        hints.append(f"{name}= ({hint})" if hint else f"{name}= (unknown)")
    raise TypeError(
        f"{where}() got unexpected keyword argument(s): {', '.join(hints)}. Settings every rank must agree on "
        "are in the spec's sync: section (the spec hash checks them at the handshake); per-process hooks are "
        "in weightbridge.BridgeOptions"
    )
