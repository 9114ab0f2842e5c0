"""Process bodies of the soak and hostile-client harness (:mod:`weightbridge.testing._internal.soak`).

Each function runs in its own process, started by :func:`weightbridge.localrun.launch`
(one launch per trial: the harness parent hosts nothing but the control store, or none when an
external ``weightbridge store`` process does):

* :func:`trainer` - one trainer rank: ``TrainerBridge.push`` of the trial's versions, each after
  setting its tensors to that version's canonical weights; a *replacement* first waits for the
  victim's kill, then joins and pushes the healing version.
* :func:`rollout` - one rollout rank: the engine's ``poll()`` / ``apply()`` loop, checking the live
  tensors bitwise after every apply and every error (:func:`weightbridge.tensors.layout_mismatches`).
* :func:`stranger` - hostile mode: a process without the job secret writing garbage under every
  runtime key, and forging acks during a push.
* :func:`impostor` - hostile mode: a process posing as a trainer rank with the public
  ``TrainerBridge`` and no (or a wrong) secret, pushing version :data:`IMPOSTOR_VERSION`.

The victim kills itself (SIGKILL) at its phase: a watcher thread polling the store (handshake:
its hello is published; apply: a receiver staged the version; idle: every process finished the
first push), the data plane's ``on_round`` hook (mid-transfer), or the rollout loop just before
``apply()``. It records ``<ctl>/killed_at`` first. Each job has its own bridge key prefix
(``cfg["prefix"]``) and harness prefix (``cfg["ctl"]``), so jobs may share one store. Every process returns a list of event dicts
(times are ``time.time()``) and never raises: exceptions are events, typed when they subclass
:class:`weightbridge.errors.BridgeError`. Uncaught exceptions of any thread are events too.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import torch

CTL = "soakctl"  # the harness's own store keys (never read by the bridge): cfg["ctl"] = CTL + the job's number
IMPOSTOR_VERSION = 999
SECRET_ENV = "WEIGHTBRIDGE_SECRET"


# -- shared helpers ------------------------------------------------------------------------------
def canonical(resolved, version: int) -> dict[str, torch.Tensor]:
    """Deterministic canonical weights of ``version`` (distinct per version)."""
    from weightbridge.tensors import torch_dtype

    g = torch.Generator().manual_seed(1000 + version)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in resolved.canonical.tensors}


def client(cfg: dict, timeout_s: float | None = None):
    from weightbridge.transport.store import open_store

    return open_store(cfg["host"], cfg["port"], is_master=False, timeout_s=timeout_s or cfg["timeout_s"])


def error_event(exc: BaseException, **kw: Any) -> dict:
    from weightbridge.errors import BridgeError

    return {"kind": "error", "type": type(exc).__name__, "typed": isinstance(exc, BridgeError),
            "msg": str(exc)[:300], "t": time.time(), **kw}


def wait_key(store, key: str, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if store.check([key]):
            return True
        time.sleep(0.01)
    return False


def _setup(cfg: dict, events: list[dict]) -> None:
    """Per process: the job secret (the parent's), one torch thread, thread deaths recorded."""
    if cfg.get("secret"):
        os.environ[SECRET_ENV] = cfg["secret"]
    torch.set_num_threads(1)

    def hook(args: threading.ExceptHookArgs) -> None:
        events.append(error_event(args.exc_value, thread=getattr(args.thread, "name", "?"), died=True))

    threading.excepthook = hook


def kill_self(store, cfg: dict, why: str) -> None:
    store.set(f"{cfg['ctl']}/killed_at", repr(time.time()))
    store.set(f"{cfg['ctl']}/killed_why", why)
    os.kill(os.getpid(), signal.SIGKILL)


def watch_and_kill(cfg: dict, cond, why: str) -> None:
    """Start a daemon thread that SIGKILLs this process as soon as ``cond(store)`` holds."""
    store = client(cfg)

    def loop() -> None:
        while True:
            try:
                if cond(store):
                    kill_self(store, cfg, why)
            except Exception:  # noqa: BLE001 - a store hiccup: try again
                pass
            time.sleep(0.002)

    threading.Thread(target=loop, name="soak-killer", daemon=True).start()


def _hello_cond(cfg: dict, who: str):
    from weightbridge.sync.messages import Keys

    keys = Keys(cfg["prefix"])
    return lambda s: s.check([f"{cfg['ctl']}/pushing/1"]) and any(s.check([keys.hello(e, who)]) for e in (1, 2))


def _idle_cond(cfg: dict):
    marks = [f"{cfg['ctl']}/idle/{w}" for w in cfg["everyone"]]
    return lambda s: s.check(marks)


def _staged_cond(cfg: dict, version: int):
    marks = [f"{cfg['ctl']}/staged/{r}/{version}" for r in range(cfg["num_rollout"])]
    return lambda s: any(s.check([m]) for m in marks)


def arm_watcher(cfg: dict, kill: dict | None, who: str) -> None:
    if not kill:
        return
    if kill["phase"] == "handshake":
        watch_and_kill(cfg, _hello_cond(cfg, who), "handshake")
    elif kill["phase"] == "idle":
        watch_and_kill(cfg, _idle_cond(cfg), "idle")
    elif kill["phase"] == "apply" and who.startswith("trainer"):
        watch_and_kill(cfg, _staged_cond(cfg, kill["version"]), "apply")


def _await_kill(store, cfg: dict, events: list[dict]) -> bool:
    """A replacement: wait until the victim is dead."""
    tdone = [f"{cfg['ctl']}/tdone/{t}" for t in range(cfg["num_trainer"])]
    end = time.monotonic() + cfg["wait_kill_s"]
    while not store.check([f"{cfg['ctl']}/killed_at"]):
        if time.monotonic() > end or store.check(tdone):
            events.append({"kind": "nokill", "t": time.time()})
            return False
        time.sleep(0.01)
    time.sleep(cfg.get("restart_delay_s", 0.2))
    return True


# -- trainer rank ------------------------------------------------------------------------------------
def trainer(cfg: dict, rank: int, opts: dict) -> list[dict]:
    """Push ``opts['versions']`` in order (continuing after errors).

    ``opts``: ``kill`` (this process is the victim: ``{phase, version, round}``), ``replacement``
    (wait for the kill first), ``rejoin_before`` (wait for the replacement to join before pushing
    that version), ``steps`` (hostile mode: ``{version: step}``: wait for the stranger's
    ``h/done/{step}`` first; every push is followed by ``h/tdone/{version}/{rank}``).
    """
    events: list[dict] = []
    _setup(cfg, events)
    try:
        _trainer(cfg, rank, opts, events)
    except BaseException as exc:  # noqa: BLE001 - reported, never raised
        events.append(error_event(exc, where="trainer-setup"))
    return events


def _trainer(cfg: dict, rank: int, opts: dict, events: list[dict]) -> None:
    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.tensors import materialize

    who = f"trainer/{rank}"
    store = client(cfg)
    if opts.get("replacement") and not _await_kill(store, cfg, events):
        return
    r = load_spec(cfg["spec"])
    layout = r.trainer.ranks[rank]
    tensors = materialize(layout, canonical(r, opts["versions"][0]))
    kill = opts.get("kill")
    current = {"v": None}

    def on_round(index: int) -> None:
        if kill and kill["phase"] == "transfer" and current["v"] == kill["version"] and index >= kill["round"]:
            kill_self(store, cfg, f"transfer round {index}")

    t0 = time.time()
    # the bridges' store: the harness's (store=), or one trainer 0 hosts (cfg["bridge_port"]: sync.store trainer0)
    where = ({"host": cfg["host"], "port": cfg["bridge_port"]} if cfg.get("bridge_port") else {"store": client(cfg)})
    try:
        bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, **where,
                                         options=BridgeOptions(prefix=cfg["prefix"], on_round=on_round))
    except BaseException as exc:  # noqa: BLE001
        events.append(error_event(exc, where="from_spec", t0=t0))
        return
    events.append({"kind": "joined", "t": time.time()})
    if opts.get("replacement"):
        store.set(f"{cfg['ctl']}/rejoined", repr(time.time()))
    arm_watcher(cfg, kill, who)
    steps = opts.get("steps", {})
    for v in opts["versions"]:
        if v == opts.get("rejoin_before") and not wait_key(store, f"{cfg['ctl']}/rejoined", cfg["wait_kill_s"]):
            events.append({"kind": "norejoin", "v": v, "t": time.time()})
        if v in steps:
            wait_key(store, f"{cfg['ctl']}/h/done/{steps[v]}", cfg["wait_kill_s"])
        fresh = materialize(layout, canonical(r, v))
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(fresh[name])
        current["v"] = v
        store.set(f"{cfg['ctl']}/pushing/{v}", repr(time.time()))
        t1 = time.time()
        try:
            s = bridge.push(v)
            events.append({"kind": "pushed", "v": v, "t0": t1, "t": time.time(), "epoch": s.epoch})
        except BaseException as exc:  # noqa: BLE001
            events.append(error_event(exc, v=v, t0=t1))
        if v == 1:
            store.set(f"{cfg['ctl']}/idle/{who}", "1")
        store.set(f"{cfg['ctl']}/h/tdone/{v}/{rank}", "1")
    store.set(f"{cfg['ctl']}/tdone/{rank}", repr(time.time()))
    try:
        bridge.close()
    except BaseException as exc:  # noqa: BLE001
        events.append(error_event(exc, where="close"))


