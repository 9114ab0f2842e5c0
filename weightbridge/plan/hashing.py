"""The plan hash: sha256 of a canonical byte form of a plan's content.

Every rank computes it from its own plan and compares it with its peers' before moving a byte,
so it must be a function of the plan's values only: never of object identity, dict order,
``PYTHONHASHSEED`` or the CPython version.
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Sequence
from operator import itemgetter

# 2: replica groups; 3: relay groups per node, NIC-balanced senders; 4: nearest holders and shared-memory
# pricing (local_copy); 5: rounds paced by the receivers (streaming receive)
PLANNER_VERSION = "weightbridge-plan/5"

_COLS = [itemgetter(c) for c in (0, 1, 2, 4)]  # Bucket: src_side, sender, receiver, nbytes
_ITEMS = itemgetter(3)  # Bucket.items


def plan_hash(header: tuple, rounds: Sequence, copies: Sequence[tuple]) -> str:
    """sha256 (hex) over a canonical byte form of the plan, identical across processes and runs.

    ``rounds`` are :class:`~weightbridge.plan.types.Round` values, ``copies`` ``LocalCopy`` values
    (this module imports nothing from the planner: ``types`` calls it).

    The byte form is ``marshal`` format version 0 of plain tuples of str/int/bool (stable across
    CPython versions; no interning or reference flags): first ``(PLANNER_VERSION, *header)``;
    then per round the items of every item tuple not seen before (in first-use order) and the
    round as ``(index, src_sides, senders, receivers, nbytes, ks)`` where ``ks[j]`` numbers
    bucket ``j``'s item tuple among the distinct item tuples, in first-use order; then the local
    copies. Item tuples are told apart by content: buckets that share one tuple object and
    buckets holding equal copies hash alike (object identity only saves re-reading a tuple).
    """
    h = hashlib.sha256()
    h.update(marshal.dumps((PLANNER_VERSION, *header), 0))
    by_content: dict[tuple, int] = {}  # item tuple -> first-use number
    by_id: dict[int, int] = {}  # id(item tuple) -> its number: a cache (every tuple stays alive meanwhile)
    for r in rounds:
        bk = r.buckets
        tuples = list(map(_ITEMS, bk))
        ids = list(map(id, tuples))
        for i, items in dict(zip(ids, tuples)).items():  # distinct objects, first use order
            if i in by_id:
                continue
            k = by_content.get(items)
            if k is None:
                k = by_content[items] = len(by_content)
                h.update(marshal.dumps(tuple(map(tuple, items)), 0))
            by_id[i] = k
        ks = list(map(by_id.__getitem__, ids))
        h.update(marshal.dumps((r.index, *(list(map(c, bk)) for c in _COLS), ks), 0))
    h.update(marshal.dumps(tuple(map(tuple, copies)), 0))
    return h.hexdigest()


def plan_inputs_hash(trainer, rollout, round_bytes: int, network, receiver_dedup: str) -> str:
    """sha256 (hex) of everything a plan is a function of: the planner version, both sides'
    layouts (every rank's number, instance, local rank and tensors with their pieces; the weights
    quantised at the sender), the arguments and the network model's fields. Ranks that plan only their own slice
    (``build_rank_plan``) compare this instead of the content hash of a global plan they never build.

    ``trainer`` / ``rollout`` are ``SideLayout`` values, ``network`` a ``NetworkModel`` (a dataclass
    of str/int/float/bool/None fields). Tensor tuples shared between ranks (replicas, identical
    instances) are serialized once and referred to by first-use number, as in :func:`plan_hash`.
    """
    h = hashlib.sha256()
    net = tuple(getattr(network, f) for f in sorted(network.__dataclass_fields__))
    h.update(marshal.dumps((PLANNER_VERSION, "inputs", round_bytes, receiver_dedup, net), 0))
    by_content: dict[tuple, int] = {}
    by_id: dict[int, int] = {}
    for side in (trainer, rollout):
        heads = []
        for lay in side.ranks:
            k = by_id.get(id(lay.tensors))
            if k is None:
                k = by_content.get(lay.tensors)
                if k is None:
                    k = by_content[lay.tensors] = len(by_content)
                    h.update(marshal.dumps(tuple((t.name, t.shape, t.dtype, tuple(map(tuple, t.pieces)))
                                                 for t in lay.tensors), 0))
                by_id[id(lay.tensors)] = k
            heads.append((lay.rank, lay.instance, lay.local_rank, k))
        quant = tuple((q.weight, q.scale, q.shape, tuple(q.scheme), q.source) for q in side.quant)
        h.update(marshal.dumps((side.side, side.num_instances, tuple(heads), side.casts, quant), 0))
    return h.hexdigest()


__all__ = ["PLANNER_VERSION", "plan_hash", "plan_inputs_hash"]
