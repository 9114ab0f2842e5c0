"""The control plane of the runtime (public API: :mod:`weightbridge.bridge`; errors: :mod:`weightbridge.errors`).

* :mod:`.messages` — typed JSON control messages and the store key layout;
* :mod:`.control` — ``ControlPlane``: deadlines on every wait, failure fan-out, heartbeats, handshake;
* :mod:`.board` — ``Board``: every key the runtime reads or writes, as a typed method;
* :mod:`.roster` — ``RankId``, ``Roster``: the only translation between spec, plan and bridge ranks;
* :mod:`.membership` — the plan of an epoch's roster, dtype digests, tensor checks;
* :mod:`.dataplane` — the seam to :mod:`weightbridge.transport` (one bridge group per epoch);
* :mod:`.verify` — compare local tensors bitwise with canonical ones (tests, demo).
"""
