"""The data plane: the only package of weightbridge that imports ``torch.distributed``.

* :mod:`.store` — ``open_store``: the TCPStore shared by the data and control planes;
* :mod:`.group` — ``create_bridge_group``: a standalone process group (never the default one);
* :mod:`.pack` — pack/unpack plan items into wire buffers (pure torch);
* :mod:`.executor` — ``Executor``: run a ``TransferPlan`` on one rank (chunked P2P, double-buffered);
* :mod:`.errors` — typed errors naming the rank, the peer and the round;
* :mod:`.localrun` — helpers for tests, benchmarks and demos: canonical tensors, materialising a
  rank's local tensors from its IR, launching local processes with a hard deadline.
"""

from weightbridge.transport.errors import ChecksumError, PeerFailed, PeerTimeout, TransportError
from weightbridge.transport.executor import ExecStats, Executor, chunk_bounds
from weightbridge.transport.group import BridgeGroup, backend_for, create_bridge_group
from weightbridge.transport.pack import apply_local_copies, pack_items, torch_dtype, unpack_items
from weightbridge.transport.store import open_store

__all__ = [
    "BridgeGroup",
    "ChecksumError",
    "ExecStats",
    "Executor",
    "PeerFailed",
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
