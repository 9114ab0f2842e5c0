"""What every hello states about its rank: the host identity and the device identity."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from weightbridge.transport.identity import device_identity, host_identity, identity_of

CHILD = "from weightbridge.transport.identity import host_identity; print(host_identity())"


def test_processes_of_one_host_share_its_identity() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == host_identity() and len(host_identity()) == 16


def test_another_network_namespace_is_another_host() -> None:
    """How tests simulate hosts on one machine (RECIPES: network namespaces): a rank there must not be taken
    for a neighbour that shares this host's memory."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        pytest.skip("cannot create a network namespace here (needs unshare and root)")
    out = subprocess.run(["unshare", "-n", sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                         check=True)
    assert len(out.stdout.strip()) == 16 and out.stdout.strip() != host_identity()


def test_a_gpu_is_named_by_its_uuid_whatever_this_process_numbers_it() -> None:
    """Fake UUIDs through the seam (no GPU here: bench/gpu_readiness.py reads a real one); the label keeps
    this process's index for messages."""
    uuids = {0: "5f0c2d1e-aaaa", 1: "MIG-77"}
    seam = lambda dev: uuids.get(dev.index)  # noqa: E731
    assert device_identity("cuda:1", uuid=seam) == ("MIG-77", "cuda:1")
    assert device_identity("cuda:0", uuid=lambda dev: "GPU-5f0c") == ("GPU-5f0c", "cuda:0")
    assert device_identity("cuda:2", uuid=seam) == ("cuda:2", "cuda:2")  # no UUID known: the index
    assert device_identity("cpu") == ("cpu", "cpu")
    ident = identity_of("nccl", torch.device("cuda", 0), uuid=lambda dev: "GPU-5f0c")
    assert (ident.backend, ident.host, ident.device, ident.label) == ("nccl", host_identity(), "GPU-5f0c", "cuda:0")
    assert ident.describe() == f"nccl on cuda:0 (GPU-5f0c) of host {host_identity()}"

