"""The handshake before the first byte (contract 3 of :mod:`weightbridge.sync.control`).

Every member of an epoch (trainer and rollout ranks) calls :func:`handshake` on its own control
plane before the epoch's bridge group is created: a disagreement on spec hash, plan hash, wire
options, backend or dtypes raises :class:`~weightbridge.errors.HandshakeMismatch` on every member,
naming both ranks (spec numbering) and values, before any byte moves; two members of an NCCL group
on one device raise :class:`~weightbridge.errors.DeviceConflict` (naming both), before any NCCL call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from weightbridge.errors import DeadlineExceeded, DeviceConflict, ForgedMessage, HandshakeMismatch, ProtocolError
from weightbridge.sync.messages import Hello
from weightbridge.sync.roster import RankId

if TYPE_CHECKING:
    from weightbridge.sync.control import ControlPlane


def handshake(
    cp: ControlPlane,
    hello: Hello,
    members: Sequence[RankId],
    expected_dtypes: Mapping[RankId, str],
    deadline: float,
) -> dict[RankId, Hello]:
    """Every member of an epoch, before the epoch's group exists: publish ``hello`` on ``cp``, wait
    for every member's, check agreement (contract 3).

    A member that greeted and then joined again as a later process ends the wait (the process that
    greeted is gone). One that joins again *before* greeting does not: its successor greets in its
    place (a whole trainer side restarting after a failure: trainer 0 may open the epoch while another
    trainer's join record is still its dead predecessor's).

    A value under a member's hello key that is not a readable hello of that member (garbage, or
    planted before the member wrote its own) is waited past: the member overwrites it, as this
    rank puts its own hello back while waiting (so a stranger's value costs at most the deadline,
    never a failed handshake while the real hellos are on their way)."""
    epoch = hello.epoch
    mine = cp.keys.hello(epoch, cp.me.key)
    cp.set(mine, hello)
    keys = {m: cp.keys.hello(epoch, m.key) for m in members}
    hellos: dict[RankId, Hello] = {}
    bad: dict[str, str] = {}

    def read(m: RankId) -> Hello | None:
        try:
            h = cp.get(keys[m], Hello)
        except (ForgedMessage, ProtocolError) as exc:
            bad[keys[m]] = str(exc)
            return None
        if h is not None and (h.side, h.rank, h.epoch) != (m.side, m.rank, epoch):
            bad[keys[m]] = f"a hello of {h.side} {h.rank} in epoch {h.epoch}"
            return None
        bad.pop(keys[m], None)
        return h

    def ready(_: list[bytes]) -> bool:
        if read(cp.me) != hello:
            cp.set(mine, hello)  # overwritten by someone else: put it back
        for m in members:
            if m not in hellos:
                h = read(m)
                if h is not None:
                    hellos[m] = h
        return len(hellos) == len(members)

    what = f"hello of every member of epoch {epoch}"
    try:
        cp.wait_for([], deadline, what, ready=ready, epoch=epoch, watch=members, joins=hellos)  # restarts: greeted members only
    except DeadlineExceeded:
        missing = [keys[m] for m in members if m not in hellos]
        unreadable = [f"{k} ({bad[k][:120]})" for k in missing if k in bad]
        detail = f" (missing {', '.join(missing[:3])}" + (f"; unreadable: {', '.join(unreadable[:2])}" if unreadable
                                                          else "") + ")"
        raise DeadlineExceeded(cp.me, what + detail, cp.timeout_s) from None
    hellos = {m: hellos[m] for m in members}
    check_hellos(cp.me, hellos, expected_dtypes)
    return hellos


def check_hellos(me: RankId, hellos: Mapping[RankId, Hello], expected_dtypes: Mapping[RankId, str]) -> None:
    """Raise :class:`HandshakeMismatch` for the first disagreement, in a fixed order on every rank.

    Order: spec hash, plan hash, wire options, backend (compared with ``me``'s hello), devices (no
    two NCCL members on one device), then each member's dtypes compared with what the spec says that
    rank holds.
    """
    mine = hellos[me]
    order = sorted(hellos, key=lambda r: (r.side != "trainer", r.rank))
    for field in ("spec_hash", "plan_hash", "wire", "epoch"):
        for peer in order:
            theirs = getattr(hellos[peer], field)
            if theirs != getattr(mine, field):
                raise HandshakeMismatch(me, field, str(getattr(mine, field)), peer, str(theirs))
    check_devices(me, hellos, order)
    for peer in order:
        got = hellos[peer]
        want = expected_dtypes.get(peer)
        if want is not None and got.dtypes != want:
            diffs = "; ".join(got.dtype_diffs) or f"digest {got.dtypes}"
            raise HandshakeMismatch(me, "dtypes", f"the spec's dtypes for {peer} (digest {want})", peer, diffs)


BACKEND_HINT = ("every rank of a bridge moves bytes with one backend: with a CPU-offloaded side set "
                "sync.transport: gloo in the spec, or keep every side's tensors on CUDA")


def check_devices(me: RankId, hellos: Mapping[RankId, Hello], order: Sequence[RankId]) -> None:
    """The members' :class:`~weightbridge.sync.messages.DeviceIdentity`: every backend equal to ``me``'s
    (:class:`HandshakeMismatch` on ``backend``), and no two members of an NCCL group on one device
    (:class:`DeviceConflict` naming the first two in ``order``: the same pair on every rank)."""
    def describe(h: Hello) -> str:
        return h.identity.describe() if h.identity is not None else "no stated backend"

    mine = hellos[me].identity
    for peer in order:
        theirs = hellos[peer].identity
        if (theirs.backend if theirs else None) != (mine.backend if mine else None):
            raise HandshakeMismatch(me, "backend", describe(hellos[me]), peer, describe(hellos[peer]), BACKEND_HINT)
    if mine is None or mine.backend != "nccl":
        return
    seen: dict[str, RankId] = {}
    for peer in order:
        ident = hellos[peer].identity
        if ident is None or ident.device in ("", "cpu"):
            continue
        # A GPU UUID names one device everywhere; an index (no UUID known) only within its host.
        key = ident.device if ident.device.startswith(("GPU-", "MIG-")) else f"{ident.host}/{ident.device}"
        if key in seen:
            raise DeviceConflict(me, seen[key], peer, ident.where())
        seen[key] = peer
