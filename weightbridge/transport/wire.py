"""The wire of one rank's round: transfers (a bucket to send or receive), chunk cuts, checksums.

Pure torch (no torch.distributed): :func:`chunk_bounds` cuts a wire buffer into P2P chunks
identically on both ends; :func:`checksum` is the 8-byte trailer a bucket carries with
``checksums=True`` (CRC-32 on CPU, :func:`weighted_sum` on other devices).
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from weightbridge.errors import ProtocolError
from weightbridge.plan.types import Bucket

CHECKSUM_BYTES = 8


class Transfer:
    """One bucket of one round seen from this rank: a wire buffer to send or to receive."""

    __slots__ = ("bucket", "peer", "send", "buf", "nbytes")

    def __init__(self, bucket: Bucket, peer: int, send: bool, nbytes: int) -> None:
        self.bucket = bucket
        self.peer = peer
        self.send = send
        self.nbytes = nbytes  # wire bytes incl. checksum trailer
        self.buf: torch.Tensor | None = None


def wire_buffer(tr: Transfer, group: Any, round_index: int) -> torch.Tensor:
    """The wire buffer of a packed transfer (:class:`ProtocolError` if it was released already)."""
    if tr.buf is None:
        raise ProtocolError(group.describe_rank(group.rank), f"round {round_index}: a transfer has no wire buffer")
    return tr.buf


def chunk_bounds(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """How a wire buffer of ``nbytes`` is cut into P2P chunks (identical on both ends)."""
    if nbytes <= 0:
        return []
    return [(lo, min(lo + chunk_bytes, nbytes)) for lo in range(0, nbytes, chunk_bytes)]


def checksum(data: torch.Tensor) -> int:
    """Checksum of a 1-D uint8 tensor: CRC-32 on CPU; a position-weighted sum on other devices."""
    if data.device.type == "cpu":
        return zlib.crc32(data.numpy()) if data.numel() else 0
    return weighted_sum(data)


def weighted_sum(data: torch.Tensor) -> int:
    """Position-weighted byte sum computed on the tensor's device (the non-CPU checksum)."""
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    step = 1 << 24
    for lo in range(0, data.numel(), step):
        x = data[lo : lo + step].to(torch.int64)
        w = torch.arange(lo, lo + x.numel(), dtype=torch.int64, device=data.device) % 1_000_003 + 1
        total += (x * w).sum()
    return int(total.item())


def write_trailer(buf: torch.Tensor, n: int, value: int) -> None:
    buf[n : n + CHECKSUM_BYTES].copy_(torch.tensor([value], dtype=torch.int64).view(torch.uint8).to(buf.device))


def read_trailer(buf: torch.Tensor, n: int) -> int:
    return int(buf[n : n + CHECKSUM_BYTES].cpu().clone().view(torch.int64)[0])
