"""Shared-memory segments of the colocated data plane (``sync.transport: shm``): files in ``/dev/shm``.

A sender creates one segment per epoch (:meth:`Segment.create`): a file ``wb-<tag>-<pid>-<random>``
made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode ``0600`` (never a file someone else planted, never
readable by another user), mapped read-write. Each of its readers opens it by the name the sender
published sealed on the control store (:meth:`Segment.open`): the name must have that form, the file
must be a regular file owned by this user with no group or other permission bits and of exactly
the published size; it is mapped **read-only**. Once every reader mapped it, the sender unlinks
the name (:meth:`Segment.unlink`), so from then on nothing in ``/dev/shm`` names it and the memory
lives exactly as long as the mappings: a killed process's mapping goes with it. A name only exists
while the epoch's first push sets up (at most ``timeout_s``); one left by a process killed then is
removed by the next epoch's :func:`remove_stale` on that host.

**Liveness.** Open file description locks (``F_OFD_SETLK``) on bytes of the file: the creator holds a
write lock on byte 0 and reader ``i`` a read lock on byte ``1 + i``, each through its own open file,
which the kernel releases when the process ends (``kill -9`` included). So a reader waiting for a
round learns that its sender died at once (:meth:`Segment.creator_alive`), and the sender that its
reader died (:meth:`Segment.reader_alive`), without waiting for a heartbeat; :func:`remove_stale`
removes a name whose creator's lock is gone.

``tag`` (:func:`job_tag`) is derived from the job secret, so one job's cleanup never touches another
job's segments. Linux only (``/dev/shm``, OFD locks). No torch.distributed.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import re
import secrets
import stat
import struct
import time
import warnings
from typing import Any

import torch

SHM_DIR = "/dev/shm"
NAME_RE = re.compile(r"^wb-([0-9a-f]{12})-([0-9]{1,10})-([0-9a-f]{16})$")
_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64 / aarch64: type, whence, start, len, pid (+ padding)
PAGE = mmap.PAGESIZE
STALE_AFTER_S = 1.0  # a name younger than this is never removed (its creator may be about to lock it)

__all__ = ["NAME_RE", "PAGE", "SHM_DIR", "Segment", "SegmentError", "job_tag", "remove_stale", "segments"]


class SegmentError(Exception):
    """A segment cannot be created, opened or trusted (the caller raises it as a typed transport error).
    ``refused``: it exists but is not one this job may trust (another owner, permissions, size, name)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def job_tag(signer: Any) -> str:
    """12 hex digits naming this job's segments: a MAC of the job secret (auth off: a constant)."""
    if signer is not None and getattr(signer, "enabled", False):
        return signer.mac(b"wb-shm-segment-tag").hex()[:12]
    return hashlib.sha256(b"weightbridge shm, auth off").hexdigest()[:12]


def _lock(fd: int, kind: int, byte: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0))


def _held(fd: int, byte: int, probe: int = fcntl.F_WRLCK) -> bool:
    """Whether another open file holds a lock on ``byte`` that conflicts with ``probe``."""
    got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(_FLOCK, probe, os.SEEK_SET, byte, 1, 0))
    return struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK


