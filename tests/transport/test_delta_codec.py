"""The delta codec without processes: bit packing, position and value codes, and whole buckets (mixed
dtypes, transposed and strided boxes) over many versions against the full path; hostile bytes give
``ValueError`` (never an out-of-range write or another exception)."""

from __future__ import annotations

from math import prod

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightbridge.layout.ir import dtype_bytes
from weightbridge.plan.types import Bucket, WireItem
from weightbridge.tensors import torch_dtype, unpack_items
from weightbridge.transport import delta as wd
from weightbridge.transport import deltacode as dc

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(st.booleans(), max_size=300))
def test_bits_round_trip(bits):
    t = torch.tensor(bits, dtype=torch.bool)
    packed = dc.pack_bits(t)
    assert packed.numel() == -(-len(bits) // 8)
    assert dc.unpack_bits(packed, len(bits)).tolist() == [int(b) for b in bits]
    for i, b in enumerate(bits):  # documented order: bit i is bit i % 8 of byte i // 8
        assert (int(packed[i // 8]) >> (i % 8)) & 1 == int(b)


@SETTINGS
@given(st.integers(1, 5000).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)))))
def test_positions_round_trip_in_the_smaller_code(case):
    elements, chosen = case
    pos = torch.tensor(sorted(chosen), dtype=torch.int64)
    k = pos.numel()
    code, low, size = dc.position_sizes(k, elements)
    if code == dc.POS_BITMAP:
        mask = torch.zeros(elements, dtype=torch.bool)
        mask[pos] = True
        data = dc.encode_bitmap(mask)
        back = dc.decode_bitmap(data, k, elements)
    else:
        data = dc.encode_ef(pos, elements, low)
        back = dc.decode_ef(data, k, elements, low)
    assert data.numel() == size <= -(-elements // 8)
    assert back.tolist() == pos.tolist()
    for other in range(0, 12):  # every low-bit width round-trips, at the size its formula says
        if k:
            d = dc.encode_ef(pos, elements, other)
            assert d.numel() == dc.ef_bytes(k, elements, other)
            assert dc.decode_ef(d, k, elements, other).tolist() == pos.tolist()


@SETTINGS
@given(st.lists(st.integers(-(2**15), 2**15 - 1), max_size=200), st.sampled_from([dc.VAL_D8, dc.VAL_D4]))
def test_difference_codes_round_trip_with_escapes(news, code):
    new = torch.tensor(news, dtype=torch.int16)
    old = torch.roll(new, 1) if news else new
    codes = dc.codes8(new, old, 2)
    back, esc = dc.decode_codes(dc.encode_codes(codes, code), len(news), code)
    want_esc = dc.escaped8(codes) if code == dc.VAL_D8 else dc.escaped4(codes)
    assert esc.tolist() == want_esc.tolist()
    keep = ~esc
    assert torch.equal(dc.apply_codes(old[keep], back[keep], 2), new[keep])  # every carried code is exact
    diff = [(a - b + 2**15) % 2**16 - 2**15 for a, b in zip(new.tolist(), old.tolist())]
    carried = (lambda d: -127 <= d <= 126) if code == dc.VAL_D8 else (lambda d: -7 <= d <= 7)
    assert esc.tolist() == [not carried(d) for d in diff]


def test_d8_code_edges():
    old = torch.zeros(6, dtype=torch.int16)
    new = torch.tensor([-128, -127, 126, 127, 7, -8], dtype=torch.int16)
    codes = dc.codes8(new, old, 2)
    assert dc.escaped8(codes).tolist() == [True, False, False, True, False, False]
    assert dc.escaped4(codes).tolist() == [True, True, True, True, False, True]


@pytest.mark.parametrize("s,dtype", [(2, torch.int16), (4, torch.int32)])
def test_differences_wrap_exactly(s, dtype):
    info = torch.iinfo(dtype)
    old = torch.tensor([info.min, info.max, -1, 0, 5, 100], dtype=dtype)
    new = torch.tensor([info.max, info.min, 0, -1, 5, 3], dtype=dtype)
    codes = dc.codes8(new, old, s)
    assert codes.tolist() == [-1, 1, 1, -1, 0, -97]
    assert torch.equal(dc.apply_codes(old, codes, s), new)


# -- whole buckets ----------------------------------------------------------------------------
DTYPES = ["bfloat16", "float32", "float16", "int8", "float64"]


@st.composite
def buckets(draw):
    """A bucket of 1-4 items, each a box of a larger destination tensor (maybe transposed)."""
    items, src, dst = [], {}, {}
    for i in range(draw(st.integers(1, 4))):
        dt = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
        transpose = len(shape) > 1 and draw(st.booleans())
        canonical_box = tuple((0, n) for n in shape)
        local = tuple(reversed(shape)) if transpose else shape
        pad = tuple(draw(st.integers(0, 2)) for _ in local)
        dst_box = tuple((p, p + n) for p, n in zip(pad, local))
        n = prod(shape)
        items.append(WireItem(f"c{i}", canonical_box, f"s{i}", canonical_box, False, f"d{i}", dst_box, transpose, dt,
                              n * dtype_bytes(dt)))
        src[f"s{i}"] = _random(shape, dt, draw(st.integers(0, 2**31)))
        dst[f"d{i}"] = torch.zeros(tuple(p + m + 1 for p, m in zip(pad, local)), dtype=torch_dtype(dt))
    items_t = tuple(items)
    return Bucket("trainer", 0, 0, items_t, sum(it.nbytes for it in items_t)), src, dst


def _random(shape, dt, seed):
    g = torch.Generator().manual_seed(seed)
    if dt == "int8":
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    return torch.randn(shape, generator=g).to(torch_dtype(dt))


def _mutate(t: torch.Tensor, rate: float, step: int, g: torch.Generator) -> None:
    """Change a fraction of the elements: small steps in the bit pattern, or anything."""
    bits = t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).view(-1)
    m = torch.rand(bits.shape, generator=g) < rate
    delta = torch.randint(-step, step + 1, bits.shape, generator=g).to(bits.dtype)
    bits[m] += delta[m]


