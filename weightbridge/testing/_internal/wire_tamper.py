"""Corrupt data messages in flight, in this process only (tests of checksums and of never serving damage).

:func:`flip_sent_bytes` wraps Gloo's ``send`` for the rest of the process: each data message
(tag 0, what :mod:`weightbridge.transport.comm` sends; the data-sender token's tag is left alone)
goes to its peer as a copy with one byte flipped wherever ``choose(part, peer)`` returns a byte
index (``None``: sent untouched). The sender's own buffers and tensors keep their bytes, as when the
wire flips a bit after the sender's checksum; the receiver's check is the one under test. Nothing in
weightbridge knows about this: the tests reach the wire, not a hook in the executor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

DATA_TAG = 0


def flip_sent_bytes(choose: Callable[[torch.Tensor, int], int | None]) -> None:
    """From now on, each data message part ``choose`` picks a byte of is sent with that byte flipped."""
    real = dist.ProcessGroupGloo.send
    in_flight: list[torch.Tensor] = []  # the copies must outlive their sends (Gloo sends asynchronously)

    def send(self, tensors, dst, tag=0):  # ProcessGroupGloo.send(tensors, dstRank, tag)
        if tag == DATA_TAG and len(tensors) == 1 and tensors[0].numel():
            index = choose(tensors[0], dst)
            if index is not None:
                damaged = tensors[0].clone()
                damaged.view(-1).view(torch.uint8)[index] ^= 0xFF
                in_flight.append(damaged)
                return real(self, [damaged], dst, tag)
        return real(self, tensors, dst, tag)

    dist.ProcessGroupGloo.send = send
