"""Shared-memory segments of the colocated data plane: who may open them, liveness, what is left behind.

Real files in a real tmpfs (``/dev/shm``), real processes (``localrun.launch``; another user through
``os.setuid`` in a child when the tests run as root), real OFD locks. ~3 s.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest

from weightbridge.localrun import launch
from weightbridge.transport import segment as S
from weightbridge.transport.segment import Segment, SegmentError, remove_stale, segments

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.isdir(S.SHM_DIR),
                                reason="segments live in /dev/shm (Linux)")

TAG = "0123456789ab"


@pytest.fixture
def tag():
    """A tag of this test's own (segments of other jobs on this machine are never touched)."""
    t = os.urandom(6).hex()
    yield t
    for name in segments(S.SHM_DIR, t):
        os.unlink(os.path.join(S.SHM_DIR, name))


def test_a_segment_is_private_mapped_and_unlinked_once_read(tag):
    seg = Segment.create(tag, 10_000)
    st = os.stat(seg.path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid() and st.st_size == 12_288
    seg.tensor[:5] = 7
    reader = Segment.open(seg.name, seg.size, slot=0)
    assert reader.tensor[:5].tolist() == [7] * 5
    [res] = launch(_write_as_reader, [(seg.name, seg.size)], timeout_s=60)
    assert res.exitcode == -11, (res.exitcode, res.error)  # mapped read-only: a write faults (SIGSEGV)
    assert seg.reader_alive(0) and not seg.reader_alive(1) and reader.creator_alive()
    seg.unlink()
    assert segments(S.SHM_DIR, tag) == []  # the name is gone, the memory stays mapped
    seg.tensor[:5] = 9
    assert reader.tensor[:5].tolist() == [9] * 5
    reader.close()
    assert not seg.reader_alive(0)  # the lock went with the reader's mapping
    seg.close()


def test_a_planted_name_is_never_used_and_untrusted_files_are_refused(tag, monkeypatch):
    planted = f"wb-{tag}-{os.getpid()}-{'0' * 16}"
    path = os.path.join(S.SHM_DIR, planted)
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    draws = iter(["0" * 16, "1" * 16])
    monkeypatch.setattr(S.secrets, "token_hex", lambda n: next(draws))
    seg = Segment.create(tag, 4096)  # O_EXCL: the planted file is skipped, another name drawn
    assert seg.name.endswith("1" * 16) and open(path, "rb").read() == b"\0" * 4096
    os.chmod(path, 0o644)
    with pytest.raises(SegmentError, match="not a private file") as exc:
        Segment.open(planted, 4096, 0)  # group/other bits: refused (whoever planted it)
    assert exc.value.refused
    with pytest.raises(SegmentError, match="has 4096 bytes, its sender published 8192"):
        Segment.open(seg.name, 8192, 0)
    for bad in ("../etc/passwd", f"wb-{tag}-1-xyz", "wb-" + "a" * 80):
        with pytest.raises(SegmentError, match="not a weightbridge segment name") as exc:
            Segment.open(bad, 4096, 0)
        assert exc.value.refused
    os.chmod(path, 0o600)
    with pytest.raises(SegmentError, match="no living creator"):
        Segment.open(planted, 4096, 0)  # nobody holds its creator lock
    seg.close()


def _write_as_reader(name: str, size: int) -> None:
    Segment.open(name, size, slot=1).tensor[0] = 1


def _hold_then_die(tag: str) -> str:
    seg = Segment.create(tag, 4096)
    os.kill(os.getpid(), 9)
    return seg.name  # never reached


def _try_open_as_nobody(names: list[str], sizes: list[int]) -> list[str]:
    os.setgid(65534)
    os.setuid(65534)
    out = []
    for name, size in zip(names, sizes):
        try:
            Segment.open(name, size, 0)
            out.append(f"{name}: opened")
        except SegmentError as exc:
            out.append(str(exc))
    return out


def test_a_killed_creators_name_is_removed_at_the_next_setup_and_a_live_one_kept(tag, monkeypatch):
    [res] = launch(_hold_then_die, [(tag,)], timeout_s=60)
    assert res.exitcode == -9
    [dead] = segments(S.SHM_DIR, tag)
    live = Segment.create(tag, 4096)
    assert remove_stale(tag) == []  # younger than STALE_AFTER_S: its creator may be about to lock it
    monkeypatch.setattr(S, "STALE_AFTER_S", 0.0)
    assert remove_stale(tag) == [dead]  # its creator's lock died with it; the live one is kept
    assert segments(S.SHM_DIR, tag) == [live.name]
    live.close()
    assert segments(S.SHM_DIR, tag) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_can_list_but_not_open_a_segment(tag):
    seg = Segment.create(tag, 4096)
    [res] = launch(_try_open_as_nobody, [([seg.name], [seg.size])], timeout_s=60)
    assert res.ok, res.error
    assert "Permission denied" in res.value[0], res.value
    seg.close()


def test_the_job_tag_is_bound_to_the_secret():
    from weightbridge.sync.auth import Signer

    a, b = S.job_tag(Signer(b"a" * 32)), S.job_tag(Signer(b"b" * 32))
    assert a != b and len(a) == 12 and S.NAME_RE.match(f"wb-{a}-1-{'f' * 16}")
    assert S.job_tag(Signer(None)) == S.job_tag(None)
