"""The data plane (``torch.distributed`` is imported only here, in ``_torch_compat`` and in a few harnesses:
the list is in ``docs/architecture.md``).

* :mod:`.store` — ``open_store``: the TCPStore shared by the data and control planes;
* :mod:`.store_client` — ``ReconnectingStore``: every rank's store client (reconnects within the
  deadline, ``StoreUnreachable``), ``serve`` (the ``weightbridge store`` command);
* :mod:`.group` — ``create_bridge_group``: a standalone process group (never the default one),
  ``wait_work`` (one backend ``Work`` within the group's deadline);
* :mod:`.executor` — ``Executor``: run a ``TransferPlan`` on one rank (chunked P2P waves);
* :mod:`.pipeline` — one ``Executor.run``: per-round pack / exchange / unpack stages, double-buffered;
* :mod:`.wire` — a round's transfers, chunk cuts and checksums (pure torch);
* :mod:`.errors` — typed errors naming the rank, the peer and the round.

Packing plan items into wire buffers is pure torch: :mod:`weightbridge.tensors`. Names are imported
lazily (``from weightbridge.transport import Executor`` loads the executor then), so importing this
package or :mod:`.errors` loads neither torch nor ``torch.distributed`` (``weightbridge probe`` needs
neither the group nor the executor).

One update, on every rank (S trainer ranks, R rollout ranks; bridge rank = t, or S + r)::

    store = open_store(host, port, is_master=(bridge_rank == 0), timeout_s=t)     # or reuse one
    group = create_bridge_group(store, rank=bridge_rank, world_size=S + R, num_trainers=S,
                                backend=backend_for(sync.transport, device), timeout_s=t,
                                prefix="wb/data/epoch3")                          # new prefix = new group
    ex = Executor(plan, group, side="trainer" | "rollout", rank=side_rank, device=device,
                  chunk_bytes=64 << 20, checksums=False)   # chunk_bytes/checksums equal on all ranks
    stats = ex.run(local_tensors)                  # trainer: send
    stats = ex.run(live_params, dst=staging)       # rollout: receive into staging (or in place: dst=None)
    ...
    group.close(abort=failed)

Contract:

* every rank builds the same plan, or its slice of it (``build_rank_plan``; compare ``plan.plan_hash``
  first), and the same ``chunk_bytes`` / ``checksums``; tensors are named as in the IR (``LocalTensor.name``);
* an :class:`Executor` may be reused for many updates of the same plan (it keeps its wire slabs,
  at most ``2 x plan.round_bytes``; ``keep_buffers=False`` or ``release_buffers()`` frees them);
* on a rollout rank only the boxes named by the plan (and its local copies) are written;
  padding is untouched; nothing is written before the corresponding bytes arrived;
* any :class:`TransportError` (``PeerTimeout``, ``PeerDisconnected``, ``ChecksumError``) leaves the
  group unusable and the destination possibly partly written (torn): close the group with
  ``abort=True`` and create a new one (new ``prefix``) before the next update.
"""

from __future__ import annotations

from weightbridge._lazy import lazy_exports

_EXPORTS = {
    "BridgeGroup": "weightbridge.transport.group",
    "ChecksumError": "weightbridge.transport.errors",
    "ExecStats": "weightbridge.transport.pipeline",
    "Executor": "weightbridge.transport.executor",
    "PeerDisconnected": "weightbridge.transport.errors",
    "PeerTimeout": "weightbridge.transport.errors",
    "TransportError": "weightbridge.transport.errors",
    "backend_for": "weightbridge.transport.group",
    "chunk_bounds": "weightbridge.transport.wire",
    "create_bridge_group": "weightbridge.transport.group",
    "open_store": "weightbridge.transport.store",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
