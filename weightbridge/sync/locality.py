"""Which pairs of an epoch share memory: the colocated data plane's choice, from the members' identities (pure).

Every member computes the same answer from the same authenticated hellos (their
:class:`~weightbridge.sync.messages.DeviceIdentity`), so both ends of a pair agree on how its bytes move.

* ``host`` (``sync.transport: shm``, ``ipc``, and ``auto`` on CPU): two members are local when they are
  on one host (one boot and network namespace: :func:`weightbridge.transport.identity.host_identity`).
* ``shared-gpu`` (``auto`` on CUDA): the same, but only when some GPU holds two members (a colocated
  trainer and engine: NCCL cannot put both in one communicator); otherwise no pair is local and every
  byte goes over NCCL, as before shared memory existed.

A member without an identity (a data plane that states none) is local to nobody.
"""

from __future__ import annotations

from collections.abc import Mapping

from weightbridge.sync.messages import DeviceIdentity

POLICIES = ("host", "shared-gpu")

__all__ = ["POLICIES", "all_local", "local_peers", "shares_a_gpu"]


def shares_a_gpu(identities: Mapping[int, DeviceIdentity | None]) -> bool:
    """Whether two members are on one GPU (by UUID; by host and index where no UUID is known)."""
    seen: set[str] = set()
    for ident in identities.values():
        if ident is None or ident.device in ("", "cpu"):
            continue
        key = ident.device if ident.device.startswith(("GPU-", "MIG-")) else f"{ident.host}/{ident.device}"
        if key in seen:
            return True
        seen.add(key)
    return False


def local_peers(identities: Mapping[int, DeviceIdentity | None], me: int, policy: str) -> frozenset[int]:
    """The members (bridge ranks) whose pairs with ``me`` go through shared memory under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"locality policy must be one of {POLICIES}, got {policy!r}")
    mine = identities.get(me)
    if mine is None or (policy == "shared-gpu" and not shares_a_gpu(identities)):
        return frozenset()
    return frozenset(b for b, ident in identities.items()
                     if b != me and ident is not None and ident.host == mine.host)


def all_local(identities: Mapping[int, DeviceIdentity | None], policy: str) -> bool:
    """Whether every pair of members is local (then the epoch needs no wire group at all)."""
    members = sorted(identities)
    if not members:
        return True
    return len(local_peers(identities, members[0], policy)) == len(members) - 1
