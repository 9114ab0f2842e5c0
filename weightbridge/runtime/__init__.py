"""The runtime behind :mod:`weightbridge.bridge` (the public API and its call sequence are documented there).

=================  ============================================================================
module             holds
=================  ============================================================================
``results``        ``PushStats``, ``ReceiveStats``
``connect``        ``load_spec``; opening the control store in ``from_spec``
``options``        ``BridgeOptions`` (per-process: store key prefix, test hooks); moved-keyword hints
``epochs``         ``Endpoint``: joining, the epoch's roster and plan, handshake, bridge group
``coordinator``    every protocol decision as a pure function of a snapshot (table-tested)
``trainer``        ``TrainerBridge.push`` (every trainer rank; rank 0 also coordinates)
``rollout``        ``RolloutBridge``: receive thread, staging, ``poll`` / ``apply``
``instance``       ``apply_instance``: the ranks of one instance apply one version together;
                   ``InstanceView`` for a driver process
``colocated``      ``ColocatedBridge``: both sides in one process, no wire
=================  ============================================================================
"""
