"""Megatron's deferred parameter all-gather (distributed optimizer + ``overlap_param_gather``) and push:
the replicas are stale after the optimizer step; the push hook refuses or gathers (real Megatron-Core
DistributedDataParallel on a Gloo dp-2 world; weightbridge.integrations.megatron.params)."""

from __future__ import annotations

import pytest

from weightbridge.localrun import launch
from weightbridge.testing._internal.optional import require
from weightbridge.transport.store import open_store

require("megatron.core", extra="megatron")

import megatron_cases  # noqa: E402 - after the optional import check

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_stale_replicas_are_refused_or_gathered_before_a_push():
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    results = launch(megatron_cases.param_sync_rank, [(r, store.port) for r in range(2)], timeout_s=240)
    for res in results:
        events = res.unwrap()
        for step in (0, 1):
            stale, refused, gathered = [e for e in events if e[1] == step]
            assert stale[2] >= 1 and stale[3] is False, events  # after the step: pending, replicas differ
            assert "not all-gathered yet" in refused[2] and f"trainer {res.index}" in refused[2]
            assert gathered[2:] == (0, True), events  # gathered: every replica holds the new parameters
