"""Typed errors of the runtime: every failure a caller can see names the ranks involved.

::

    BridgeError                      base of everything the runtime raises on purpose
      PeerFailed(rank, peer, message)      another rank failed (its own message) or died (no heartbeat)
      DeadlineExceeded(rank, waiting_for)  a wait ran past ``sync.timeout_s``
      HandshakeMismatch(rank, field, ...)  ranks disagree on spec hash, plan hash or dtypes
      TornModelError(rank, version, ...)   an in-place update was interrupted; live weights are mixed
      NothingToApply(rank)                 apply() before any version was received

Ranks are written ``"trainer 1"`` / ``"rollout 3"`` (:class:`RankId`), rollout ranks
numbered as in the spec (instance-major), not as in the bridge group.
"""

from __future__ import annotations

from typing import NamedTuple

from weightbridge.errors import BridgeError  # re-exported: the root of the runtime's errors


class RankId(NamedTuple):
    side: str  # "trainer" | "rollout"
    rank: int  # rank within its side, as in the spec

    def __str__(self) -> str:
        return f"{self.side} {self.rank}"

    @property
    def key(self) -> str:
        """Store-key form: ``trainer/1``."""
        return f"{self.side}/{self.rank}"




class PeerFailed(BridgeError):
    """``peer`` failed (and published ``message``) or stopped heart-beating while ``rank`` waited."""

    def __init__(self, rank: RankId | str, peer: RankId | str, message: str) -> None:
        self.rank = str(rank)
        self.peer = str(peer)
        self.message = message
        super().__init__(f"{self.rank}: peer {self.peer} failed: {message}")


class DeadlineExceeded(BridgeError):
    """A wait on ``rank`` ran past its deadline (``sync.timeout_s``)."""

    def __init__(self, rank: RankId | str, waiting_for: str, timeout_s: float) -> None:
        self.rank = str(rank)
        self.waiting_for = waiting_for
        self.timeout_s = timeout_s
        super().__init__(f"{self.rank}: no progress after {timeout_s:g}s waiting for {waiting_for}")


class HandshakeMismatch(BridgeError):
    """Two ranks disagree on ``field`` (spec_hash, plan_hash, dtypes, ...); raised on every rank."""

    def __init__(self, rank: RankId | str, field: str, value: str, peer: RankId | str, peer_value: str) -> None:
        self.rank = str(rank)
        self.field = field
        self.value = value
        self.peer = str(peer)
        self.peer_value = peer_value
        super().__init__(
            f"{self.rank}: handshake mismatch on {field}: {self.rank} has {value}, {self.peer} has {peer_value}"
        )


class TornModelError(BridgeError):
    """The live weights of ``rank`` are a mix of two versions (an in-place update was interrupted)."""

    def __init__(self, rank: RankId | str, version: int, previous: int | None, cause: str) -> None:
        self.rank = str(rank)
        self.version = version
        self.previous = previous
        self.cause = cause
        super().__init__(
            f"{self.rank}: weights are torn between version {previous} and {version} ({cause}); "
            "do not serve them; the next complete push heals them"
        )


class NothingToApply(BridgeError):
    """``apply()`` was called before any version was received."""

    def __init__(self, rank: RankId | str) -> None:
        self.rank = str(rank)
        super().__init__(f"{self.rank}: no version received yet; call apply() after poll() returned True")
