"""What an integration gives the conformance suite, and what the suite gives it (one process per unit).

The suite runs every rank in its own fresh process (``weightbridge.localrun.launch``)
and calls the integration's factory there with a :class:`RankContext`:

* trainer factory ``(ctx) -> TrainerRank``: one call per trainer rank (``ctx.rank``);
* rollout factory ``(ctx) -> RolloutUnit``: one call per rollout rank (scope ``"rank"``), or
  one per rollout instance (scope ``"instance"``: ``ctx.ranks`` are the instance's ranks, for
  engines that start their own worker processes, such as vLLM with TP > 1).

The factories must be importable (module-level, in a module other than ``conftest.py``),
because they are looked up by ``module:qualname`` inside the rank processes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

TEST_KEYS = "wbtest"  # store prefix of the suite's own coordination keys (the bridge uses ctx.prefix)


@runtime_checkable
class TrainerRank(Protocol):
    """One trainer rank of the integration, built by the trainer factory inside its process."""

    def tensors(self) -> Mapping[str, Any]:
        """The live local tensors the bridge reads, by the spec's local names."""

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The trainer's own loader: full canonical (HF-name) tensors into its local shards.

        The suite calls it before each ``push(v)`` with the weights of version ``v`` (it stands
        in for an optimizer step) and probes it to check the spec's trainer layout.
        """

    def push(self, version: int) -> Any:
        """The integration's push: ``TrainerBridge.push(version)``; raises the bridge's typed errors."""

    def close(self) -> None:
        """Leave the bridge (``TrainerBridge.close()``) and free the rank's resources."""


@runtime_checkable
class RolloutUnit(Protocol):
    """One rollout rank (scope "rank") or one engine instance (scope "instance")."""

    def poll(self) -> bool:
        """Make progress; True when a complete version is ready for ``apply()`` (``RolloutBridge.poll``)."""

    def apply(self) -> int:
        """At a safe point: make the ready version live and return it (``RolloutBridge.apply``)."""

    @property
    def version(self) -> int | None:
        """The live version (None before the first apply and while torn)."""

    @property
    def torn(self) -> bool:
        """True while an interrupted in-place update left the live weights mixed."""

    def tensors(self, rank: int) -> Mapping[str, Any]:
        """Read back rollout rank ``rank``'s live weights, by the spec's local names (CPU tensors)."""

    def close(self) -> None:
        """Leave the bridge and stop the engine."""


# Optional on a RolloutUnit, used by layout.rollout.probe-agrees (the first one present wins):
#   probe_layout(rank) -> RankLayout | dict      the engine probes itself (weightbridge.probe.probe_loader)
#   load_weights(weights, rank)                  the engine's own loader; destinations = tensors(rank)