@SETTINGS
@given(buckets(), st.lists(st.tuples(st.sampled_from([0.0, 0.01, 0.2, 1.0]), st.sampled_from([1, 3, 300, 70000])),
                           min_size=1, max_size=8), st.sampled_from(["on", "auto"]))
def test_bucket_versions_land_like_full_pushes(case, steps, mode):
    bucket, src, dst = case
    geo = wd.geometry(bucket)
    cap = wd.HEADER_BYTES + bucket.nbytes
    buf = torch.zeros(cap + 8, dtype=torch.uint8)
    ref = {k: v.clone() for k, v in dst.items()}
    state = wd.SendState()
    g = torch.Generator().manual_seed(1)
    for v, (rate, step) in enumerate([(0.0, 1), *steps], start=1):
        for t in src.values():
            _mutate(t, rate, step, g)
        enc = wd.encode_bucket(buf, bucket, geo, src, state, version=v, mode=mode)
        assert enc.length <= cap
        h = wd.read_header(buf, cap + 8, 8)
        assert (h.kind, h.length, h.version) == (enc.kind, enc.length, v)
        wd.decode_bucket(buf, bucket, geo, dst, h)
        full = torch.cat([src[it.src_tensor].contiguous().view(-1).view(torch.uint8) for it in bucket.items])
        unpack_items(bucket.items, full, ref)
        for name in dst:
            assert torch.equal(dst[name].view(torch.uint8), ref[name].view(torch.uint8)), (v, name, h)


def _valid_delta():
    shape = (40, 30)
    box = ((0, 40), (0, 30))
    it = WireItem("w", box, "w", box, False, "w", box, False, "bfloat16", 2 * 1200)
    bucket = Bucket("trainer", 0, 0, (it,), it.nbytes)
    src = {"w": torch.randn(shape).bfloat16()}
    geo, state = wd.geometry(bucket), wd.SendState()
    buf = torch.zeros(wd.HEADER_BYTES + bucket.nbytes + 8, dtype=torch.uint8)
    wd.encode_bucket(buf, bucket, geo, src, state, version=1, mode="on")
    src["w"].view(torch.int16).view(-1)[::13] += 1
    enc = wd.encode_bucket(buf, bucket, geo, src, state, version=2, mode="on")
    assert enc.kind == wd.DELTA
    return bucket, geo, buf, enc


