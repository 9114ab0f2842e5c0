"""The bridge group: one standalone process group spanning trainer and rollout ranks.

Trainer and rollout processes already have their own worlds (Megatron's, vLLM's default
process group). The bridge group is built directly from a store with the backend classes
(``ProcessGroupGloo`` / ``ProcessGroupNCCL``), so it never reads, creates or requires the
default process group and is not registered in ``torch.distributed``'s global state.
Point-to-point ops are issued on the backend object (``pg.send`` / ``pg.recv``; NCCL batches
coalesced exactly like ``dist.batch_isend_irecv``), see :mod:`weightbridge.transport.executor`.

Bridge-world rank numbering: trainer rank ``t`` -> ``t``; rollout rank ``r`` -> ``num_trainers + r``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from weightbridge.transport.errors import TransportError, classify

Backend = Literal["gloo", "nccl"]

# NCCL's own watchdog aborts the process when an op exceeds the group timeout. The executor
# enforces the deadline itself (and raises a typed error), so the backend gets this much slack.
NCCL_WATCHDOG_SLACK_S = 60.0


@dataclass
class BridgeGroup:
    """A standalone process group over ``world_size`` bridge ranks (trainers first)."""

    pg: Any  # torch ProcessGroupGloo / ProcessGroupNCCL backend object
    rank: int  # this process's bridge rank
    world_size: int  # num_trainers + number of rollout ranks
    backend: str  # "gloo" | "nccl"
    num_trainers: int
    timeout_s: float  # deadline of every wait on this group
    device: torch.device | None = None  # NCCL: the CUDA device the communicator is bound to

    @property
    def num_rollout(self) -> int:
        return self.world_size - self.num_trainers

    def bridge_rank(self, side: str, rank: int) -> int:
        """Bridge rank of ``rank`` of ``side`` ("trainer" or "rollout")."""
        if side == "trainer":
            if not 0 <= rank < self.num_trainers:
                raise ValueError(f"trainer rank {rank} outside [0, {self.num_trainers})")
            return rank
        if side == "rollout":
            if not 0 <= rank < self.num_rollout:
                raise ValueError(f"rollout rank {rank} outside [0, {self.num_rollout})")
            return self.num_trainers + rank
        raise ValueError(f"side must be 'trainer' or 'rollout', got {side!r}")

    def side_rank(self, bridge_rank: int) -> tuple[str, int]:
        """Inverse of :meth:`bridge_rank`."""
        if bridge_rank < self.num_trainers:
            return "trainer", bridge_rank
        return "rollout", bridge_rank - self.num_trainers

    def describe_rank(self, bridge_rank: int) -> str:
        side, r = self.side_rank(bridge_rank)
        return f"{side} rank {r} (bridge rank {bridge_rank})"

    def close(self, abort: bool = False) -> None:
        """Release the backend. ``abort=True`` after a failure (pending ops are dropped)."""
        pg, self.pg = self.pg, None
        if pg is None:
            return
        try:
            if abort and hasattr(pg, "abort"):
                pg.abort()
            elif hasattr(pg, "shutdown"):
                pg.shutdown()
        except Exception:  # noqa: BLE001 - best effort on teardown
            pass


def backend_for(transport: str, device: torch.device | str) -> str:
    """The backend of ``sync.transport`` for tensors on ``device``: ``auto`` = nccl on CUDA, else gloo."""
    device = torch.device(device)
    if transport == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if transport == "nccl":
        if device.type != "cuda":
            raise ValueError(f"transport nccl needs CUDA tensors, got device {device}")
        return "nccl"
    if transport == "gloo":
        return "gloo"
    raise ValueError(f"transport must be auto, nccl or gloo, got {transport!r}")


def create_bridge_group(
    store: dist.Store,
    *,
    rank: int,
    world_size: int,
    num_trainers: int,
    backend: Backend,
    timeout_s: float,
    prefix: str = "wb/data",
    device: torch.device | str | None = None,
) -> BridgeGroup:
    """Create the bridge group on ``store`` (all ``world_size`` ranks call this; it returns when all joined).

    ``prefix`` namespaces the store keys (use a new prefix to re-create a group on the same
    store, e.g. after a membership change). ``device`` (NCCL only) is the CUDA device of this
    rank, default the current one; the NCCL communicator is initialised eagerly here with one
    tiny all-reduce so that later P2P batches may involve any subset of ranks.
    Raises :class:`~weightbridge.transport.errors.PeerTimeout` when not every rank joins within
    ``timeout_s``.
    """
    if not 0 < num_trainers < world_size:
        raise ValueError(f"need 0 < num_trainers ({num_trainers}) < world_size ({world_size})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    pstore = dist.PrefixStore(prefix.rstrip("/") + "/", store)
    try:
        if backend == "gloo":
            pg = dist.ProcessGroupGloo(pstore, rank, world_size, datetime.timedelta(seconds=timeout_s))
            return BridgeGroup(pg, rank, world_size, "gloo", num_trainers, float(timeout_s), torch.device("cpu"))
        if backend == "nccl":
            return _create_nccl(pstore, rank, world_size, num_trainers, timeout_s, device)
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001 - wrapped as a typed error naming this rank
        raise classify(exc)(rank, None, None, f"creating the {backend} bridge group failed: {exc}") from exc
    raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")


def _create_nccl(pstore, rank, world_size, num_trainers, timeout_s, device) -> BridgeGroup:
    if not torch.cuda.is_available():
        raise ValueError("backend nccl needs CUDA")
    try:
        from torch.distributed import ProcessGroupNCCL
    except ImportError as exc:  # CPU-only build of torch
        raise ValueError("this torch build has no NCCL backend") from exc
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    opts = ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s + NCCL_WATCHDOG_SLACK_S)
    try:
        opts.group_name = "weightbridge"
    except (AttributeError, TypeError):  # older builds
        pass
    pg = ProcessGroupNCCL(pstore, rank, world_size, opts)
    group = BridgeGroup(pg, rank, world_size, "nccl", num_trainers, float(timeout_s), dev)
    # Eager communicator init on every rank (coalesced P2P on a fresh group would need all ranks).
    t = torch.zeros(1, device=dev)
    work = pg.allreduce([t])
    from weightbridge.transport.executor import wait_work  # local import: executor imports this module

    wait_work(group, work, peers=list(range(world_size)), round_index=None, what="initialising NCCL")
    return group
