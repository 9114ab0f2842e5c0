"""The P2P traffic of one round of one rank: messages cut into chunks, issued in waves, waited for.

A round's :class:`~weightbridge.transport.wire.Transfer` s (one per bucket this rank sends or
receives) each move as one or more *messages* (one per direct item, and the packed message:
:mod:`weightbridge.transport.wire`); the round orders them every transfer's direct messages first,
then every packed message, and cuts each into chunks of ``chunk_bytes``
(:func:`~weightbridge.transport.wire.chunk_bounds`: both ends cut identically).

Waves (:meth:`RoundComm.start` issues the first, :meth:`RoundComm.finish` waits for it and runs
the rest):

* **Gloo**: every chunk of every message in one wave: the sends and receives of a pair queue on its
  connection in the same order on both ends, so any number can be in flight (one message in flight
  per pair left the link idle between chunks). With ``sync.delta`` wave 0 moves the first piece of
  every message (the header says how long it is) and wave 1 everything else.
* **NCCL**: wave ``k`` issues chunk ``k`` of every message as one coalesced batch (like
  ``dist.batch_isend_irecv``). The batches stay bounded and symmetric (wave ``k`` on a rank sends a
  chunk iff wave ``k`` on the peer receives it) and run in issue order on the communicator's
  stream, so every wave is issued at once and the round waits once, for all of them (with
  ``sync.delta``: wave 0, then every other wave once the headers arrived). Waiting for each wave
  on the host cost a poll interval and a launch gap per 64 MiB chunk: small on CPU, about the
  chunk's own transfer time on NVLink (64 MiB in ~0.2 ms).

Every round's waits share one deadline (the group's ``timeout_s`` from :meth:`RoundComm.finish`);
failures are typed (:mod:`.errors`) and name the peer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from weightbridge._torch_compat import end_coalescing, start_coalescing
from weightbridge.transport import delta as wd
from weightbridge.transport.errors import MalformedBucket, PeerTimeout, TransportError, classify
from weightbridge.transport.group import wait_work
from weightbridge.transport.wire import Transfer, chunk_bounds, wire_buffer

if TYPE_CHECKING:
    from weightbridge.transport.run_context import RunContext


class RoundComm:
    """The messages of one round of one rank; ``start()`` then ``finish()``, once each."""

    def __init__(self, ex: RunContext, round_index: int, transfers: list[Transfer]) -> None:
        self.ex = ex
        self.round_index = round_index
        self.coalesce = ex.group.backend == "nccl"
        # (transfer, message buffer, its chunk cuts) in a fixed order: every transfer's direct
        # messages, then every transfer's packed message (the first ``direct`` entries are direct)
        self.messages: list[tuple[Transfer, torch.Tensor, list[tuple[int, int]]]] = []
        self.direct = 0
        if ex.delta != "off":
            for tr in transfers:
                self.messages.append((tr, wire_buffer(tr, ex.group, round_index), self._delta_cuts(tr)))
        else:
            for tr in transfers:
                for buf in tr.direct:
                    self.messages.append((tr, buf, chunk_bounds(buf.numel(), ex.chunk_bytes)))
            self.direct = len(self.messages)
            for tr in transfers:
                if tr.packed_msg is not None:
                    self.messages.append((tr, tr.packed_msg, chunk_bounds(tr.packed_msg.numel(), ex.chunk_bytes)))
        self.waves = max((len(c) for _, _, c in self.messages), default=0)
        self.works: list = []
        self.held: list[tuple[Transfer, torch.Tensor, int, int]] = []  # see start(hold_packed_sends=True)
        self.issued = self.sent = self.received = 0

    # -- waves --------------------------------------------------------------
    def _wave_ops(self, k: int) -> list[tuple[Transfer, torch.Tensor, int, int]]:
        if self.coalesce:  # chunk k of every message
            return [(tr, buf, *cut[k]) for tr, buf, cut in self.messages if k < len(cut)]
        if self.ex.delta != "off" and k == 0:  # the first piece of every message: its header
            return [(tr, buf, *cut[0]) for tr, buf, cut in self.messages if cut]
        first = 1 if self.ex.delta != "off" else 0
        return [(tr, buf, lo, hi) for tr, buf, cut in self.messages for lo, hi in cut[first:]]

    def start(self, hold_packed_sends: bool = False) -> None:
        """Issue every wave (with ``sync.delta``: the first). ``hold_packed_sends`` (Gloo without
        deltas): all but the sends of packed messages, which :meth:`release` issues once they are
        packed; they follow every direct message in each pair's order, so holding them back keeps
        the order both ends post in."""
        if not hold_packed_sends:
            self._issue(0)
            if self.coalesce and self.ex.delta == "off":
                for k in range(1, self.waves):
                    self._issue(k)
            return
        if self.coalesce or self.ex.delta != "off":
            raise ValueError("hold_packed_sends needs Gloo without deltas (one wave)")
        ops = []
        for m, (tr, buf, cut) in enumerate(self.messages):
            for lo, hi in cut:
                (self.held if tr.send and m >= self.direct else ops).append((tr, buf, lo, hi))
        self._issue(0, ops)

    def release(self) -> None:
        """Issue the packed sends :meth:`start` held back."""
        held, self.held = self.held, []
        self._issue(0, held)

    def finish(self) -> None:
        """Wait for what :meth:`start` issued; with ``sync.delta`` then learn every message's length from
        its header, issue the rest at once and wait for it. One deadline for the whole wait."""
        deadline = time.monotonic() + self.ex.group.timeout_s
        self._wait(deadline)
        if self.ex.delta == "off":
            return
        self._learn_all()
        for k in range(1, self.waves if self.coalesce else 2):
            self._issue(k)
        self._wait(deadline)

    def _wait(self, deadline: float) -> None:
        for i, (work, peers, what) in enumerate(self.works):
            try:
                wait_work(self.ex.group, work, peers=peers, round_index=self.round_index, what=what, deadline=deadline)
            except PeerTimeout as exc:
                raise self._stalled(exc, self.works[i:]) from exc
        self.works = []

    def _stalled(self, exc: PeerTimeout, pending: list) -> PeerTimeout:
        """``exc`` naming every peer with an op of this wave still incomplete at the deadline, not only
        the first one waited for: a host whose link is down stalls all of its ranks at once."""
        group = self.ex.group
        stuck = {p for work, peers, _ in pending if not _completed(work) for p in peers}
        stuck.discard(exc.peer)
        if not stuck:
            return exc
        names = ", ".join(group.describe_rank(p) for p in sorted(stuck))
        return group.error(PeerTimeout, exc.peer, self.round_index,
                           f"{exc.message}; at that deadline also no progress with {names}")

    def _issue(self, k: int, ops: list[tuple[Transfer, torch.Tensor, int, int]] | None = None) -> None:
        ops = self._wave_ops(k) if ops is None else ops
        if not ops:
            return
        ex = self.ex
        pg = ex.group.pg
        if pg is None:
            raise ex.group.error(TransportError, None, self.round_index, "the bridge group is closed")
        waves = self.waves if self.coalesce else (2 if ex.delta != "off" else 1)

        def desc(tr: Transfer, lo: int, hi: int) -> str:
            return f"{'sending' if tr.send else 'receiving'} bytes [{lo}, {hi}) of a message (wave {k + 1}/{waves})"

        try:
            if self.coalesce:
                start_coalescing(pg)
            for tr, buf, lo, hi in ops:
                part = buf[lo:hi]
                work = pg.send([part], tr.peer, 0) if tr.send else pg.recv([part], tr.peer, 0)
                if not self.coalesce:
                    self.works.append((work, [tr.peer], desc(tr, lo, hi)))
                if tr.send:
                    self.sent += hi - lo
                else:
                    self.received += hi - lo
            if self.coalesce:
                work = end_coalescing(pg)
                self.works.append((work, [tr.peer for tr, *_ in ops], f"P2P batch {k + 1}/{waves} ({len(ops)} ops)"))
        except TransportError:
            raise
        except Exception as exc:  # noqa: BLE001 - every backend failure becomes a typed error
            peer = ops[0][0].peer
            raise ex.group.error(classify(exc), peer, self.round_index, f"issuing P2P ops: {exc}") from exc
        self.issued += len(ops)

    # -- sync.delta -----------------------------------------------------------
    def _delta_cuts(self, tr: Transfer) -> list[tuple[int, int]]:
        """A sender knows its message's length; a receiver only the first piece until it arrived."""
        if not tr.send:
            return wd.message_cuts(0, tr.nbytes, self.ex.chunk_bytes)
        return wd.message_cuts(tr.length, tr.nbytes, self.ex.chunk_bytes)

    def _learn_all(self) -> None:
        """Receiving: read every message's header from its first piece; cut the rest as the sender did."""
        ex = self.ex
        out = []
        for tr, buf, cuts in self.messages:
            if not tr.send:
                try:
                    tr.header = wd.read_header(buf, tr.nbytes, ex.trailer)
                except ValueError as exc:
                    raise ex.group.error(MalformedBucket, tr.peer, self.round_index, str(exc)) from None
                tr.length = tr.header.length + ex.trailer
                cuts = wd.message_cuts(tr.length, tr.nbytes, ex.chunk_bytes)
            out.append((tr, buf, cuts))
        self.messages = out
        self.waves = max((len(c) for _, _, c in out), default=0)


def _completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - a failed op: no progress
        return False


__all__ = ["RoundComm"]
