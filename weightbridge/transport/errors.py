"""Typed data-plane errors. Every one names the rank that raised it and the peer involved."""

from __future__ import annotations

from weightbridge.errors import BridgeError


class TransportError(BridgeError):
    """A data-plane failure on bridge rank ``rank`` while talking to bridge rank ``peer`` in ``round``.

    ``peer`` is None when no single peer is to blame (e.g. group creation); ``round`` is None
    outside of a round. ``rank`` and ``peer`` are **bridge-group** ranks (integers);
    ``rank_name`` / ``peer_name`` are the same ranks in spec numbering (``rollout 3``), given by
    the group's :class:`~weightbridge.sync.roster.Roster`, and are what the message shows.
    """

    def __init__(
        self, rank: int, peer: int | None, round: int | None, message: str, *,
        rank_name: str | None = None, peer_name: str | None = None,
    ) -> None:
        self.rank = rank
        self.peer = peer
        self.round = round
        self.message = message
        self.rank_name = rank_name or f"bridge rank {rank}"
        self.peer_name = peer_name if peer_name is not None or peer is None else f"bridge rank {peer}"
        where = self.rank_name
        if self.peer_name is not None:
            where += f", peer {self.peer_name}"
        if round is not None:
            where += f", round {round}"
        super().__init__(f"{type(self).__name__} ({where}): {message}")


class PeerTimeout(TransportError):
    """A wait on ``peer`` exceeded the group's deadline (``timeout_s``)."""


class PeerDisconnected(TransportError):
    """``peer`` went away (connection closed, process crashed) or the backend reported an error."""


class ChecksumError(TransportError):
    """The bytes received from ``peer`` do not match the checksum it sent."""

    def __init__(
        self, rank: int, peer: int | None, round: int | None, message: str = "checksum mismatch", **names: str | None
    ) -> None:
        super().__init__(rank, peer, round, message, **names)


class DeltaBaseMismatch(TransportError):
    """A delta bucket from ``peer`` was computed against a version this rank does not hold for those
    elements (``sync.delta``): nothing of it is applied. The next push of a new epoch sends full buckets."""


class MalformedBucket(TransportError):
    """A bucket from ``peer`` cannot be read: its header or delta encoding is invalid, or it carries
    another version than the one being received (nothing of it is applied)."""


# Errors a receiver finds in what it received itself: the root cause of a failed push, never a symptom.
RECEIVER_FINDINGS = (ChecksumError, DeltaBaseMismatch, MalformedBucket)


def classify(exc: BaseException) -> type[TransportError]:
    """Map a backend exception to :class:`PeerTimeout` or :class:`PeerDisconnected` by its message."""
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text or isinstance(exc, TimeoutError):
        return PeerTimeout
    return PeerDisconnected