# -- rollout rank ------------------------------------------------------------------------------------
def rollout(cfg: dict, rank: int, opts: dict) -> list[dict]:
    """The engine loop: ``poll()``, ``apply()`` when ready, until ``opts['last']`` is applied or every
    trainer finished; ``opts``: ``staging``, ``kill``, ``replacement``, ``apply_delay`` ({version: s})."""
    events: list[dict] = []
    _setup(cfg, events)
    try:
        _rollout(cfg, rank, opts, events)
    except BaseException as exc:  # noqa: BLE001
        events.append(error_event(exc, where="rollout-setup"))
    return events


def _rollout(cfg: dict, rank: int, opts: dict, events: list[dict]) -> None:
    from weightbridge.bridge import BridgeOptions, RolloutBridge, load_spec
    from weightbridge.tensors import layout_mismatches, materialize

    who = f"rollout/{rank}"
    store = client(cfg)
    if opts.get("replacement") and not _await_kill(store, cfg, events):
        return
    r = load_spec(cfg["spec"])
    layout = r.rollout.ranks[rank]
    tensors = materialize(layout, canonical(r, -1), fill=7.0)
    kill = opts.get("kill")
    push_marks = {}

    def on_round(index: int) -> None:
        if kill and kill["phase"] == "transfer" and index >= kill["round"]:
            v = kill["version"]
            if store.check([f"{cfg['ctl']}/pushing/{v}"]) and not store.check([f"{cfg['ctl']}/pushing/{v + 1}"]):
                kill_self(store, cfg, f"transfer round {index}")

    def check(v: int | None) -> list[str] | None:
        if v is None:
            return None
        if v not in push_marks:
            push_marks[v] = store.check([f"{cfg['ctl']}/pushing/{v}"])
        if not push_marks[v]:
            return [f"version {v} was never pushed by the job's trainers"]
        return layout_mismatches(layout, tensors, canonical(r, v), limit=2)

    t0 = time.time()
    try:
        bridge = RolloutBridge.from_spec(r, rank=rank, tensors=tensors, host=cfg["host"],
                                         port=cfg.get("bridge_port") or cfg["port"],
                                         staging=opts["staging"],
                                         options=BridgeOptions(prefix=cfg["prefix"], on_round=on_round))
    except BaseException as exc:  # noqa: BLE001
        events.append(error_event(exc, where="from_spec", t0=t0))
        return
    events.append({"kind": "joined", "t": time.time()})
    if opts.get("replacement"):
        store.set(f"{cfg['ctl']}/rejoined", repr(time.time()))
    arm_watcher(cfg, kill, who)
    tdone = [f"{cfg['ctl']}/tdone/{t}" for t in cfg.get("finishers", range(cfg["num_trainer"]))]
    end = time.monotonic() + cfg["run_s"]
    done_at = None
    while time.monotonic() < end:
        if done_at is None and store.check(tdone):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > 1.0 and not bridge.ready():
            break
        try:
            if bridge.poll():
                sv = bridge.staged_version
                store.set(f"{cfg['ctl']}/staged/{rank}/{sv}", repr(time.time()))
                if kill and kill["phase"] == "apply" and sv == kill["version"]:
                    kill_self(store, cfg, "apply")
                if sv in opts.get("apply_delay", {}):  # hostile forge step: forged acks meanwhile
                    time.sleep(opts["apply_delay"][sv])
                    store.set(f"{cfg['ctl']}/applying/{rank}/{sv}", repr(time.time()))
                    wait_key(store, f"{cfg['ctl']}/h/quiet/{sv}", cfg["wait_kill_s"])
                before = bridge.version
                began = time.time()  # the real ack is written inside apply(): a push may return before it ends
                v = bridge.apply()
                events.append({"kind": "applied", "v": v, "before": before, "bad": check(v), "t": time.time(),
                               "began": began})
                if v == 1 or (before is None and v is not None and v > 1 and kill and kill["phase"] == "idle"):
                    store.set(f"{cfg['ctl']}/idle/{who}", "1")
                if v == opts["last"]:
                    break
        except BaseException as exc:  # noqa: BLE001
            torn, v = bridge.torn, bridge.version
            events.append(error_event(exc, torn=torn, version=v, bad=check(v)))
            if store.check([f"{cfg['ctl']}/pushing/1"]) and not store.check([f"{cfg['ctl']}/pushing/2"]):
                store.set(f"{cfg['ctl']}/idle/{who}", "1")  # the first push failed here: idle all the same
        time.sleep(0.005)
    v = bridge.version
    events.append({"kind": "final", "version": v, "torn": bridge.torn, "bad": check(v), "t": time.time()})
    try:
        bridge.close()
    except BaseException as exc:  # noqa: BLE001
        events.append(error_event(exc, where="close"))


