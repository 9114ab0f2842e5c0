"""Checksums and the NCCL path where a slab region starts at an odd byte (issue 28).

A round's wire buffers are back-to-back regions of one slab, so after a bucket of odd size (int8, fp8
or bool items) the next bucket's buffer, and its checksum input, start at an odd storage offset, where
``data.view(torch.int16)`` raises. The device checksum reads byte pairs there.
"""

from __future__ import annotations

import pytest
import torch

from weightbridge.plan import build_plan
from weightbridge.tensors import diff_tensors, empty_like_layout, materialize
from weightbridge.testing._internal.loopback import LoopbackWorld, odd_sized_layouts
from weightbridge.transport.wire import bucket_sum, poly_hash, read_trailer, resolve, write_trailer


@pytest.mark.parametrize("n", [1, 2, 3, 8, 131071, 131072, 131073, (64 << 17) + 5])  # across block and step edges
def test_the_device_checksum_at_an_odd_offset_is_the_one_of_the_same_bytes_aligned(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    slab = torch.randint(0, 256, (n + 3,), dtype=torch.uint8, generator=g)
    region = slab[1 : 1 + n]  # storage offset 1
    assert region.storage_offset() == 1
    h = poly_hash(region)  # raised before: storage_offset() must be divisible by 2
    assert h == poly_hash(region.clone()) == poly_hash(slab[2 : 2 + n].clone().copy_(region))
    bad = slab.clone()
    bad[1 + n // 2] ^= 0x21
    assert poly_hash(bad[1 : 1 + n]) != h


def test_a_bucket_sum_of_several_messages_is_the_sum_of_their_padded_concatenation() -> None:
    g = torch.Generator().manual_seed(3)
    parts = [torch.randint(0, 256, (k,), dtype=torch.uint8, generator=g) for k in (5, 8, 3, 1 << 17)]
    padded = torch.cat([torch.cat([p, torch.zeros(p.numel() % 2, dtype=torch.uint8)]) for p in parts])
    slab = torch.zeros(padded.numel() + 1, dtype=torch.uint8)
    odd = [slab[1 : 1 + p.numel()].copy_(p) for p in parts[:1]] + parts[1:]  # the first at an odd offset
    [got] = resolve([bucket_sum(odd, on_device=True)])
    assert got == poly_hash(padded)
    swapped = resolve([bucket_sum([parts[1], parts[0]] + parts[2:], on_device=True)])[0]
    assert swapped != got  # the order of the messages counts


def test_trailers_are_written_and_read_at_odd_offsets_without_leaving_the_device() -> None:
    buf = torch.zeros(40, dtype=torch.uint8)
    value = bucket_sum([torch.arange(11, dtype=torch.uint8)], on_device=True)
    assert isinstance(value, torch.Tensor) and value.dim() == 0  # computed on the device, not fetched
    write_trailer(buf[3:], 5, value)  # bytes 8..15 of the buffer's storage, through an odd-offset view
    assert read_trailer(buf[3:], 5) == resolve([value])[0] == poly_hash(torch.arange(11, dtype=torch.uint8))


@pytest.mark.parametrize("direct_bytes", [1 << 20, 4], ids=["packed", "direct"])
def test_the_nccl_path_moves_odd_sized_items_bitwise_with_checksums(direct_bytes: int) -> None:
    trainer, rollout, canon = odd_sized_layouts()
    plan = build_plan(trainer, rollout, round_bytes=1 << 20)
    sizes = [b.nbytes for rnd in plan.rounds for b in rnd.buckets]
    assert sizes == [3 + 10 + 5 + 7 + 16] * 2  # 41 B each: with the trailer, the second starts at 49
    world = LoopbackWorld(plan, checksums=True, direct_bytes=direct_bytes)
    dsts = [empty_like_layout(rollout.ranks[q]) for q in range(2)]
    world.run([materialize(trainer.ranks[0], canon)], dsts, wall_s=30)
    for q in range(2):
        assert diff_tensors(dsts[q], materialize(rollout.ranks[q], canon)) == []
    assert world.hub.pending() == 0
