"""The conformance scenarios, parent side: write the run's spec, host the store, launch, collect.

One scenario = one set of processes under ``localrun.launch`` (hard deadline: nothing hangs):

=============  ==============================================================================
layout         every rank builds its side, checks its tensors and probes its loader
sync           sync mode, versions 1..3
async          async mode, max_staleness 1, versions 1..4, rollout applies slowed down
sender-dies    sync; the last trainer rank is SIGKILLed after round 0 of version 2; the whole
               trainer side restarts and pushes version 3
receiver-dies  sync; the last rollout unit is SIGKILLed after round 0 of version 2
no-receiver    trainers only; push(1) must fail in time
late-joiner    the last instance starts after version 1 was pushed; versions 1..3
delta          sync, ``sync.delta: on``; versions 1..6, each redrawing 2% of the elements
handshake      the last rollout unit gets a spec with twice the round_bytes (another spec hash)
async-heal     async, max_staleness 1, versions 1..5; the last rollout unit holds version 2
               unapplied until push(3) ended (it must fail: the staleness wait's deadline)
impostor       sync; trainer processes without the job secret (the integration's own trainer
               code) push version 9 to the running rollout units; then the real trainers push 1
=============  ==============================================================================
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightbridge.testing.contract import TEST_KEYS, RankContext
from weightbridge.testing.ranks import key

HOST = "127.0.0.1"
IMPOSTOR_VERSION = 9  # what the trainers without the job secret push (the real ones push 1)
ROUND_CANDIDATES = (1 << 20, 256 << 10, 64 << 10, 16 << 10, 4 << 10, 1 << 10)


@dataclass
class Integration:
    """What the suite knows of one integration (from its fixtures and class attributes)."""

    spec_path: Path
    trainer: str  # factory ref "module:qualname"
    rollout: str
    scope: str  # "rank" | "instance"
    workdir: Path
    timeout_s: float = 5.0
    startup_s: float = 30.0
    heartbeat_s: float = 0.25
    preload: tuple[str, ...] = ()
    _resolved: Any = None

    @property
    def resolved(self):
        if self._resolved is None:
            from weightbridge.bridge import load_spec

            self._resolved = load_spec(self.spec_path)
        return self._resolved

    def units(self) -> list[tuple[int, tuple[int, ...]]]:
        """(instance, spec ranks) of each rollout process."""
        lay = self.resolved.rollout
        if self.scope == "instance":
            return [(i, tuple(r.rank for r in lay.instance_ranks(i))) for i in range(lay.num_instances)]
        return [(r.instance, (r.rank,)) for r in lay.ranks]


@dataclass
class ProcResult:
    label: str  # "trainer 1", "rollout 0-1", "trainer 1 (restarted)"
    role: str
    ranks: tuple[int, ...]
    ok: bool
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""  # the exception and traceback when the process body raised
    exitcode: int | None = None
    timed_out: bool = False

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    def describe(self) -> str:
        if self.ok:
            return f"{self.label}: ok"
        if self.timed_out:
            return f"{self.label}: still running at the scenario deadline (hung), killed"
        if self.error:
            return f"{self.label}: raised\n{self.error}"
        return f"{self.label}: died with exit code {self.exitcode}"


@dataclass
class ScenarioRun:
    name: str
    spec_path: Path
    procs: list[ProcResult]
    killed_at: float | None
    wall_s: float
    timeout_s: float

    def role(self, role: str) -> list[ProcResult]:
        return [p for p in self.procs if p.role == role]

    def broken(self, *, allow: tuple[str, ...] = ()) -> list[str]:
        """Descriptions of processes that did not finish normally (except labels in ``allow``)."""
        return [p.describe() for p in self.procs if not p.ok and p.label not in allow]


def write_run_spec(src: Path, dst: Path, **sync: Any) -> Path:
    """``src`` with its ``sync`` section updated (transport gloo) and relative model paths made absolute."""
    import yaml

    data = yaml.safe_load(src.read_text())
    model = data.get("model", {})
    for k in ("config", "safetensors"):
        if isinstance(model.get(k), str) and not Path(model[k]).is_absolute():
            model[k] = str((src.parent / model[k]).resolve())
    data["sync"] = {**(data.get("sync") or {}), "transport": "gloo", **sync}
    dst.write_text(yaml.safe_dump(data, sort_keys=False))
    return dst


def multi_round_bytes(resolved) -> int:
    """The largest candidate ``round_bytes`` giving a plan of at least 3 rounds (faults land mid-update)."""
    from weightbridge.plan import build_plan

    for rb in ROUND_CANDIDATES:
        if build_plan(resolved.trainer, resolved.rollout, round_bytes=rb).num_rounds >= 3:
            return rb
    return ROUND_CANDIDATES[-1]


class Runner:
    """Runs (and caches) the scenarios of one integration."""

    def __init__(self, integ: Integration) -> None:
        self.integ = integ
        self.cache: dict[str, ScenarioRun] = {}

    def run(self, name: str) -> ScenarioRun:
        if name not in self.cache:
            self.cache[name] = getattr(self, "_" + name.replace("-", "_"))()
        return self.cache[name]

    # -- building blocks ---------------------------------------------------------------------
    def _spec(self, name: str, **sync: Any) -> Path:
        d = self.integ.workdir / name
        d.mkdir(parents=True, exist_ok=True)
        sync.setdefault("timeout_s", self.integ.timeout_s)
        sync.setdefault("heartbeat_s", self.integ.heartbeat_s)
        return write_run_spec(self.integ.spec_path, d / "spec.yaml", **sync)

    def _ctx(self, spec: Path, port: int, side: str, ranks: tuple[int, ...], instance: int | None, **kw) -> RankContext:
        r = self.integ.resolved
        world = r.trainer.world_size if side == "trainer" else r.rollout.world_size
        return RankContext(side=side, rank=ranks[0], ranks=ranks, world_size=world, instance=instance,
                           spec_path=str(spec), host=HOST, port=port, prefix="wb", timeout_s=self.integ.timeout_s,
                           heartbeat_s=self.integ.heartbeat_s, workdir=str(spec.parent), **kw)

    def _budget(self, extra_s: float = 0.0) -> float:
        return self.integ.startup_s + 6 * self.integ.timeout_s + 10 + extra_s

    def _trainers(self, spec, port, script, *, fault_last=None, incarnation=0, label="", **kw) -> list[dict]:
        n = self.integ.resolved.trainer.world_size
        jobs = []
        for t in range(n):
            fault = fault_last if t == n - 1 else None
            ctx = self._ctx(spec, port, "trainer", (t,), None, fault=fault, incarnation=incarnation, **kw)
            jobs.append({"role": "trainer", "ctx": ctx, "factory": self.integ.trainer, "script": script,
                         "label": f"trainer {t}{label}"})
        return jobs

    def _rollouts(self, spec, port, script, *, late=None, odd_spec=None, fault_last=None) -> list[dict]:
        units = self.integ.units()
        jobs = []
        for i, (inst, ranks) in enumerate(units):
            last = i == len(units) - 1
            sc = dict(script)
            if late is not None and inst == late[0]:
                sc["start_key"] = late[1]
            ctx = self._ctx(odd_spec if (last and odd_spec) else spec, port, "rollout", ranks, inst,
                            fault=fault_last if last else None)
            label = f"rollout {ranks[0]}" if len(ranks) == 1 else f"rollout {ranks[0]}-{ranks[-1]}"
            jobs.append({"role": "rollout", "ctx": ctx, "factory": self.integ.rollout, "script": sc, "label": label})
        return jobs

    def _launch(self, name: str, spec: Path, store, jobs: list[dict], extra_s: float = 0.0) -> ScenarioRun:
        from weightbridge.testing.ranks import run_job
        from weightbridge.localrun import launch

        preload = ["weightbridge.testing.ranks", *self.integ.preload,
                   *{j["factory"].partition(":")[0] for j in jobs}]
        t0 = time.perf_counter()
        results = launch(run_job, [(j,) for j in jobs], timeout_s=self._budget(extra_s), preload=preload)
        killed = float(store.get(key("killed_at"))) if store.check([key("killed_at")]) else None
        procs = []
        for j, res in zip(jobs, results):
            err = ""
            if not res.ok and res.error is not None:
                err = f"{type(res.error).__name__}: {res.error}\n{res.traceback}"
            procs.append(ProcResult(j["label"], j["role"], j["ctx"].ranks, res.ok, res.value if res.ok else [], err,
                                    res.exitcode, res.timed_out))
        return ScenarioRun(name, spec, procs, killed, time.perf_counter() - t0, self.integ.timeout_s)

    def _go(self, name: str, spec: Path, make_jobs, extra_s: float = 0.0) -> ScenarioRun:
        from weightbridge.transport.store import open_store

        store = open_store(HOST, 0, is_master=True, timeout_s=self._budget(extra_s))
        try:
            return self._launch(name, spec, store, make_jobs(store.port), extra_s)
        finally:
            del store

    def _common(self, versions: list[int], extra_s: float = 0.0, **extra) -> tuple[dict, dict]:
        n_roll = self.integ.resolved.rollout.world_size
        run_s = self._budget(extra_s) - 2
        trainer = {"versions": versions, "await_ready": list(range(n_roll)), "run_s": run_s, **extra}
        rollout = {"last": versions[-1], "num_trainers": self.integ.resolved.trainer.world_size, "run_s": run_s}
        return trainer, rollout

    # -- scenarios ---------------------------------------------------------------------------
    def _layout(self) -> ScenarioRun:
        spec = self._spec("layout", mode="sync")
        script = {"probe": True, "run_s": self._budget() - 2, "num_trainers": 0, "last": 0}
        return self._go("layout", spec, lambda port: self._trainers(spec, port, script)
                        + self._rollouts(spec, port, script))

    def _sync(self) -> ScenarioRun:
        spec = self._spec("sync", mode="sync")
        tr, ro = self._common([1, 2, 3])
        return self._go("sync", spec, lambda port: self._trainers(spec, port, tr) + self._rollouts(spec, port, ro))

    def _async(self) -> ScenarioRun:
        spec = self._spec("async", mode="async", max_staleness=1)
        tr, ro = self._common([1, 2, 3, 4])
        ro["apply_delay_s"] = 0.15
        return self._go("async", spec, lambda port: self._trainers(spec, port, tr) + self._rollouts(spec, port, ro))

    def _async_heal(self) -> ScenarioRun:
        spec = self._spec("async-heal", mode="async", max_staleness=1)
        tr, ro = self._common([1, 2, 3, 4, 5], stop_on_error=False)
        # the last unit's 2nd apply (version 2) waits until trainer 0's push(3) ended
        hold = {"nth": 2, "until": [key("failed", 0, 3), key("pushed", 0, 3)], "max_s": 3 * self.integ.timeout_s + 5}

        def jobs(port):
            units = self._rollouts(spec, port, ro)
            units[-1]["script"] = {**units[-1]["script"], "hold_apply": hold}
            return self._trainers(spec, port, tr) + units

        return self._go("async-heal", spec, jobs)

    def _impostor(self) -> ScenarioRun:
        from weightbridge.sync.auth import new_secret

        n = self.integ.resolved.trainer.world_size
        extra = self.integ.startup_s  # the real trainers start once the impostors are done
        spec = self._spec("impostor", mode="sync")
        impostor, ro = self._common([IMPOSTOR_VERSION], extra, wrong_secret=new_secret(), done_key="impostor-done")
        real = {"versions": [1], "after_keys": [key("impostor-done", t) for t in range(n)], "run_s": impostor["run_s"]}
        ro["last"] = 1
        return self._go("impostor", spec, lambda port: (
            self._trainers(spec, port, impostor, incarnation=1, label=" (no secret)")
            + self._rollouts(spec, port, ro) + self._trainers(spec, port, real)), extra)

    def _sender_dies(self) -> ScenarioRun:
        r = self.integ.resolved
        spec = self._spec("sender-dies", mode="sync", round_bytes=multi_round_bytes(r))
        tr, ro = self._common([1, 2])
        ro.update(last=3, record_state=True)
        states = [key("state/rollout", x) for x in range(r.rollout.world_size)]
        again = {"versions": [3], "after_keys": [key("killed_at"), *states], "run_s": tr["run_s"]}

        def jobs(port):
            return (self._trainers(spec, port, tr, fault_last=(2, 0))
                    + self._rollouts(spec, port, ro)
                    + self._trainers(spec, port, again, incarnation=1, label=" (restarted)"))

        return self._go("sender-dies", spec, jobs)

    def _receiver_dies(self) -> ScenarioRun:
        spec = self._spec("receiver-dies", mode="sync", round_bytes=multi_round_bytes(self.integ.resolved))
        tr, ro = self._common([1, 2])
        ro["stop_on_error"] = True
        return self._go("receiver-dies", spec, lambda port: self._trainers(spec, port, tr)
                        + self._rollouts(spec, port, ro, fault_last=(2, 0)))

    def _no_receiver(self) -> ScenarioRun:
        spec = self._spec("no-receiver", mode="sync")
        tr, _ = self._common([1], await_ready=[])
        return self._go("no-receiver", spec, lambda port: self._trainers(spec, port, tr))

    def _late_joiner(self) -> ScenarioRun:
        r = self.integ.resolved
        late = r.rollout.num_instances - 1
        spec = self._spec("late-joiner", mode="sync", min_instances=late or 1)
        late_ranks = [x.rank for x in r.rollout.instance_ranks(late)]
        early = [x.rank for x in r.rollout.ranks if x.instance != late]
        tr, ro = self._common([1, 2, 3], await_ready=early,
                              wait_keys={3: [key("ready/rollout", x) for x in late_ranks]})
        return self._go("late-joiner", spec, lambda port: self._trainers(spec, port, tr)
                        + self._rollouts(spec, port, ro, late=(late, key("pushed", 0, 1))))

    def _delta(self) -> ScenarioRun:
        spec = self._spec("delta", mode="sync", delta="on")
        tr, ro = self._common(list(range(1, 7)), sparse=True)
        ro["sparse"] = True
        return self._go("delta", spec, lambda port: self._trainers(spec, port, tr) + self._rollouts(spec, port, ro))

    def _handshake(self) -> ScenarioRun:
        spec = self._spec("handshake", mode="sync")
        # Another spec hash at no planning cost: double round_bytes (at most as many rounds). A tiny
        # round_bytes made the odd rank plan thousands of rounds, late past the hello deadline under load.
        odd = write_run_spec(spec, spec.parent / "odd-spec.yaml", round_bytes=2 * self.integ.resolved.sync.round_bytes)
        tr, ro = self._common([1])
        ro.update(stop_on_error=True, snapshot=True)
        return self._go("handshake", spec, lambda port: self._trainers(spec, port, tr)
                        + self._rollouts(spec, port, ro, odd_spec=odd))


__all__ = ["IMPOSTOR_VERSION", "TEST_KEYS", "Integration", "ProcResult", "Runner", "ScenarioRun", "write_run_spec"]
