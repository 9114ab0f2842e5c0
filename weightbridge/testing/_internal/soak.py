"""Soak harness (issue 13): kill -9 a random process at a random phase, restart it, check the job heals.

Who does what (all local processes):

* **the harness parent** (this module, called by ``bench/soak.py`` and ``tests/sync/test_soak_short.py``):
  writes the trial's spec, hosts the control store (or starts an external ``weightbridge store``
  process when that command exists, so that trainer 0 may die; one for many trials, each under
  its own key prefixes, replaced when it stops answering), launches the job with
  :func:`weightbridge.localrun.launch` (its deadline SIGKILLs everything: a **hang**), then
  reads every process's events and judges the trial (:func:`judge`);
* **the job** (:mod:`weightbridge.testing._internal.soak_roles`): trainer ranks 0 and 1 (FSDP2, dp 2) and rollout
  ranks 0 and 1 (two vLLM-style instances of one rank each), all staging or all in place; the
  **victim** kills itself at its phase; its **replacement** (started with the others) waits for the
  kill, joins, and the survivors wait for it before the healing push.

A cell is (mode, staging, victim, phase): victim ``trainer0`` / ``trainer1`` / ``rollout`` (a random
rollout rank), phase ``handshake`` (during push 1's handshake; heals at push 2), ``transfer`` (after a
random round of push 2; heals at 3), ``apply`` (push 2 staged, not applied; heals at 3), ``idle``
(after push 1 everywhere; heals at 2); then :data:`STEADY` more pushes. Victim ``store-host`` (phase
``transfer`` only): trainer 0 hosts the bridges' control store (``sync.store: trainer0``; the harness
keeps its own keys on its own store) and dies mid-push, taking the store with it: nothing heals
without a rebuild (``docs/control_store.md``), so the cell's bar is every survivor raising a typed
error within ``timeout_s`` + slack, and no wrong weights. Per trial: **hang**; **untyped** errors (not a
:class:`~weightbridge.errors.BridgeError`, including crashes and dead threads); **wrong** (a rollout
served tensors that are not bitwise the version it reports, or a version nobody pushed); **early**
(sync, a rollout victim: a survivor's push of the killed version returned); **latency** (a
survivor's raise after the kill, minus ``timeout_s``); **healed** (every trainer pushed the healing
version and the :data:`STEADY` after it, and every rollout applied the last one bitwise). Hostile mode is :mod:`weightbridge.testing._internal.hostile`.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weightbridge.localrun import launch
from weightbridge.testing._internal import soak_roles as R

HOST = "127.0.0.1"
MODES = ("sync", "async")
STAGINGS = (True, False)
VICTIMS = ("trainer0", "trainer1", "rollout", "store-host")
PHASES = ("handshake", "transfer", "apply", "idle")
ONLY_PHASES = {"store-host": ("transfer",)}  # victims killed in some phases only
NUM_TRAINER, NUM_ROLLOUT = 2, 2
STEADY = 2  # pushes after the healing push, all of which must succeed too

Cell = tuple[str, bool, str, str]  # (mode, staging, victim, phase)


def all_cells(modes=MODES, stagings=STAGINGS, victims=VICTIMS, phases=PHASES) -> list[Cell]:
    return [(m, s, v, p) for m in modes for s in stagings for v in victims for p in phases
            if p in ONLY_PHASES.get(v, PHASES)]


def cell_name(cell: Cell) -> str:
    mode, staging, victim, phase = cell
    return f"{mode}/{'staging' if staging else 'in-place'}/{victim}/{phase}"


# -- the trial's environment: spec, store, secret ------------------------------------------------------
def sync_fields() -> set[str]:
    from weightbridge.spec.models import SyncSpec

    return set(SyncSpec.model_fields)


def write_spec(workdir: Path, mode: str, timeout_s: float, *, external: bool, heartbeat_s: float = 0.2) -> Path:
    extra = f", store: {'external' if external else 'trainer0'}" if "store" in sync_fields() else ""
    text = (
        "version: 1\nmodel: {bundled: tiny-qwen2}\n"
        "trainer: {preset: fsdp2, mesh: {dp: 2}}\n"
        "rollout: {preset: vllm, instances: 2, mesh: {tp: 1}}\n"
        f"sync: {{mode: {mode}, max_staleness: 1, round_bytes: 8KiB, timeout_s: {timeout_s}, "
        f"heartbeat_s: {heartbeat_s}{extra}}}\n"
    )
    path = workdir / f"soak-{mode}{'' if external else '-trainer0'}.yaml"
    path.write_text(text)
    return path


def store_cli_available() -> bool:
    return (Path(__file__).resolve().parent.parent / "cli" / "store_cmd.py").exists()


class Store:
    """The trial's control store: hosted here (``parent``) or by a ``weightbridge store`` process (``cli``)."""

    def __init__(self, kind: str, workdir: Path, timeout_s: float) -> None:
        self.kind, self.proc, self.master = kind, None, None
        if kind == "cli":
            port_file = workdir / f"store-{time.monotonic_ns()}.port"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "weightbridge", "store", "--host", HOST, "--port", "0",
                 "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            end = time.monotonic() + 60
            while not port_file.exists():
                if self.proc.poll() is not None or time.monotonic() > end:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                    self.close()
                    raise RuntimeError(f"weightbridge store did not start: {err[-500:]}")
                time.sleep(0.05)
            self.port = int(port_file.read_text().strip().rsplit(":", 1)[1])
        else:
            from weightbridge.transport.store import open_store

            self.master = open_store(HOST, 0, is_master=True, timeout_s=max(60.0, 4 * timeout_s))
            self.port = self.master.port
        from weightbridge.transport.store import open_store

        self.client = open_store(HOST, self.port, is_master=False, timeout_s=10.0)

    def healthy(self) -> bool:
        try:
            self.client.set("soak-health", "1")
            return self.client.get("soak-health") == b"1" and (self.proc is None or self.proc.poll() is None)
        except Exception:  # noqa: BLE001
            return False

    def value(self, key: str) -> str | None:
        try:
            return self.client.get(key).decode() if self.client.check([key]) else None
        except Exception:  # noqa: BLE001 - the store is gone
            return None

    def close(self) -> None:
        from weightbridge.testing._internal.store_process import stop_process

        stop_process(self.proc)
        self.master = None


