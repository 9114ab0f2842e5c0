"""The root of every error the runtime raises on purpose (catch ``weightbridge.BridgeError``).

::

    BridgeError
      TransportError(rank, peer, round, message)   data plane (weightbridge.transport.errors):
        PeerTimeout, PeerDisconnected, ChecksumError
      PeerFailed, DeadlineExceeded, HandshakeMismatch, TornModelError, NothingToApply
                                                    control plane (weightbridge.sync.errors)
"""

from __future__ import annotations

from typing import Any


class BridgeError(RuntimeError):
    """Base class of the runtime's errors; each subclass names the rank that raised it and the peer.

    Picklable with the subclass's own constructor arguments, so an error raised in a rank process
    reaches its launcher (multiprocessing, vLLM's RPC) as the same type with the same fields.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> BridgeError:
        self = super().__new__(cls, *args)
        self._init_args = (args, kwargs)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        args, kwargs = getattr(self, "_init_args", (self.args, {}))
        return (_rebuild, (type(self), args, kwargs))


def _rebuild(cls: type[BridgeError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> BridgeError:
    return cls(*args, **kwargs)
