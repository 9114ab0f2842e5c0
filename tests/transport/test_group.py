"""Bridge group and executor set-up checks that need no peer processes."""

from __future__ import annotations

import time

import pytest
import torch

from weightbridge.plan import build_plan
from weightbridge.spec.resolve import check_text
from weightbridge.transport import BridgeGroup, Executor, PeerTimeout, TransportError, create_bridge_group, open_store


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
