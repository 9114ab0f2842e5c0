"""The data plane: the only package of weightbridge that imports ``torch.distributed``.

* :mod:`.store` — ``open_store``: the TCPStore shared by the data and control planes;
* :mod:`.group` — ``create_bridge_group``: a standalone process group (never the default one);
* :mod:`.pack` — pack/unpack plan items into wire buffers (pure torch);
* :mod:`.executor` — ``Executor``: run a ``TransferPlan`` on one rank (chunked P2P, double-buffered);
* :mod:`.errors` — typed errors naming the rank, the peer and the round;
* :mod:`.localrun` — helpers for tests, benchmarks and demos: canonical tensors, materialising a
  rank's local tensors from its IR, launching local processes with a hard deadline.

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

* every rank builds the same plan (compare ``plan.plan_hash`` first) and the same
  ``chunk_bytes`` / ``checksums``; tensors are named as in the IR (``LocalTensor.name``);
* an :class:`Executor` may be reused for many updates of the same plan (it keeps its wire slabs,
  at most ``2 x plan.round_bytes``; ``keep_buffers=False`` or ``release_buffers()`` frees them);
* on a rollout rank only the boxes named by the plan (and its local copies) are written;
  padding is untouched; nothing is written before the corresponding bytes arrived;
* any :class:`TransportError` (``PeerTimeout``, ``PeerDisconnected``, ``ChecksumError``) leaves the
  group unusable and the destination possibly partly written (torn): close the group with
  ``abort=True`` and create a new one (new ``prefix``) before the next update.
"""

from weightbridge.transport.errors import ChecksumError, PeerDisconnected, PeerTimeout, TransportError
from weightbridge.transport.executor import ExecStats, Executor, chunk_bounds
from weightbridge.transport.group import BridgeGroup, backend_for, create_bridge_group
from weightbridge.transport.pack import apply_local_copies, pack_items, torch_dtype, unpack_items
from weightbridge.transport.store import open_store

__all__ = [
    "BridgeGroup",
    "ChecksumError",
    "ExecStats",
    "Executor",
    "PeerDisconnected",
    "PeerTimeout",
    "TransportError",
    "apply_local_copies",
    "backend_for",
    "chunk_bounds",
    "create_bridge_group",
    "open_store",
    "pack_items",
    "torch_dtype",
    "unpack_items",
]
