"""The runtime API: push new weights from trainer ranks, receive and apply them on rollout ranks.

Three classes, one per role:

* :class:`TrainerBridge` - one per trainer rank; ``push(version)`` after the optimizer step.
* :class:`RolloutBridge` - one per rollout rank (each TP/EP worker of each engine instance);
  ``poll()`` / ``ready()`` / ``apply()`` at the engine's safe points, ``version``, ``torn``;
  ``apply_instance(v)`` when an instance has several ranks (they apply the same version together).
* :class:`ColocatedBridge` - trainer and rollout tensors in one process: direct copies, no wire.

Call sequence (disaggregated, ``sync.mode`` = ``sync`` or ``async``):

1. Trainer rank 0 calls ``TrainerBridge.from_spec(spec, rank=0, tensors=..., host=H, port=P)``:
   it hosts the control store on ``H:P`` (a ``TCPStore``) and joins.
2. Every other trainer rank ``t`` and every rollout rank ``r`` calls ``from_spec(...)`` with the
   same spec, host and port (any order, any time: late rollout instances join the next push).
   ``from_spec`` takes the spec, ``rank``, ``tensors``, ``host``/``port`` or ``store``, and
   ``options`` (:class:`BridgeOptions`: the store key prefix, ``on_round`` progress hook, a test
   data plane); ``RolloutBridge.from_spec`` also ``staging`` (per rank). Everything the ranks must
   agree on is in the spec's ``sync`` section (``timeout_s``, ``round_bytes``, ``checksums``,
   ``delta``, ``receiver_dedup``, ``heartbeat_s``, ``min_instances``), so the spec hash compared at the
   handshake guarantees it: ranks whose specs differ in any of them fail with
   :class:`HandshakeMismatch` on ``spec_hash``.
3. Every trainer rank calls ``push(v)`` with the same strictly increasing ``v`` after each
   optimizer step (a collective over the trainer ranks; a rank that skips it hangs the others
   until the deadline). Trainer rank 0 decides the membership (complete rollout instances
   with live heartbeats, at least ``min_instances``), starts a new epoch when it changed or
   the previous push failed (all members re-handshake and open a new bridge group), waits
   for the staleness bound (async), and announces ``v``; all trainer ranks then send.
   ``push`` returns when every receiver **applied** ``v`` (sync, and async with
   ``max_staleness`` 0) or **staged** it (async).
4. Every rollout rank calls ``poll()`` at its safe points (e.g. between scheduler steps) and,
   when it returns True, ``apply()``. Staging (``sync.staging``, default: in async mode; a rank may
   override it with ``from_spec(staging=...)``): the bytes land in a staging copy
   on a background thread while the engine keeps serving the old weights, and ``apply()``
   copies them in; in place (default in sync mode) ``poll()`` itself receives into the live weights
   (blocking for the transfer; the rank is ``torn`` meanwhile) and ``apply()`` commits.
   An instance of several ranks (TP/PP/EP workers of one engine) must never serve a mix of
   versions: every rank of the instance calls ``apply_instance(v)`` together (e.g. from one
   collective RPC of the engine) instead of ``poll()`` / ``apply()``. The ranks agree through the
   control store: each publishes the version it has staged, and they all apply once every rank
   staged the same version ``>= v`` (``v`` None: the version all have complete, if any, without
   waiting); ``DeadlineExceeded`` names the spec ranks that never staged it, and a rank's failed
   receive raises on every rank. A process that is not a rank (e.g. the engine's driver) reads
   the instance's versions with :class:`InstanceView` (``applied()``, ``staged()``).
5. Every rank calls ``close()``; trainer rank 0 last (it hosts the store).

Staleness (async, ``max_staleness`` = k >= 1): ``push(v)`` first waits until every
receiver that has staged anything applied at least ``v - k``; so once ``push(v)`` returns,
no receiver is more than ``k`` versions behind the trainer, and a trainer ``k`` versions ahead
of the slowest receiver blocks (up to ``sync.timeout_s``, then :class:`DeadlineExceeded`).

Failures: every wait has the deadline ``sync.timeout_s``; a rank that fails publishes its
error, every member of the epoch raises a typed error (:class:`PeerFailed`,
:class:`DeadlineExceeded`, :class:`HandshakeMismatch`, or the transport's errors) instead of
hanging. A staged receiver keeps its previous version; an in-place receiver is ``torn``
(``version`` is None, ``apply()`` raises :class:`TornModelError`) until the next complete push.
The next ``push`` after a failure starts a new epoch.

Usage loop::

    # trainer rank t
    bridge = TrainerBridge.from_spec("spec.yaml", rank=t, tensors=local_params, host=H, port=P)
    for step in range(1, n + 1):
        train_step(); optimizer.step()
        bridge.push(step)
    bridge.close()

    # rollout rank r (inside the engine's loop)
    bridge = RolloutBridge.from_spec("spec.yaml", rank=r, tensors=live_params, host=H, port=P)
    while serving:
        if bridge.poll():
            bridge.apply()
        generate(...)

    # per-process options: a second bridge on the same store (its own key prefix), a progress hook,
    # and (rollout, per rank) a staging copy even in sync mode
    bridge = RolloutBridge.from_spec("spec.yaml", rank=r, tensors=live_params, store=store, staging=True,
                                     options=BridgeOptions(prefix="wb-eval", on_round=print))

    # every rank of a multi-rank instance, at the same safe point (one collective call)
    bridge.apply_instance(None)          # async: the newest version all ranks have, if any
    bridge.apply_instance(step)          # sync: wait for ``step`` on every rank, apply it together

Where the code lives (this module re-exports it): :mod:`weightbridge.runtime` -
``trainer`` (``TrainerBridge``), ``rollout`` (``RolloutBridge``), ``instance`` (instance-level
apply, ``InstanceView``), ``options`` (``BridgeOptions``), ``colocated``, ``epochs`` (joining, handshake, bridge group per epoch),
``coordinator`` (every protocol decision as a pure function of a snapshot), ``results``,
``connect``; ranks are translated only by :class:`weightbridge.sync.roster.Roster`; errors live in
:mod:`weightbridge.errors`.
"""

from __future__ import annotations

from weightbridge.runtime.colocated import ColocatedBridge
from weightbridge.runtime.connect import load_spec
from weightbridge.runtime.instance import InstanceView
from weightbridge.runtime.options import BridgeOptions
from weightbridge.runtime.results import PushStats, ReceiveStats
from weightbridge.runtime.rollout import RolloutBridge
from weightbridge.runtime.trainer import TrainerBridge

__all__ = [
    "BridgeOptions",
    "ColocatedBridge",
    "InstanceView",
    "PushStats",
    "ReceiveStats",
    "RolloutBridge",
    "TrainerBridge",
    "load_spec",
]