def _round_up(n: int) -> int:
    return max(PAGE, -(-n // PAGE) * PAGE)


class Segment:
    """One mapping of a segment: the creator's (read-write) or a reader's (read-only).

    ``tensor`` is the whole mapping as a 1-D ``uint8`` tensor (no copy). :meth:`close` drops it and
    unmaps; after that the segment is unusable.
    """

    def __init__(self, fd: int, mm: mmap.mmap, name: str, directory: str, size: int, writable: bool) -> None:
        self.fd, self.mm, self.name, self.directory = fd, mm, name, directory
        self.size, self.writable = size, writable
        self.linked = writable  # the creator's name still exists in the directory
        self.slot = -1  # a reader's lock byte is 1 + slot
        with warnings.catch_warnings():  # a read-only mapping: torch warns that it is not writable
            warnings.simplefilter("ignore", UserWarning)
            self.tensor: torch.Tensor | None = torch.frombuffer(mm, dtype=torch.uint8, count=size)

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.name)

    @classmethod
    def create(cls, tag: str, size: int, directory: str = SHM_DIR) -> Segment:
        """A new segment of at least ``size`` bytes (whole pages), locked as its creator's."""
        size = _round_up(size)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(8):
            name = f"wb-{tag}-{os.getpid()}-{secrets.token_hex(8)}"
            try:
                fd = os.open(os.path.join(directory, name), flags, 0o600)
                break
            except FileExistsError:  # planted or taken: never used; draw another name
                continue
            except OSError as exc:
                raise SegmentError(f"cannot create a shared-memory segment in {directory} ({exc.strerror}); "
                                   "transport shm needs a writable tmpfs there (Linux /dev/shm)") from exc
        else:
            raise SegmentError(f"8 random segment names in {directory} all existed (someone is creating them)")
        try:
            _lock(fd, fcntl.F_WRLCK, 0)
            os.fchmod(fd, 0o600)  # whatever the umask
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(os.path.join(directory, name))
            raise SegmentError(f"cannot map a {size}-byte segment in {directory} ({exc}); is it full?") from exc
        return cls(fd, mm, name, directory, size, True)

    @classmethod
    def open(cls, name: str, size: int, slot: int, directory: str = SHM_DIR) -> Segment:
        """Map segment ``name`` read-only as reader ``slot`` (its lock byte ``1 + slot``), after checking it."""
        if not NAME_RE.match(name) or size <= 0 or size % PAGE or not 0 <= slot < 1 << 20:
            raise SegmentError(f"refused segment {name[:80]!r} of {size} bytes (not a weightbridge segment name "
                               "and size)", refused=True)
        try:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise SegmentError(f"cannot open segment {name} ({exc.strerror}): its sender unlinked it or died") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise SegmentError(f"segment {name} is not a private file of this user (mode {oct(st.st_mode)}, "
                                   f"owner {st.st_uid}); refused", refused=True)
            if st.st_size != size:
                raise SegmentError(f"segment {name} has {st.st_size} bytes, its sender published {size}; refused",
                                   refused=True)
            if not _held(fd, 0):
                raise SegmentError(f"segment {name} has no living creator (its lock is gone)")
            _lock(fd, fcntl.F_RDLCK, 1 + slot)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except SegmentError:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            raise SegmentError(f"cannot map segment {name} ({exc})") from exc
        seg = cls(fd, mm, name, directory, size, False)
        seg.slot = slot
        return seg

    def creator_alive(self) -> bool:
        """A reader: whether the creator's process still holds the segment."""
        return self.fd >= 0 and _held(self.fd, 0, fcntl.F_RDLCK)

    def reader_alive(self, slot: int) -> bool:
        """The creator: whether reader ``slot``'s process still holds its mapping."""
        return self.fd >= 0 and _held(self.fd, 1 + slot)

    def unlink(self) -> None:
        """The creator: remove the name (the mappings stay). Only if the name is still this file."""
        if not self.linked:
            return
        self.linked = False
        try:
            if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        """Unlink (creator), unmap and release the locks. A mapping still referenced elsewhere (a view
        kept by a caller) is released when that reference goes."""
        if self.writable:
            self.unlink()
        self.tensor = None
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass  # exported views remain: the mapping goes with the last of them
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def segments(directory: str = SHM_DIR, tag: str | None = None) -> list[str]:
    """Names of weightbridge segments in ``directory`` (of job ``tag`` only, when given)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        m = NAME_RE.match(name)
        if m and (tag is None or m.group(1) == tag):
            out.append(name)
    return sorted(out)


def remove_stale(tag: str, directory: str = SHM_DIR, *, keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove job ``tag``'s segment names whose creator no longer holds them (a process killed while it
    set up an epoch); returns the names removed. Names in ``keep``, and names younger than
    :data:`STALE_AFTER_S`, are left alone; files of another user are never touched."""
    removed = []
    now = time.time()
    for name in segments(directory, tag):
        if name in keep:
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < STALE_AFTER_S
                    or _held(fd, 0)):
                continue
            if os.stat(path, follow_symlinks=False).st_ino == st.st_ino:
                os.unlink(path)
                removed.append(name)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES, errno.EPERM):
                raise
        finally:
            os.close(fd)
    return removed
