"""Transport errors that name the peer's host: a host whose link is down stops all of its ranks at once.

When the spec's ``network.hosts`` places ranks on hosts (``weightbridge/plan/network.py``), a data-plane
error about a peer gets the peer's host and the epoch's other ranks on it appended, so a cut link
reads as what it is (every rank of host 2) rather than as one rank's failure. Called by
:meth:`weightbridge.runtime.epochs.Endpoint.explain` when no peer published a root cause.
"""

from __future__ import annotations

from weightbridge.plan.network import NetworkModel
from weightbridge.sync.roster import Roster
from weightbridge.transport.errors import TransportError


def with_hosts(exc: BaseException, net: NetworkModel, roster: Roster | None) -> BaseException:
    """``exc`` with its peer's host and host-mates appended (a new error of the same type), or ``exc``
    itself when it names no peer, the spec places no hosts, or the peer is not in ``roster``."""
    if not isinstance(exc, TransportError) or exc.peer is None or roster is None or net.hosts is None:
        return exc
    try:
        peer = roster.spec_of_bridge(exc.peer)
    except ValueError:
        return exc
    host = net.node_of(peer.side, peer.rank)
    if not (isinstance(host, tuple) and host[0] == "host"):
        return exc
    mates = [str(m) for m in roster.members if m != peer and net.node_of(m.side, m.rank) == host]
    note = f"; {peer} is on host {host[1]}" + (f" with {', '.join(mates)}" if mates else "")
    try:
        return type(exc)(exc.rank, exc.peer, exc.round, exc.message + note, rank_name=exc.rank_name,
                         peer_name=exc.peer_name)
    except TypeError:  # a subclass with another constructor: keep the original
        return exc
