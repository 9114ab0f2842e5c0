"""Bridge group and executor set-up checks that need no peer processes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from weightbridge.plan import build_plan
from weightbridge.spec.resolve import check_text
from weightbridge.transport import (BridgeGroup, Executor, PeerDisconnected, PeerTimeout, TransportError,
                                    create_bridge_group, open_store)


SPEC = """
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: megatron, mesh: {tp: 2}}
rollout: {preset: hf, instances: 2}
"""


# The demo simulates a trainer framework (its own FSDP2 world), so it may use torch.distributed itself;
# DTensor introspection reads placements (torch.distributed.tensor) and communicates nothing. The
# conformance suite starts an integration's own side world (testing/contract.py, demo/fsdp2.py); the vLLM selfcheck
# runs an FSDP2 trainer world. The vLLM engine agrees on versions through the bridge (no torch.distributed).
def test_group_creation_times_out_when_a_peer_never_joins() -> None:
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    t0 = time.monotonic()
    with pytest.raises(TransportError) as info:
        create_bridge_group(store, rank=0, world_size=2, num_trainers=1, backend="gloo", timeout_s=1.5)
    assert time.monotonic() - t0 < 10
    assert isinstance(info.value, PeerTimeout) and info.value.rank == 0


@pytest.mark.parametrize("sealed", [False, True], ids=["auth-off", "sealed"])
def test_the_watch_ends_the_rendezvous_at_once_with_its_own_error(sealed) -> None:
    """A peer that died (or restarted) before publishing its rendezvous value: the control plane's
    watch says so and the creation raises that at once instead of waiting out ``timeout_s`` (issue 13
    soak: survivors of a trainer 0 killed in the handshake sat in Gloo's rendezvous until their
    deadline and missed the restarted trainer 0's next handshake)."""
    from weightbridge.errors import PeerFailed
    from weightbridge.sync.auth import Signer
    from weightbridge.sync.roster import RankId

    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=30)
    calls: list[float] = []
    t0 = time.monotonic()

    def watch() -> None:
        calls.append(time.monotonic())
        if calls[-1] - t0 > 0.3:
            raise PeerFailed(RankId("rollout", 0), RankId("trainer", 0), "no heartbeat for 3.0s (process died or hung)")

    with pytest.raises(PeerFailed, match="no heartbeat") as info:
        create_bridge_group(store, rank=1, world_size=2, num_trainers=1, backend="gloo", timeout_s=20,
                            signer=Signer(b"k" * 32) if sealed else None, watch=watch)
    assert time.monotonic() - t0 < 5, "waited for the group's deadline"
    assert len(calls) > 2 and info.value.peer == "trainer 0"


class _FakeNccl:
    """The surface of ``ProcessGroupNCCL`` that group creation uses: an init that never completes (a peer
    that never comes: NCCL waits in its bootstrap until the communicator is aborted), fails, or succeeds."""

    def __init__(self, mode: str) -> None:
        self.mode, self.aborted, self.shutdowns = mode, threading.Event(), 0
        self.init_thread: threading.Thread | None = None

    def init(self, abandoned) -> None:
        self.init_thread = threading.current_thread()
        if self.mode == "hang":
            self.aborted.wait(60)
            raise RuntimeError("NCCL communicator was aborted on rank 1")
        if self.mode == "error":
            raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp, unhandled system error")

    def abort(self) -> None:
        self.aborted.set()

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake_nccl(monkeypatch):
    """``create_bridge_group(backend="nccl")`` with :class:`_FakeNccl` groups (no GPU here): the real
    creation logic (helper thread, deadline, watch, abort) around a fake backend; ``made`` lists them."""
    from weightbridge.transport import group as group_mod

    made: list[_FakeNccl] = []

    def parts(device):
        def make(store, rank, world_size, timeout_s):
            made.append(_FakeNccl(parts.mode))
            return made[-1]

        return group_mod.NcclParts(torch.device("cpu"), make, lambda pg, abandoned: pg.init(abandoned))

    monkeypatch.setattr(group_mod, "_nccl_parts", parts)
    parts.made = made
    return parts


def _nccl_group(timeout_s: float = 1.0, watch=None):
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    return create_bridge_group(store, rank=1, world_size=2, num_trainers=1, backend="nccl", timeout_s=timeout_s,
                               watch=watch)


