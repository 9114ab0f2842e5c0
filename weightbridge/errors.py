"""The root of every error the runtime raises on purpose (catch ``weightbridge.BridgeError``).

::

    BridgeError
      TransportError(rank, peer, round, message)   data plane (weightbridge.transport.errors):
        PeerTimeout, PeerDisconnected, ChecksumError
      PeerFailed, DeadlineExceeded, HandshakeMismatch, TornModelError, NothingToApply
                                                    control plane (weightbridge.sync.errors)
"""

from __future__ import annotations


class BridgeError(RuntimeError):
    """Base class of the runtime's errors; each subclass names the rank that raised it and the peer."""
