"""What the hostile-client harness writes: every runtime key (read off ``Keys``) and the garbage kinds.

Used by the stranger process (:func:`weightbridge.testing._internal.soak_roles.stranger`, which builds each
value at the moment it writes it, for the epoch current then) and by the harness parent
(:mod:`weightbridge.testing._internal.hostile`, which plans the steps). Nothing here is hard-coded from the
key table in :mod:`weightbridge.sync.messages`: the keys are the public members of its ``Keys``
class, filled with every rank / epoch / stage the job has; the message class of a key is the one
whose ``kind`` equals the ``Keys`` member's name; a member whose parameters this module cannot fill
is reported as not covered.
"""

from __future__ import annotations

import random
from typing import Any

GARBAGE_KINDS = ("random-bytes", "wrong-kind", "big-5MB", "huge-numbers", "not-an-int", "delete", "replay")
# replay: the genuine value the key held after the job's first push, written back (an old, signed value)


def message_classes() -> dict[str, type]:
    """The control message classes by their ``kind`` (which is also the name of their :class:`Keys` method)."""
    from weightbridge.sync import messages as M

    out = {}
    for obj in vars(M).values():
        fields = getattr(obj, "model_fields", None)
        if isinstance(obj, type) and fields and "kind" in fields and isinstance(fields["kind"].default, str):
            out[fields["kind"].default] = obj
    return out


def _fill(cls: type, number: int) -> bytes:
    """A message of ``cls`` with every integer field ``number`` (``model_construct``: no validation)."""
    import typing

    vals: dict[str, Any] = {}
    for name, f in cls.model_fields.items():
        if name in ("kind", "protocol"):
            continue
        ann, args = f.annotation, typing.get_args(f.annotation)
        if ann is int or int in args:
            vals[name] = number
        elif typing.get_origin(ann) is typing.Literal:
            vals[name] = args[0]
        elif ann is bool:
            vals[name] = False
        elif typing.get_origin(ann) is tuple:
            vals[name] = (number,) if int in args else ()
        else:
            vals[name] = "stranger"
    return cls.model_construct(**vals).model_dump_json().encode()


def _current_epoch(store, keys) -> int:
    import re

    try:
        raw = store.get(keys.epoch).decode(errors="replace") if store.check([keys.epoch]) else ""
        found = re.findall(r"\d+", raw)
        return int(found[-1]) if found else 1
    except Exception:  # noqa: BLE001
        return 1


def resolve_key(cfg: dict, store, st: dict) -> str:
    """``Keys(prefix).<method>(*args)`` with the epochs ``"cur"`` / ``"next"`` resolved now."""
    from weightbridge.sync.messages import Keys

    keys = Keys(cfg["prefix"])
    epoch = _current_epoch(store, keys)
    args = [epoch if a == "cur" else epoch + 1 if a == "next" else a for a in st["args"]]
    attr = getattr(keys, st["method"])
    return attr(*args) if callable(attr) else attr


def snapshot(cfg: dict, store, steps: list[dict]) -> dict[str, tuple[str, bytes | None]]:
    """label -> (key, its value now or None): what a ``replay`` step writes back later."""
    out = {}
    for st in steps:
        if st.get("kind") == "replay":
            key = resolve_key(cfg, store, st)
            out[st["label"]] = (key, store.get(key) if store.check([key]) else None)
    return out


def garbage_for(cfg: dict, store, st: dict, snap: dict | None = None) -> tuple[str, bytes | None]:
    """The key (:func:`resolve_key`) and the garbage value of ``st["kind"]`` (None: delete the key)."""
    if st["kind"] == "replay" and snap and st["label"] in snap:
        return snap[st["label"]]  # (None: the key was absent then, so the replay deletes it)
    key = resolve_key(cfg, store, st)
    rng = random.Random(st.get("seed", 0))
    classes = message_classes()
    own = classes.get(st["method"])
    kind = st["kind"]
    if kind == "random-bytes":
        return key, bytes(rng.getrandbits(8) for _ in range(64))
    if kind == "wrong-kind":
        other = next(c for k, c in sorted(classes.items()) if c is not own)
        return key, _fill(other, 1)
    if kind == "big-5MB":
        return key, b'{"kind":"' + b"x" * (5 * 1024 * 1024) + b'"}'
    if kind == "huge-numbers":
        return key, _fill(own, 10**12) if own is not None else str(10**12).encode()
    if kind == "not-an-int":
        return key, b"not-an-integer"
    return key, None


def key_targets(num_trainer: int, num_rollout: int) -> tuple[list[dict], list[str]]:
    """Every key the runtime uses, read off :class:`Keys` now: ``[{"method", "args", "label"}]``, and the
    methods whose parameters this harness cannot fill (reported as not covered)."""
    import inspect
    import itertools

    from weightbridge.sync.messages import Keys

    whos = [f"trainer/{t}" for t in range(num_trainer)] + [f"rollout/{r}" for r in range(num_rollout)]
    values = {"who": whos, "epoch": ["cur", "next"], "stage": ["staged", "applied"], "rollout_rank": list(range(num_rollout)),
              "instance": [0], "session": ["stranger"], "round": [0], "n": [1]}
    out, uncovered = [], []
    for name, member in inspect.getmembers(Keys):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            out.append({"method": name, "args": [], "label": name})
            continue
        if not callable(member):
            continue
        params = [p for p in inspect.signature(member).parameters if p != "self"]
        if any(p not in values for p in params):
            uncovered.append(f"Keys.{name}({', '.join(params)})")
            continue
        for combo in itertools.product(*(values[p] for p in params)):
            out.append({"method": name, "args": list(combo), "label": f"{name}({', '.join(map(str, combo))})"})
    return out, uncovered