def test_nccl_init_that_never_completes_is_aborted_at_the_deadline(fake_nccl) -> None:
    """Issue 28: the first all-reduce blocked the caller with no bound, and when the wait raised the group
    was neither aborted nor released (NCCL's watchdog later tore the healthy process down)."""
    fake_nccl.mode = "hang"
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout) as info:
        _nccl_group(timeout_s=1.0)
    assert time.monotonic() - t0 < 1.0 + 2 and info.value.rank == 1
    [pg] = fake_nccl.made
    assert pg.aborted.is_set(), "the communicator being initialised was not aborted"
    pg.init_thread.join(5)
    assert not pg.init_thread.is_alive()  # the abort ended the init: nothing is left inside NCCL


def test_nccl_init_is_aborted_when_the_watch_finds_a_dead_peer(fake_nccl) -> None:
    from weightbridge.errors import PeerFailed
    from weightbridge.sync.roster import RankId

    fake_nccl.mode = "hang"
    t0 = time.monotonic()

    def watch() -> None:
        if time.monotonic() - t0 > 0.2:
            raise PeerFailed(RankId("rollout", 0), RankId("trainer", 0), "no heartbeat for 3.0s (process died or hung)")

    with pytest.raises(PeerFailed, match="no heartbeat"):
        _nccl_group(timeout_s=20, watch=watch)
    assert time.monotonic() - t0 < 5, "waited for the group's deadline"
    assert fake_nccl.made[0].aborted.is_set()


def test_nccl_init_error_is_typed_and_the_group_aborted(fake_nccl) -> None:
    fake_nccl.mode = "error"
    with pytest.raises(PeerDisconnected, match="creating the nccl bridge group failed: NCCL error") as info:
        _nccl_group()
    assert info.value.rank == 1 and fake_nccl.made[0].aborted.is_set()


def test_a_created_nccl_group_is_aborted_only_by_close_after_a_failure(fake_nccl) -> None:
    fake_nccl.mode = "ok"
    group = _nccl_group()
    [pg] = fake_nccl.made
    assert group.backend == "nccl" and group.pg is pg and not pg.aborted.is_set()
    group.close(abort=True)
    assert pg.aborted.is_set() and group.pg is None


def test_group_arguments_are_checked() -> None:
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=5)
    with pytest.raises(ValueError):
        create_bridge_group(store, rank=0, world_size=2, num_trainers=2, backend="gloo", timeout_s=1)
    with pytest.raises(ValueError):
        create_bridge_group(store, rank=3, world_size=3, num_trainers=1, backend="gloo", timeout_s=1)
    with pytest.raises(ValueError):
        create_bridge_group(store, rank=0, world_size=3, num_trainers=1, backend="mpi", timeout_s=1)  # type: ignore[arg-type]


def test_bridge_rank_numbering() -> None:
    g = BridgeGroup(pg=None, rank=3, world_size=6, backend="gloo", num_trainers=2, timeout_s=1.0)
    assert g.bridge_rank("trainer", 1) == 1 and g.bridge_rank("rollout", 0) == 2 and g.bridge_rank("rollout", 3) == 5
    assert g.side_rank(4) == ("rollout", 2) and g.side_rank(0) == ("trainer", 0)
    with pytest.raises(ValueError):
        g.bridge_rank("rollout", 4)


def test_executor_checks_plan_group_and_tensors() -> None:
    r, problems = check_text(SPEC)
    assert not problems
    plan = build_plan(r.trainer, r.rollout, round_bytes=1 << 20)
    cpu = torch.device("cpu")
    bad_world = BridgeGroup(pg=None, rank=0, world_size=5, backend="gloo", num_trainers=2, timeout_s=1.0)
    with pytest.raises(ValueError, match="plan is for"):
        Executor(plan, bad_world, side="trainer", rank=0, device=cpu)
    g = BridgeGroup(pg=None, rank=2, world_size=4, backend="gloo", num_trainers=2, timeout_s=1.0)
    with pytest.raises(ValueError, match="bridge rank"):
        Executor(plan, g, side="trainer", rank=0, device=cpu)
    ex = Executor(plan, g, side="rollout", rank=0, device=cpu)
    with pytest.raises(ValueError, match="missing"):
        ex.check_tensors({}, {})
    with pytest.raises(TransportError, match="closed"):
        ex.run({})
