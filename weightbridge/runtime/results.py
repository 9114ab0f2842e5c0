"""What the runtime's calls return: per-push and per-receive statistics (frozen values)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PushStats:
    """What one ``push`` did, seen from one trainer rank."""

    version: int
    seq: int  # push sequence number (1, 2, ...), across epochs
    epoch: int
    mode: str
    bytes_sent: int  # by this rank
    wire_bytes: int  # by all trainer ranks (the plan's update bytes)
    seconds: float  # push() wall time
    transfer_s: float  # this rank's data-plane time
    wait_s: float  # waiting for the staleness bound and the receivers' acks
    num_rounds: int
    new_epoch: bool  # this push re-planned (first push, membership change, recovery)
    wire_sent: int = 0  # bytes this rank put on the wire (with sync.delta: what the deltas took)
    delta_buckets: int = 0  # buckets this rank sent as deltas (sync.delta; 0 when off)

    @property
    def gbps(self) -> float:
        """Update bytes over push wall time, GB/s (1e9)."""
        return self.wire_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReceiveStats:
    """What the last receive did on one rollout rank."""

    version: int
    seq: int
    epoch: int
    bytes_received: int
    transfer_s: float
    staged: bool  # into the staging copy (else into the live weights, or streamed into the engine)
    wire_received: int = 0  # bytes that arrived on the wire (with sync.delta: what the deltas took)
    wire_buffer_bytes: int = -1  # wire slabs allocated for the receive (-1: the data plane does not say)
    stream_bytes: int = -1  # streaming: the most local-tensor bytes held at once (-1: not streaming)