# -- hostile mode: the stranger and the impostor --------------------------------------------------------
def _no_secret(cfg: dict, wrong: bool) -> None:
    os.environ.pop(SECRET_ENV, None)
    if wrong:
        os.environ[SECRET_ENV] = "not-the-job-secret-" + "x" * 24


def stranger(cfg: dict, steps: list[dict]) -> list[dict]:
    """Without the secret: for each step ``{"step", "after", "action", ...}`` wait until every trainer
    finished push ``after``, do the action, then set ``h/done/{step}``.

    Actions (``versions``: the step's two pushes): ``garbage`` (``method`` and ``args`` of :class:`~weightbridge.sync.messages.Keys`, epochs
    given as ``"cur"`` / ``"next"``, and a ``kind`` of :data:`weightbridge.testing._internal.garbage.GARBAGE_KINDS`), ``forge`` (while the first of
    that push runs, write acks claiming every rollout rank staged and applied it), ``none``.
    """
    events: list[dict] = []
    _setup({}, events)
    _no_secret(cfg, wrong=False)
    store = client(cfg)
    from weightbridge.testing._internal.garbage import garbage_for, snapshot

    snap = {}
    if steps:
        for t in range(cfg["num_trainer"]):
            wait_key(store, f"{cfg['ctl']}/h/tdone/{steps[0]['after']}/{t}", cfg["wait_kill_s"])
        snap = snapshot(cfg, store, steps)  # genuine values, for the replay steps
    for st in steps:
        for t in range(cfg["num_trainer"]):
            wait_key(store, f"{cfg['ctl']}/h/tdone/{st['after']}/{t}", cfg["wait_kill_s"])
        ev = {"kind": "step", "step": st["step"], "action": st["action"], "t": time.time()}
        try:
            if st["action"] == "garbage":
                key, value = garbage_for(cfg, store, st, snap)
                ev.update(key=key, bytes=None if value is None else len(value))
                if value is None:
                    ev["deleted"] = bool(store.delete_key(key))
                else:
                    store.set(key, value)
            elif st["action"] == "forge":
                store.set(f"{cfg['ctl']}/h/done/{st['step']}", "1")
                try:
                    ev["forged"] = _forge_acks(cfg, store, st["versions"][0])
                finally:
                    store.set(f"{cfg['ctl']}/h/quiet/{st['versions'][0]}", "1")
        except BaseException as exc:  # noqa: BLE001 - the stranger's own trouble is only noted
            ev.update(error_event(exc, kind="step"))
            store = client(cfg)  # the store may have closed this connection (a value past its bound): a new one
        events.append(ev)
        store.set(f"{cfg['ctl']}/h/done/{st['step']}", "1")
    return events


