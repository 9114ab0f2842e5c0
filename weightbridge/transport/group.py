"""The bridge group: one standalone process group spanning trainer and rollout ranks.

Trainer and rollout processes already have their own worlds (Megatron's, vLLM's default
process group). The bridge group is built directly from a store with the backend classes
(``ProcessGroupGloo`` / ``ProcessGroupNCCL``), so it never reads, creates or requires the
default process group and is not registered in ``torch.distributed``'s global state.
Point-to-point ops are issued on the backend object (``pg.send`` / ``pg.recv``; NCCL batches
coalesced exactly like ``dist.batch_isend_irecv``), see :mod:`weightbridge.transport.executor`.

Bridge ranks (trainers first) and their spec names come from the group's
:class:`~weightbridge.sync.roster.Roster`, the one place ranks are translated; a group created
without one numbers ranks as its plan does (trainer plan rank ``t`` -> ``t``, rollout plan rank
``j`` -> ``num_trainers + j``) and names them the same.
"""

from __future__ import annotations

import atexit
import datetime
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from weightbridge import _torch_compat as compat
from weightbridge.errors import BridgeError
from weightbridge.sync.roster import Roster
from weightbridge.transport.errors import PeerTimeout, TransportError, classify

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
    roster: Roster = field(default=None)  # type: ignore[assignment]  # None given: Roster.identity (plan = spec)

    def __post_init__(self) -> None:
        if self.roster is None:
            self.roster = Roster.identity(self.num_trainers, self.world_size - self.num_trainers)
        elif self.roster.world_size != self.world_size or self.roster.num_trainers != self.num_trainers:
            raise ValueError(
                f"roster of {self.roster.num_trainers} trainer + {self.roster.num_rollout} rollout ranks for a "
                f"bridge group of {self.num_trainers} trainer ranks in a world of {self.world_size}"
            )

    @property
    def num_rollout(self) -> int:
        return self.world_size - self.num_trainers

    def bridge_rank(self, side: str, rank: int) -> int:
        """Bridge rank of plan rank ``rank`` of ``side`` ("trainer" or "rollout")."""
        return self.roster.bridge_of_plan(side, rank)

    def side_rank(self, bridge_rank: int) -> tuple[str, int]:
        """(side, plan rank) of ``bridge_rank``: the inverse of :meth:`bridge_rank`."""
        return self.roster.plan_of_bridge(bridge_rank)

    def describe_rank(self, bridge_rank: int) -> str:
        """``rollout 3 (bridge rank 2)``: the spec rank of ``bridge_rank`` (what errors show)."""
        return self.roster.describe(bridge_rank)

    def error(
        self, cls: type[TransportError], peer: int | None, round_index: int | None, message: str
    ) -> TransportError:
        """A ``cls`` raised on this rank about ``peer``, naming both in spec numbering."""
        return cls(
            self.rank, peer, round_index, message, rank_name=self.describe_rank(self.rank),
            peer_name=None if peer is None else self.describe_rank(peer),
        )

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
    roster: Roster | None = None,
    signer: Any = None,
    watch: Callable[[], None] | None = None,
) -> BridgeGroup:
    """Create the bridge group on ``store`` (all ``world_size`` ranks call this; it returns when all joined).

    ``prefix`` namespaces the store keys (use a new prefix to re-create a group on the same
    store, e.g. after a membership change). ``device`` (NCCL only) is the CUDA device of this
    rank, default the current one; the NCCL communicator is initialised eagerly here with one
    tiny all-reduce so that later P2P batches may involve any subset of ranks (:func:`_nccl_parts`).
    ``roster`` (the
    epoch's, from the control plane) names the ranks in errors; None: plan numbering. ``signer``
    (a :class:`~weightbridge.sync.auth.Signer` with the job secret): the rendezvous values (each
    rank's listening addresses, NCCL's unique id) are sealed with it (:class:`SealedStore`), so a
    process without the secret cannot redirect a rank's connections to itself. ``watch`` (the
    control plane's :meth:`~weightbridge.sync.control.ControlPlane.epoch_watch`) runs while this rank
    waits for the others; what it raises (a peer failed, died or restarted) ends the creation at once
    and is raised here, instead of this rank waiting for a peer that will never come.
    Raises :class:`~weightbridge.transport.errors.PeerTimeout` when not every rank joins within
    ``timeout_s``.

    Either backend is built on a helper thread (:func:`_bounded`) that this one waits for, up to
    ``timeout_s``, running ``watch``. Gloo connects the full mesh in its constructor and waits up to
    5 x ``timeout_s`` for each pair (a peer killed after publishing its address). NCCL's communicator
    is created non-blocking (``config.blocking = 0``) and initialised by the all-reduce: torch keeps a
    communicator being initialised where ``abort()`` reaches it. A creation given up on (the deadline,
    ``watch`` raised) or failed is abandoned: its store waits end at once, and its backend is
    aborted (NCCL: the communicator, mid-init included, so no rank is left inside NCCL and torch's
    watchdog never tears the process down over it); a group the helper still builds is shut down.
    """
    if not 0 < num_trainers < world_size:
        raise ValueError(f"need 0 < num_trainers ({num_trainers}) < world_size ({world_size})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if roster is not None and (roster.world_size != world_size or roster.num_trainers != num_trainers):
        raise ValueError(f"the roster has {roster.world_size} ranks ({roster.num_trainers} trainers), the group "
                         f"{world_size} ({num_trainers} trainers)")
    while hasattr(store, "underlying"):  # a reconnecting client (store_client.py): a torch client of its own
        store = store.underlying()
    bind_host = getattr(store, "host", None)  # a TCPStore's: Gloo listens on loopback when the store is there
    sealed = signer is not None and signer.enabled
    # watch() runs on this thread while a helper thread builds the group (_bounded)
    pstore = SealedStore(dist.PrefixStore(prefix.rstrip("/") + "/", store), signer if sealed else None,
                         prefix.rstrip("/") + "/", timeout_s=timeout_s)
    try:
        if backend == "gloo":
            pg = _bounded(lambda: _gloo(pstore, rank, world_size, timeout_s, bind_host), None, pstore, rank,
                          timeout_s, watch)
            return BridgeGroup(pg, rank, world_size, "gloo", num_trainers, float(timeout_s), torch.device("cpu"),
                               roster=roster)
        if backend == "nccl":
            nccl = _nccl_parts(device)
            pg = _bounded(lambda: nccl.make(pstore, rank, world_size, timeout_s), nccl.init, pstore, rank,
                          timeout_s, watch)
            return BridgeGroup(pg, rank, world_size, "nccl", num_trainers, float(timeout_s), nccl.device,
                               roster=roster)
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001 - wrapped as a typed error naming this rank
        if isinstance(pstore.aborted, BridgeError):
            raise pstore.aborted from None  # the watch's finding (a peer failed, died or restarted)
        name = (roster or Roster.identity(num_trainers, world_size - num_trainers)).describe(rank)
        raise classify(exc)(rank, None, None, f"creating the {backend} bridge group failed: {exc}",
                            rank_name=name) from exc
    raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        import ipaddress
        import socket

        return all(ipaddress.ip_address(i[4][0]).is_loopback for i in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


_ABANDONED: list[tuple[threading.Thread, float]] = []  # group builds given up on, and when they end at the latest


def _bounded(make: Callable[[], Any], init: Callable[[Any, Callable[[], bool]], None] | None, pstore: SealedStore,
             rank: int, timeout_s: float, watch: Callable[[], None] | None) -> Any:
    """``make()`` then ``init(pg, abandoned)`` on a helper thread, waited for here up to ``timeout_s`` while
    ``watch()`` runs (the backends release the GIL while they wait). ``make`` returns the backend
    object (Gloo: once connected; NCCL: at once); ``init`` (None for Gloo) returns once its communicator
    is up, and ends early when ``abandoned()`` turns true or the object is aborted.

    Given up on (``watch`` raised, or the deadline): the store's waits are abandoned, what raised ends
    up in ``pstore.aborted`` or a timeout error is raised, and the backend object, if made, is aborted
    (:func:`_shut`). A failed ``make`` / ``init`` raises its error; a backend made before it is aborted."""
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def build() -> None:
        try:
            pg = make()
            with lock:
                if box.get("abandoned"):
                    _shut(pg)  # nobody waits for it any more: release it
                    return
                box["pg"] = pg  # from here on the waiting thread can abort it
            if init is not None:
                init(pg, lambda: bool(box.get("abandoned")))
        except BaseException as exc:  # noqa: BLE001 - raised on the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=build, name=f"weightbridge-group-{rank}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            thread.join(0.01)
            if not thread.is_alive():
                break
            if watch is not None:
                watch()
            if time.monotonic() > deadline:
                raise RuntimeError(f"wait timeout after {timeout_s * 1000:.0f}ms: not every rank connected")
        if "error" in box:
            raise box["error"]
    except BaseException as exc:
        with lock:
            box["abandoned"] = True
            pg = box.pop("pg", None)
        if pg is not None:
            _shut(pg)
        pstore.abandon(exc)
        if thread.is_alive():
            _ABANDONED.append((thread, time.monotonic() + 5 * timeout_s + 5))
        raise
    return box["pg"]


def _shut(pg: Any) -> None:
    """Abort backend ``pg`` (its pending work and, NCCL, its communicators: mid-init too)."""
    try:
        pg.abort() if hasattr(pg, "abort") else pg.shutdown()
    except Exception:  # noqa: BLE001 - best effort on teardown
        pass


@atexit.register
def _join_abandoned() -> None:
    """At exit, let abandoned group builds end first (each within Gloo's own 5 x timeout_s): a daemon
    thread still inside Gloo's C++ while the interpreter finalizes can crash the exit."""
    for thread, end in _ABANDONED:
        thread.join(max(0.0, end - time.monotonic()))


def _gloo(pstore: Any, rank: int, world_size: int, timeout_s: float, bind_host: str | None) -> Any:
    """The Gloo backend. Gloo listens on the address of this machine's hostname (or ``GLOO_SOCKET_IFNAME``),
    never on every interface; when the control store is on loopback (a single-host run) it listens on
    ``127.0.0.1`` only."""
    timeout = datetime.timedelta(seconds=timeout_s)
    opts = None
    if _is_loopback(bind_host) and not os.environ.get("GLOO_SOCKET_IFNAME"):
        opts = compat.gloo_options(timeout, "127.0.0.1")
    if opts is None:
        return dist.ProcessGroupGloo(pstore, rank, world_size, timeout)
    return dist.ProcessGroupGloo(pstore, rank, world_size, opts)


class SealedStore(dist.Store):
    """The bridge group's rendezvous store: values sealed with the job secret, waits that can be ended.

    The backends' rendezvous (c10d keys under the epoch's ``pg/`` prefix) goes through it: a value
    without the MAC raises :class:`~weightbridge.errors.ForgedMessage` (the group creation then fails
    with a typed ``TransportError``) instead of connecting to whoever wrote it (``signer`` None,
    ``auth: off``: values as they are). ``get`` and ``wait`` poll for the keys instead of blocking
    in the store, so that :meth:`abandon` (the waiting thread gave up: :func:`_bounded`) ends them
    at once. ``add`` counters are left as they are (the backends' own barriers).
    """

    def __init__(self, inner: Any, signer: Any, prefix: str, *, timeout_s: float | None = None) -> None:
        super().__init__()
        self.inner, self.signer, self.prefix = inner, signer, prefix
        self.timeout_s = timeout_s
        self.aborted: BaseException | None = None

    def abandon(self, why: BaseException) -> None:
        """The rank gave up on this rendezvous (``why``): every wait on it, now or later, raises at once."""
        if self.aborted is None:
            self.aborted = why

    def set(self, key: str, value: Any) -> None:
        value = bytes(value)
        self.inner.set(key, value if self.signer is None else self.signer.seal(self.prefix + key, value))

    def get(self, key: str) -> bytes:
        self._await([key], None)
        value = self.inner.get(key)
        return value if self.signer is None else self.signer.open(self.prefix + key, value, "bridge group rendezvous")

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self._await(list(keys), timeout)

    def _await(self, keys: list[str], timeout: Any) -> None:
        """Poll until every key exists; the deadline: ``timeout``, else the group's ``timeout_s``, else the store's."""
        if self.aborted is not None:
            raise RuntimeError(f"bridge group rendezvous abandoned: {self.aborted}")
        if timeout is None:
            timeout = self.timeout_s if self.timeout_s is not None else self.inner.timeout
        limit_s = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        deadline, sleep_s = time.monotonic() + limit_s, 0.001
        while not self.inner.check(keys):
            if self.aborted is not None:
                raise RuntimeError(f"bridge group rendezvous abandoned: {self.aborted}")
            if time.monotonic() > deadline:  # c10d's wording: classify() makes it a PeerTimeout
                raise RuntimeError(f"wait timeout after {limit_s * 1000:.0f}ms, keys: {', '.join(keys)}")
            time.sleep(sleep_s)
            sleep_s = min(sleep_s * 2, 0.01)

    def add(self, key: str, value: int) -> int:
        return self.inner.add(key, value)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self.inner.compare_set(key, expected, desired)

    def set_timeout(self, timeout: Any) -> None:
        self.inner.set_timeout(timeout)

    @property
    def timeout(self) -> Any:
        return self.inner.timeout


@dataclass
class NcclParts:
    """How :func:`create_bridge_group` builds an NCCL group (a unit test passes its own, with a fake backend)."""

    device: torch.device
    make: Callable[[Any, int, int, float], Any]  # (store, rank, world_size, timeout_s) -> backend; never blocks
    init: Callable[[Any, Callable[[], bool]], None]  # (backend, abandoned) -> once the communicator is up


def _nccl_parts(device: torch.device | str | None) -> NcclParts:
    """The real NCCL group on ``device`` (default: the current CUDA device).

    ``make``: ``ProcessGroupNCCL`` with a non-blocking communicator (``_torch_compat.nccl_options``) and
    torch's watchdog timeout at ``timeout_s`` + :data:`NCCL_WATCHDOG_SLACK_S` (the executor enforces the
    deadline itself; the watchdog never fires first). ``init``: one all-reduce creates the communicator
    on every rank (coalesced P2P on a fresh group would need all ranks), polled for completion until
    ``abandoned()``; the waiting thread aborts the group to end it early.

    Chosen over a stateless communicator outside torch (vLLM's ``PyNcclCommunicator`` over
    ``StatelessProcessGroup``): that one initialises with a blocking ``ncclCommInitRank`` (no deadline,
    no abort), and torch's ``Work`` objects keep the executor's completion polling as it is.
    """
    if not torch.cuda.is_available():
        raise ValueError("backend nccl needs CUDA")
    cls = compat.nccl_class()
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)

    def make(store: Any, rank: int, world_size: int, timeout_s: float) -> Any:
        opts = compat.nccl_options(datetime.timedelta(seconds=timeout_s + NCCL_WATCHDOG_SLACK_S), nonblocking=True)
        return cls(store, rank, world_size, opts)

    def init(pg: Any, abandoned: Callable[[], bool]) -> None:
        torch.cuda.set_device(dev)  # this helper thread's current device
        first_allreduce(pg, torch.zeros(1, device=dev), abandoned)

    return NcclParts(dev, make, init)


def first_allreduce(pg: Any, t: torch.Tensor, abandoned: Callable[[], bool]) -> None:
    """A fresh NCCL group's first all-reduce (it creates the communicator), polled until complete or
    ``abandoned()``."""
    work = pg.allreduce([t])
    while not work.is_completed():
        if abandoned():
            return
        time.sleep(0.001)
    work.wait()


def wait_work(
    group: BridgeGroup,
    work: Any,
    *,
    peers: Sequence[int],
    round_index: int | None,
    what: str,
    deadline: float | None = None,
) -> None:
    """Wait for one backend ``Work`` within the group's deadline; raise a typed error naming ``peers[0]``."""
    if deadline is None:
        deadline = time.monotonic() + group.timeout_s
    peer = peers[0] if peers else None
    others = f" (batch with peers {sorted(set(peers))})" if len(set(peers)) > 1 else ""
    try:
        if group.backend == "gloo":
            remaining = max(deadline - time.monotonic(), 0.001)
            work.wait(datetime.timedelta(seconds=remaining))
            return
        # NCCL: wait() only orders streams; poll for completion to enforce the deadline on the host.
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise group.error(PeerTimeout, peer, round_index,
                                  f"{what}{others}: no completion within {group.timeout_s:g} s")
            time.sleep(0.0002)
        work.wait()
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001 - every backend failure becomes a typed error
        desc = group.describe_rank(peer) if peer is not None else "?"
        raise group.error(classify(exc), peer, round_index, f"{what} with {desc}{others}: {exc}") from exc