class Stores:
    """One store for many jobs (each job has its own key prefixes); a new one when it stopped answering."""

    def __init__(self, kind: str, workdir: Path, timeout_s: float) -> None:
        self.args, self.store, self.jobs = (kind, workdir, timeout_s), None, 0

    def next_job(self) -> tuple[Store, int]:
        if self.store is not None and not self.store.healthy():
            self.store.close()
            self.store = None
        if self.store is None:
            self.store = Store(*self.args)
        self.jobs += 1
        return self.store, self.jobs

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def job_cfg(spec: Path, port: int, timeout_s: float, secret: str, job: int = 0, **kw: Any) -> dict:
    everyone = [f"trainer/{t}" for t in range(NUM_TRAINER)] + [f"rollout/{r}" for r in range(NUM_ROLLOUT)]
    cfg = {"spec": str(spec), "host": HOST, "port": port, "prefix": f"wb{job}", "ctl": f"{R.CTL}{job}",
           "timeout_s": timeout_s, "secret": secret,
           "num_trainer": NUM_TRAINER, "num_rollout": NUM_ROLLOUT, "everyone": everyone,
           "wait_kill_s": 4 * timeout_s + 20, "run_s": 10 * timeout_s + 40}
    cfg.update(kw)
    return cfg


# -- one kill trial ----------------------------------------------------------------------------------------
def plan_trial(cell: Cell, rng: random.Random) -> dict:
    mode, staging, victim, phase = cell
    kill_v = 1 if phase in ("handshake", "idle") else 2
    heal = 2 if phase in ("handshake", "idle") else 3
    rank = rng.randrange(NUM_ROLLOUT) if victim == "rollout" else 0 if victim == "store-host" else int(victim[-1])
    side = "rollout" if victim == "rollout" else "trainer"
    kill = {"phase": phase, "version": kill_v, "round": rng.randint(0, 8)}
    final = heal + STEADY  # pushes after the healing one: a jam shows up there (async staleness)
    return {"cell": cell, "side": side, "rank": rank, "kill": kill, "heal": heal, "final": final,
            "versions": list(range(1, final + 1)), "heals": victim != "store-host"}