def _forge_acks(cfg: dict, store, version: int) -> int:
    """Write forged staged/applied acks for ``version`` (the seq read off the announcement if it parses)
    from ``pushing/{version}`` until a rollout is about to apply it (``applying/{rank}/{version}``;
    it waits for the caller's ``h/quiet/{version}`` before it does).

    A push that believed forged acks returns in that window: before any rollout began applying.
    Forging on would overwrite the genuine acks under the same keys and fail the push: a stranger
    with store access can always deny service; what this step tests is that it cannot make a push
    return early. (Until 2026-12-02 it forged for a fixed time, which raced with the genuine acks.)"""
    import re

    from weightbridge.sync.messages import Ack, Keys, encode

    keys = Keys(cfg["prefix"])
    wait_key(store, f"{cfg['ctl']}/pushing/{version}", cfg["wait_kill_s"])
    applying = [f"{cfg['ctl']}/applying/{r}/{version}" for r in range(cfg["num_rollout"])]
    n, end = 0, time.monotonic() + cfg["wait_kill_s"]
    while time.monotonic() < end and not any(store.check([k]) for k in applying):
        seq, epoch = 1, 1
        try:
            raw = store.get(keys.announce).decode(errors="replace")
            seq = int(re.search(r'"seq":\s*(\d+)', raw).group(1))
            epoch = int(re.search(r'"epoch":\s*(\d+)', raw).group(1))
        except Exception:  # noqa: BLE001 - unreadable: guess
            pass
        for r in range(cfg["num_rollout"]):
            for stage in ("staged", "applied"):
                store.set(keys.ack(stage, r), encode(Ack(rank=r, version=version, seq=seq, epoch=epoch, stage=stage)))
                n += 1
        time.sleep(0.01)
    return n