@SETTINGS
@given(st.data())
def test_hostile_bodies_and_headers_raise_value_error_or_stay_in_bounds(data):
    bucket, geo, buf, enc = _valid_delta()
    h = wd.read_header(buf, buf.numel(), 8)
    if data.draw(st.booleans()):  # corrupt the body
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(wd.HEADER_BYTES, enc.length - 1))
            buf[i] = data.draw(st.integers(0, 255))
    else:  # a header with other (CRC-correct) fields
        fields = h._asdict()
        name = data.draw(st.sampled_from(["pos", "val", "low", "length", "changed", "pos_bytes", "escapes"]))
        if name in ("pos", "val", "low"):  # one byte each
            fields[name] = data.draw(st.integers(0, 255))
        else:
            fields[name] = data.draw(st.one_of(st.integers(-5, 5000), st.integers(-(2**62), 2**62)))
        buf[: wd.HEADER_BYTES] = wd.Header(**fields).to_tensor(buf.device)
    # The destination box is rows 0-39 of a 48-row tensor: rows 40-47 are outside every box of the plan.
    dst = {"w": torch.arange(48 * 30, dtype=torch.int16).view(48, 30).view(torch.bfloat16)}
    before = dst["w"].clone()
    try:
        h = wd.read_header(buf, buf.numel(), 8)
        written = wd.decode_bucket(buf, bucket, geo, dst, h)
    except ValueError:  # a malformed message: nothing of it written
        assert torch.equal(dst["w"].view(torch.int16), before.view(torch.int16))
        return
    # accepted: it wrote within the bucket's elements and box, nowhere else
    assert 0 <= written <= geo.elements == 40 * 30
    assert torch.equal(dst["w"][40:].view(torch.int16), before[40:].view(torch.int16))


def test_header_rejects_garbage_and_a_bad_crc():
    buf = torch.randint(0, 256, (200,), dtype=torch.uint8)
    with pytest.raises(ValueError, match="CRC"):
        wd.read_header(buf, 200, 8)
    good = wd.Header(wd.FULL, 0, 0, 0, 1, -1, 150, 0, 0, 0).to_tensor(buf.device)
    buf[:64] = good
    assert wd.read_header(buf, 200, 8).length == 150
    with pytest.raises(ValueError, match="length"):
        wd.read_header(buf, 150, 8)  # the message would not fit its planned buffer
    buf[10] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        wd.read_header(buf, 200, 8)


def test_message_cuts_agree_for_any_length():
    for cap in (64, 100, 4096, 5000, 100_000):
        for length in (64, 65, 4095, 4096, 4097, cap):
            if length > cap:
                continue
            cuts = wd.message_cuts(length, cap, 1000)
            assert cuts[0] == (0, min(cap, wd.FIRST_BYTES))
            assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
            assert cuts[-1][1] == max(length, cuts[0][1])


def test_the_cost_model_uses_the_wire_constants():
    from weightbridge.plan import cost

    assert (cost.DELTA_HEADER_BYTES, cost.DELTA_FIRST_BYTES) == (wd.HEADER_BYTES, wd.FIRST_BYTES)


@SETTINGS
@given(st.integers(1, 20).flatmap(lambda w: st.tuples(st.just(w), st.lists(st.integers(0, 2**w - 1), max_size=70))))
def test_fixed_width_fields_round_trip_as_a_bit_stream(case):
    width, vals = case
    t = torch.tensor(vals, dtype=torch.int64)
    data = dc.pack_fields(t, width)
    assert data.numel() == -(-len(vals) * width // 8)
    bits = dc.unpack_bits(data, len(vals) * width).tolist()
    assert bits == [(v >> b) & 1 for v in vals for b in range(width)]  # the documented stream
    assert dc.unpack_fields(data, len(vals), width).tolist() == vals