def run_trial(cell: Cell, rng: random.Random, workdir: Path, *, timeout_s: float, stores: Stores,
              secret: str, deadline_s: float | None = None) -> dict:
    plan = plan_trial(cell, rng)
    mode, staging = cell[0], cell[1]
    store, job = stores.next_job()
    hosted = not plan["heals"]  # trainer 0 hosts the bridges' store; the harness's keys stay on its own
    spec = write_spec(workdir, mode, timeout_s, external=store.kind == "cli" and not hosted)
    cfg = job_cfg(spec, store.port, timeout_s, secret, job)
    if hosted:  # trainer 0 (the victim) never finishes: the rollouts stop after the other trainers
        cfg["bridge_port"] = free_port()
        cfg["finishers"] = [t for t in range(NUM_TRAINER) if t != plan["rank"]]
    procs, names = [], []
    for t in range(NUM_TRAINER):
        mine = plan["side"] == "trainer" and plan["rank"] == t
        procs.append((R.trainer, (cfg, t, {"versions": plan["versions"], "rejoin_before": plan["heal"] if plan["heals"] else None,
                                           "kill": plan["kill"] if mine else None})))
        names.append(f"trainer/{t}")
    for r in range(NUM_ROLLOUT):
        mine = plan["side"] == "rollout" and plan["rank"] == r
        procs.append((R.rollout, (cfg, r, {"staging": staging, "last": plan["final"],
                                           "kill": plan["kill"] if mine else None})))
        names.append(f"rollout/{r}")
    victim = f"{plan['side']}/{plan['rank']}"
    if plan["heals"]:  # a replacement of the victim rejoins; without the store nothing can
        role = R.trainer if plan["side"] == "trainer" else R.rollout
        ropts = ({"versions": list(range(plan["heal"], plan["final"] + 1)), "replacement": True}
                 if plan["side"] == "trainer" else {"staging": staging, "last": plan["final"], "replacement": True})
        procs.append((role, (cfg, plan["rank"], ropts)))
        names.append(f"{victim} (restarted)")
    t0 = time.time()
    res = launch(_call, [(fn, args) for fn, args in procs], timeout_s=deadline_s or 12 * timeout_s + 60)
    ctl = {k: store.value(f"{cfg['ctl']}/{k}") for k in ("killed_at", "killed_why", "rejoined", f"pushing/{plan['heal']}")}
    out = judge(plan, names, res, ctl, timeout_s)
    out["seconds"] = round(time.time() - t0, 2)
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _call(fn: Callable, args: tuple) -> Any:
    return fn(*args)


def judge(plan: dict, names: list[str], res: list, ctl: dict, timeout_s: float) -> dict:
    """The invariants of one kill trial, from every process's events."""
    mode, staging, victim_kind, phase = plan["cell"]
    victim = f"{plan['side']}/{plan['rank']}"
    killed_at = float(ctl["killed_at"]) if ctl["killed_at"] else None
    heal_start = float(ctl[f"pushing/{plan['heal']}"]) if ctl[f"pushing/{plan['heal']}"] and plan["heals"] \
        else float("inf")  # no healing push where the store died: any raise after the kill counts
    out: dict[str, Any] = {"cell": cell_name(plan["cell"]), "victim": victim, "kill": plan["kill"],
                           "killed": killed_at is not None, "killed_why": ctl["killed_why"],
                           "hang": [], "untyped": [], "wrong": [], "early": [], "latency": {}, "errors": {}}
    healed = killed_at is not None
    for name, r in zip(names, res):
        is_victim, is_repl = name == victim, name.endswith("(restarted)")
        events = r.value if r.ok and isinstance(r.value, list) else []
        if r.timed_out:
            out["hang"].append(name)
        elif not r.ok and not (is_victim and r.exitcode == -9):
            out["untyped"].append(f"{name}: process died (exit {r.exitcode}) {type(r.error).__name__ if r.error else ''}")
        errs = [e for e in events if e["kind"] == "error"]
        if errs:
            out["errors"][name] = [f"{e['type']}: {e['msg'][:160]}" for e in errs[:3]]
        out["untyped"] += [f"{name}: {e['type']}: {e['msg'][:200]}" for e in errs if not e["typed"]]
        for e in events:
            if e["kind"] in ("applied", "error", "final") and e.get("bad"):
                out["wrong"].append(f"{name}: {e['kind']} v{e.get('v', e.get('version'))}: {e['bad'][0]}")
        if is_victim or (is_repl and (r.timed_out or not r.ok)):
            if is_repl:
                healed = False
            continue
        if killed_at is not None and not is_repl:
            raised = [e["t"] - killed_at for e in errs if killed_at <= e["t"] < heal_start]
            if raised:
                out["latency"][name] = round(min(raised), 2)
        if name.startswith("trainer"):
            pushed = {e["v"] for e in events if e["kind"] == "pushed"}
            if (mode == "sync" and plan["side"] == "rollout" and phase != "idle" and not is_repl
                    and plan["kill"]["version"] in pushed and killed_at is not None):
                out["early"].append(f"{name}: push({plan['kill']['version']}) returned though {victim} died")
            healed &= set(range(plan["heal"], plan["final"] + 1)) <= pushed
        else:
            healed &= any(e["kind"] == "applied" and e["v"] == plan["final"] and not e["bad"] for e in events)
    healed &= not out["hang"]
    if not plan["heals"]:  # the store died with its host: the bar is that every survivor raised, typed
        survivors = [n for n in names if n != victim]
        healed = killed_at is not None and not out["hang"] and all(n in out["latency"] for n in survivors)
    lat = max(out["latency"].values(), default=None)
    out["max_latency_over_s"] = None if lat is None else round(lat - timeout_s, 2)
    out["healed"] = bool(healed)
    return out