@dataclass(frozen=True)
class RankContext:
    """Everything a factory needs to build its side inside a rank process (picklable).

    ``rank`` is the first spec rank this process hosts, ``ranks`` all of them (one, or an
    instance's). Rollout ranks are numbered as in the spec (instance-major).
    """

    side: str  # "trainer" | "rollout"
    rank: int
    ranks: tuple[int, ...]
    world_size: int  # ranks on this side in the spec
    instance: int | None  # rollout: the engine instance; trainer: None
    spec_path: str  # the spec of this run (the integration's spec with the suite's sync section)
    host: str  # control store (hosted by the suite's pytest process)
    port: int
    prefix: str  # bridge key prefix; in bridge_kwargs()["options"]
    timeout_s: float  # the run's sync.timeout_s (already in the spec file)
    heartbeat_s: float  # the run's sync.heartbeat_s (already in the spec file)
    workdir: str  # a scratch directory of this run, shared by all its processes
    fault: tuple[int, int] | None = None  # (version, round): the suite kills this process there
    incarnation: int = 0  # > 0: a restarted process (a new side world, see init_process_group)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def resolved(self):
        """The :class:`~weightbridge.spec.resolve.ResolvedSpec` of :attr:`spec_path` (cached per process)."""
        if "resolved" not in self._cache:
            from weightbridge.bridge import load_spec

            self._cache["resolved"] = load_spec(self.spec_path)
        return self._cache["resolved"]

    def store(self):
        """A client of the run's control store (cached per process); never hosts it."""
        if "store" not in self._cache:
            from weightbridge.transport.store import open_store

            self._cache["store"] = open_store(self.host, self.port, is_master=False, timeout_s=self.timeout_s)
        return self._cache["store"]

    def bridge_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``TrainerBridge.from_spec`` / ``RolloutBridge.from_spec``: pass them all.

        ``options``: a :class:`~weightbridge.bridge.BridgeOptions` with the suite's key prefix and
        fault hook (``on_round``); trainer: ``store`` (the suite hosts it, trainer rank 0 must not);
        rollout: ``host`` / ``port``. Rollout kwargs are picklable (the options included), so an
        engine can forward them to worker processes it starts; the fault hook also travels by
        name (:class:`FaultHook`). Everything else (deadline, heartbeat,
        round size, how many instances a push waits for) is in the spec at :attr:`spec_path`.
        """
        from weightbridge.runtime.options import BridgeOptions

        hook = FaultHook(self.host, self.port, self.prefix, self.timeout_s, *self.fault) if self.fault else None
        kw: dict[str, Any] = {"options": BridgeOptions(prefix=self.prefix, on_round=hook)}
        if self.side == "trainer":
            kw["store"] = self.store()
        else:
            kw["host"], kw["port"] = self.host, self.port
        return kw

    def init_process_group(self, backend: str = "gloo") -> None:
        """Start this side's own default process group (the framework's world: trainer ranks, or
        the ranks of one instance), over the run's store under a prefix of its own. A restarted
        process (``incarnation`` > 0) gets a new world: the suite restarts a whole side together."""
        import torch.distributed as dist

        if self.side == "trainer":
            name, rank, size = f"trainer-world-{self.incarnation}", self.rank, self.world_size
        else:
            lay = self.resolved().rollout
            ranks = [r.rank for r in lay.instance_ranks(self.instance or 0)]
            name, rank, size = f"instance-{self.instance}-world-{self.incarnation}", ranks.index(self.rank), len(ranks)
        store = dist.PrefixStore(f"{TEST_KEYS}/{name}/", self.store())
        dist.init_process_group(backend, store=store, rank=rank, world_size=size)


class FaultHook:
    """``on_round`` hook: SIGKILL this process after round ``round`` of version ``version``.

    Picklable; tells the push in flight from the suite's own marks on the store (``wbtest/pushing/V``,
    set by the trainer ranks), so it works in any process of the rank, and records the kill time under
    ``wbtest/killed_at`` first. Reaches an engine's worker
    processes by name (``hook_name``, with ``hook_params()``: registered in
    ``weightbridge.integrations._engine.hooks``), never pickled.
    """

    hook_name = "suite.kill-after-round"

    def __init__(self, host: str, port: int, prefix: str, timeout_s: float, version: int, round: int) -> None:
        self.args = (host, port, prefix, timeout_s, version, round)
        self._store = None

    def __reduce__(self):
        return (FaultHook, self.args)

    def hook_params(self) -> dict[str, Any]:
        """The constructor's keyword arguments (JSON scalars)."""
        return dict(zip(("host", "port", "prefix", "timeout_s", "version", "round"), self.args))

    def __call__(self, index: int) -> None:
        host, port, prefix, timeout_s, version, round_ = self.args
        if index < round_:
            return
        if self._store is None:
            from weightbridge.transport.store import open_store

            self._store = open_store(host, port, is_master=False, timeout_s=timeout_s)
        # the trainer ranks mark each push they begin (weightbridge.testing.ranks): push `version` is the one
        # in flight while its mark is set and the next one's is not (the bridge's own keys are not read here)
        now, after = (f"{TEST_KEYS}/pushing/{v}" for v in (version, version + 1))
        if self._store.check([now]) and not self._store.check([after]):
            self._store.set(f"{TEST_KEYS}/killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


def factory_ref(obj: Callable | str, fixture: str) -> str:
    """``module:qualname`` of a factory given as a callable or a string; raises ``ValueError`` if the
    rank processes could not import it."""
    if isinstance(obj, str):
        ref = obj
    else:
        module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
        if not module or not qual or "<" in qual:
            raise ValueError(f"{fixture} returned {obj!r}: return a module-level function or class (or 'module:name')")
        if module in ("__main__", "conftest") or module.endswith(".conftest"):
            raise ValueError(
                f"{fixture} returned {qual} from {module}: rank processes cannot import it from there; "
                "move it to a module of its own (e.g. my_integration_conformance.py) and return it from the fixture"
            )
        ref = f"{module}:{qual}"
    load_factory(ref, fixture)
    return ref


def load_factory(ref: str, fixture: str = "factory") -> Callable:
    """Import ``module:qualname``."""
    import pkgutil

    if ":" not in ref:
        raise ValueError(f"{fixture}: {ref!r} is not 'module:name'")
    try:
        obj = pkgutil.resolve_name(ref)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{fixture}: cannot import {ref} ({exc})") from exc
    if not callable(obj):
        raise ValueError(f"{fixture}: {ref} is not callable")
    return obj
