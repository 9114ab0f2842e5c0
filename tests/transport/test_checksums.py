"""The device-side checksum (``wire.poly_hash``) catches structured corruption the old one missed.

Issue 13 item 6: the old device checksum (a position-weighted byte sum, weights ``i % 1000003 + 1``)
missed 200 of 200 structured corruptions that CRC-32 catches. The same 200 kinds here (swaps of two
bytes or words, +d/-d and other compensating changes, zeroing compensated elsewhere), each checked
to fool the old sum, must all change ``poly_hash`` (called directly on CPU tensors: it is the
function the NCCL path runs on the GPU) and the CPU checksum (XXH3-64; CRC-32 before).
"""

from __future__ import annotations

import random
import xxhash

import pytest
import torch

from weightbridge.transport.wire import checksum, poly_hash

N = 2_200_000  # > 2 x 1000003: room for corruptions one or two old-weight periods apart
PERIOD = 1_000_003


def old_weighted_sum(data: torch.Tensor) -> int:
    """The checksum weightbridge used on non-CPU devices before issue 13 (verbatim)."""
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    step = 1 << 24
    for lo in range(0, data.numel(), step):
        x = data[lo : lo + step].to(torch.int64)
        w = torch.arange(lo, lo + x.numel(), dtype=torch.int64, device=data.device) % 1_000_003 + 1
        total += (x * w).sum()
    return int(total.item())


def _corruptions(buf: torch.Tensor, rng: random.Random) -> list[tuple[str, list[tuple[int, int]]]]:
    """200 (kind, [(position, new byte)]) edits, each invisible to the old weighted sum."""
    out: list[tuple[str, list[tuple[int, int]]]] = []

    def byte(i: int) -> int:
        return int(buf[i])

    while len(out) < 200:
        kind = len(out) % 5
        i = rng.randrange(0, N - PERIOD - 2)
        j = i + PERIOD  # same old weight as i
        if kind == 0:  # swap two different bytes one old period apart
            if byte(i) == byte(j):
                continue
            out.append(("swap bytes", [(i, byte(j)), (j, byte(i))]))
        elif kind == 1:  # swap two different 16-bit words one old period apart (even offsets)
            a = rng.randrange(0, N - 2 * PERIOD - 2) // 2 * 2
            c = a + 2 * PERIOD  # word-aligned too; bytes a/c and a+1/c+1 have equal old weights
            if (byte(a), byte(a + 1)) == (byte(c), byte(c + 1)):
                continue
            out.append(("swap words", [(a, byte(c)), (a + 1, byte(c + 1)), (c, byte(a)), (c + 1, byte(a + 1))]))
        elif kind == 2:  # +d at one byte, -d at a byte of the same old weight
            d = rng.randint(1, 50)
            out.append(("+d/-d", [(i, byte(i) + d), (j, byte(j) - d)]))
        elif kind == 3:  # +2d at old weight w, -d at old weight 2w (compensating, different amounts)
            w = rng.randint(1, 400_000)
            d = rng.randint(1, 50)
            p, q = w - 1, 2 * w - 1  # weights w and 2w
            out.append(("+2d/-d", [(p, byte(p) + 2 * d), (q, byte(q) - d)]))
        else:  # zero a byte and add its value at a byte of the same old weight
            out.append(("zero+compensate", [(i, 0), (j, byte(j) + byte(i))]))
    return out


@pytest.mark.slow
def test_200_structured_corruptions_fool_the_old_sum_and_none_fools_poly_hash_or_crc() -> None:
    rng = random.Random(13)
    g = torch.Generator().manual_seed(13)
    buf = torch.randint(60, 120, (N,), dtype=torch.uint8, generator=g)  # room for +-d without wrapping
    old0, new0, crc0 = old_weighted_sum(buf), poly_hash(buf), checksum(buf)
    kinds: dict[str, int] = {}
    for kind, edits in _corruptions(buf, rng):
        bad = buf.clone()
        for pos, val in edits:
            assert 0 <= val <= 255
            bad[pos] = val
        assert not torch.equal(bad, buf)
        assert old_weighted_sum(bad) == old0, kind  # the old device checksum misses it
        assert poly_hash(bad) != new0, (kind, edits)  # the new one catches it
        assert checksum(bad) != crc0, kind  # the CPU checksum (XXH3) catches it too
        kinds[kind] = kinds.get(kind, 0) + 1
    assert sum(kinds.values()) == 200 and len(kinds) == 5, kinds


def test_poly_hash_is_deterministic_and_sensitive_on_small_and_odd_buffers() -> None:
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 3, 7, 1 << 16, (1 << 17) + 3, (64 << 16) * 2 + 5):  # across block and step edges
        x = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        h = poly_hash(x)
        assert h == poly_hash(x.clone()) and 0 <= h < 1 << 63
        for pos in {0, n // 2, n - 1}:
            y = x.clone()
            y[pos] ^= 0x5A
            assert poly_hash(y) != h, (n, pos)
        if n >= 2:  # swapping two different adjacent bytes (inside one 16-bit word)
            y = x.clone()
            y[0], y[1] = int(x[1]), int(x[0])
            assert x[0] == x[1] or poly_hash(y) != h
    assert poly_hash(torch.empty(0, dtype=torch.uint8)) == 0
    assert checksum(torch.tensor([1, 2, 3], dtype=torch.uint8)) == xxhash.xxh3_64_intdigest(bytes([1, 2, 3])) & (2**63 - 1)
