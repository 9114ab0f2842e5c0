"""Data senders authenticated: before the first byte of an epoch, every pair that exchanges data proves the secret.

The bridge group's rendezvous (c10d keys under the epoch's ``pg/`` prefix) is not authenticated,
so a process without the job secret could take a rank's place in the group. Each member therefore
runs :func:`authenticate_peers` once per epoch, right after the group is created
(:meth:`weightbridge.runtime.epochs.Endpoint.enter_epoch`, through
:meth:`weightbridge.sync.dataplane.TransportDataPlane.authenticate`), with the peers its plan
actually talks to (:func:`weightbridge.sync.membership.data_check`: the ranks it sends buckets to or
receives buckets from):

* to each peer it sends ``token(me -> peer)`` and from each it receives 16 bytes, all async
  (``send``/``recv`` on the group, tag :data:`AUTH_TAG`; NCCL: one coalesced batch), with the group's
  deadline (:func:`~weightbridge.transport.group.wait_work`);
* it compares what it received with ``token(peer -> me)`` (constant time). The tokens are
  :func:`weightbridge.sync.auth.data_token`: HMAC of the job secret over the epoch, both spec ranks
  and both ranks' hello nonces of the epoch (published signed on the control store), so a token is
  good for one direction of one pair in one epoch.

A mismatch raises :class:`UnauthenticatedPeer` naming both spec ranks, before any data is received
from that peer; the caller publishes it as the rank's failure (so the genuine peers stop too) and
drops the group. Both ends of a pair run this (the pair sets are symmetric: a rank sends to a peer
iff the peer receives from it), so nobody waits for a token that is never sent.

Cost: one round trip of 16-byte messages per peer per epoch (not per push): measured in
``tests/sync/test_auth_mp.py`` (reported in ``docs/trust.md``).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable

import torch

from weightbridge._torch_compat import end_coalescing, start_coalescing
from weightbridge.transport.errors import TransportError, classify
from weightbridge.transport.group import BridgeGroup, wait_work

AUTH_TAG = 0x7762  # "wb": distinct from the data's tag 0
TOKEN_BYTES = 16

__all__ = ["AUTH_TAG", "UnauthenticatedPeer", "authenticate_peers"]


class UnauthenticatedPeer(TransportError):
    """The process at bridge rank ``peer`` did not prove the job secret for the spec rank it claims (no data
    was received from it): a process without the secret took its place in the group's rendezvous, or
    the ranks hold different secrets."""


def authenticate_peers(
    group: BridgeGroup, peers: Iterable[int], token: Callable[[int, int], bytes],
) -> float:
    """Exchange tokens with every bridge rank in ``peers``; returns the seconds it took.

    ``token(src, dst)`` (bridge ranks) is what ``src`` must send ``dst``. Raises
    :class:`UnauthenticatedPeer` for the first peer whose token does not verify,
    :class:`~weightbridge.transport.errors.PeerTimeout` / ``PeerDisconnected`` when a peer sends nothing
    within the group's deadline.
    """
    t0 = time.perf_counter()
    peers = sorted(set(peers) - {group.rank})
    if not peers:
        return 0.0
    pg = group.pg
    if pg is None:
        raise group.error(TransportError, None, None, "the bridge group is closed")
    dev = group.device if group.backend == "nccl" and group.device is not None else torch.device("cpu")
    out = {p: torch.frombuffer(bytearray(token(group.rank, p)), dtype=torch.uint8).to(dev) for p in peers}
    got = {p: torch.zeros(TOKEN_BYTES, dtype=torch.uint8, device=dev) for p in peers}
    works = []
    coalesce = group.backend == "nccl"
    try:
        if coalesce:
            start_coalescing(pg)
        for p in peers:
            ws = pg.send([out[p]], p, AUTH_TAG)
            wr = pg.recv([got[p]], p, AUTH_TAG)
            if not coalesce:
                works += [(ws, p, "sending the data-sender token"), (wr, p, "receiving the data-sender token")]
        if coalesce:
            works.append((end_coalescing(pg), peers[0], "the data-sender token batch"))
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise group.error(classify(exc), peers[0], None, f"issuing the data-sender check: {exc}") from exc
    deadline = time.monotonic() + group.timeout_s
    for work, p, what in works:
        wait_work(group, work, peers=[p] if not coalesce else peers, round_index=None, what=what, deadline=deadline)
    for p in peers:
        if not hmac.compare_digest(bytes(got[p].cpu().tolist()), token(p, group.rank)):
            raise group.error(
                UnauthenticatedPeer, p, None,
                f"{group.describe_rank(p)} did not prove the job secret for this epoch; no data is taken from it "
                "(a process without the secret in the bridge group's rendezvous, or ranks with different secrets)",
            )
    return time.perf_counter() - t0