# -- many trials, the table ----------------------------------------------------------------------------
def run_soak(trials: int, seed: int, *, modes=MODES, cells: list[Cell] | None = None, timeout_s: float = 4.0,
             store_kind: str = "auto", progress: Callable[[str], None] | None = None) -> list[dict]:
    """``trials`` kill trials, cycling through a seeded shuffle of ``cells`` (default: every cell of ``modes``)."""
    rng = random.Random(seed)
    order = list(cells) if cells is not None else all_cells(modes)
    rng.shuffle(order)
    kind = ("cli" if store_cli_available() else "parent") if store_kind == "auto" else store_kind
    secret = os.environ.get(R.SECRET_ENV) or secrets.token_urlsafe(32)
    workdir = Path(tempfile.mkdtemp(prefix="wb-soak-"))
    stores = Stores(kind, workdir, timeout_s)
    out = []
    try:
        for i in range(trials):
            cell = order[i % len(order)]
            t = run_trial(cell, random.Random(rng.getrandbits(64)), workdir, timeout_s=timeout_s,
                          stores=stores, secret=secret)
            t["store"] = kind
            out.append(t)
            if progress:
                progress(f"[{i + 1}/{trials}] {t['cell']} victim={t['victim']}: " + trial_line(t))
    finally:
        stores.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def trial_line(t: dict) -> str:
    lat = t["max_latency_over_s"]
    s = (f"healed={'yes' if t['healed'] else 'NO'} hang={len(t['hang'])} untyped={len(t['untyped'])} "
         f"wrong={len(t['wrong'])} early={len(t['early'])} lat-timeout={'-' if lat is None else f'{lat:+.1f}s'} "
         f"({t['seconds']}s){'' if t['killed'] else ' NOT KILLED'}")
    bad = t["untyped"][:1] + t["wrong"][:1] + t["early"][:1]
    if not t["healed"] and not bad:
        bad = [f"{k}: {v[-1]}" for k, v in list(t["errors"].items())[:2]]
    return s + "".join(f"\n    {b[:240]}" for b in bad)


def summarize(trials: list[dict]) -> list[dict]:
    """One row per cell: trials, hangs, untyped, wrong, early, max latency over timeout_s, healed."""
    rows: dict[str, dict] = {}
    for t in trials:
        row = rows.setdefault(t["cell"], {"cell": t["cell"], "trials": 0, "hangs": 0, "untyped": 0, "wrong": 0,
                                          "early": 0, "not_killed": 0, "max_latency_over_s": None, "healed": 0})
        row["trials"] += 1
        row["hangs"] += bool(t["hang"])
        row["untyped"] += len(t["untyped"])
        row["wrong"] += len(t["wrong"])
        row["early"] += len(t["early"])
        row["not_killed"] += not t["killed"]
        row["healed"] += t["healed"]
        lat = t["max_latency_over_s"]
        if lat is not None:
            row["max_latency_over_s"] = lat if row["max_latency_over_s"] is None else max(row["max_latency_over_s"], lat)
    return [rows[k] for k in sorted(rows)]


def format_table(rows: list[dict]) -> str:
    head = f"{'cell (mode/rollouts/victim/phase)':40} {'trials':>6} {'hangs':>5} {'untyped':>7} {'wrong':>5} " \
           f"{'early':>5} {'lat-timeout':>11} {'healed':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lat = r["max_latency_over_s"]
        healed = "yes" if r["healed"] == r["trials"] else f"no {r['healed']}/{r['trials']}"
        nk = f" ({r['not_killed']} not killed)" if r["not_killed"] else ""
        lines.append(f"{r['cell']:40} {r['trials']:>6} {r['hangs']:>5} {r['untyped']:>7} {r['wrong']:>5} "
                     f"{r['early']:>5} {'-' if lat is None else f'{lat:+.1f}s':>11} {healed:>8}{nk}")
    return "\n".join(lines)


def passed(rows: list[dict], slack_s: float = 2.0) -> bool:
    """The issue's bar: 0 hangs, 0 untyped, 0 wrong, 0 early, latency within timeout_s + slack, all healed."""
    return all(r["hangs"] == r["untyped"] == r["wrong"] == r["early"] == r["not_killed"] == 0
               and r["healed"] == r["trials"]
               and (r["max_latency_over_s"] is None or r["max_latency_over_s"] <= slack_s) for r in rows)
