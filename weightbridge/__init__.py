"""weightbridge: move updated weights from RL trainers to rollout engines.

The pure core (``weightbridge.spec``, ``weightbridge.layout``, ``weightbridge.plan``)
imports no ``torch.distributed`` and runs without a process group.
"""

__version__ = "0.1.0"
