"""Versions, modes and the control plane of the runtime (the public API is :mod:`weightbridge.bridge`).

* :mod:`.messages` — typed JSON control messages and the store key layout;
* :mod:`.control` — ``ControlPlane``: deadlines on every wait, failure fan-out, heartbeats, handshake;
* :mod:`.membership` — the rollout instances of an epoch, their plan, dtype digests;
* :mod:`.dataplane` — the seam to :mod:`weightbridge.transport` (one bridge group per epoch);
* :mod:`.errors` — ``PeerFailed``, ``DeadlineExceeded``, ``HandshakeMismatch``, ``TornModelError``;
* :mod:`.verify` — compare local tensors bitwise with canonical ones (tests, demo).
"""

from weightbridge.sync.errors import (
    BridgeError,
    DeadlineExceeded,
    HandshakeMismatch,
    NothingToApply,
    PeerFailed,
    RankId,
    TornModelError,
)

__all__ = [
    "BridgeError",
    "DeadlineExceeded",
    "HandshakeMismatch",
    "NothingToApply",
    "PeerFailed",
    "RankId",
    "TornModelError",
]
