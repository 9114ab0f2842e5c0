"""Typed data-plane errors. Every one names the rank that raised it and the peer involved."""

from __future__ import annotations

from weightbridge.errors import BridgeError


class TransportError(BridgeError):
    """A data-plane failure on bridge rank ``rank`` while talking to bridge rank ``peer`` in ``round``.

    ``peer`` is None when no single peer is to blame (e.g. group creation); ``round`` is None
    outside of a round. Ranks are **bridge-world** ranks (trainer t -> t, rollout r -> S + r).
    """

    def __init__(self, rank: int, peer: int | None, round: int | None, message: str) -> None:
        self.rank = rank
        self.peer = peer
        self.round = round
        self.message = message
        where = f"bridge rank {rank}"
        if peer is not None:
            where += f", peer {peer}"
        if round is not None:
            where += f", round {round}"
        super().__init__(f"{type(self).__name__} ({where}): {message}")

    def __reduce__(self):  # picklable across processes with its fields
        return (type(self), (self.rank, self.peer, self.round, self.message))


class PeerTimeout(TransportError):
    """A wait on ``peer`` exceeded the group's deadline (``timeout_s``)."""


class PeerDisconnected(TransportError):
    """``peer`` went away (connection closed, process crashed) or the backend reported an error."""


class ChecksumError(TransportError):
    """The bytes received from ``peer`` do not match the checksum it sent."""

    def __init__(self, rank: int, peer: int | None, round: int | None, message: str = "checksum mismatch") -> None:
        super().__init__(rank, peer, round, message)


def classify(exc: BaseException) -> type[TransportError]:
    """Map a backend exception to :class:`PeerTimeout` or :class:`PeerDisconnected` by its message."""
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text or isinstance(exc, TimeoutError):
        return PeerTimeout
    return PeerDisconnected