def impostor(cfg: dict, rank: int, after: int, step: int, wrong_secret: bool) -> list[dict]:
    """Pose as trainer ``rank`` with the public API and no (``wrong_secret``: a wrong) secret, once every
    real trainer finished push ``after``; push :data:`IMPOSTOR_VERSION` (+ step) and report what it got."""
    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.tensors import materialize

    events: list[dict] = []
    _setup({}, events)
    _no_secret(cfg, wrong=wrong_secret)
    store = client(cfg)
    for t in range(cfg["num_trainer"]):
        wait_key(store, f"{cfg['ctl']}/h/tdone/{after}/{t}", cfg["wait_kill_s"])
    version = IMPOSTOR_VERSION + step
    try:
        r = load_spec(cfg["spec"])
        tensors = materialize(r.trainer.ranks[rank], canonical(r, version))
        bridge = TrainerBridge.from_spec(r, rank=rank, tensors=tensors, store=client(cfg),
                                         options=BridgeOptions(prefix=cfg["prefix"]))
        events.append({"kind": "joined", "t": time.time()})
        s = bridge.push(version)
        events.append({"kind": "pushed", "v": version, "t": time.time(), "epoch": s.epoch})
    except BaseException as exc:  # noqa: BLE001
        events.append(error_event(exc, v=version))
    store.set(f"{cfg['ctl']}/h/imp/{step}/{rank}", "1")
    if all(store.check([f"{cfg['ctl']}/h/imp/{step}/{t}"]) for t in range(cfg["num_trainer"])):
        store.set(f"{cfg['ctl']}/h/done/{step}", "1")
    return events  # no close(): a stranger leaves its bridge behind
