"""Hostile-client harness (issue 13): a process without the job secret attacks a running bridge job.

Who does what (all local processes, one :func:`weightbridge.localrun.launch` per job):

* **the harness parent** (this module): hosts the control store (or starts ``weightbridge store``;
  jobs share it under their own key prefixes, a new one when it stops answering),
  plans the job's steps, judges them from every process's events;
* **the real job** (:mod:`weightbridge.testing._internal.soak_roles`): trainer ranks 0 and 1 with the job secret,
  rollout rank 0 (staging) and rollout rank 1 (in place); push 1 is clean, then two pushes per step:
  the *next* push right after the attack and the *healing* push after it;
* **the stranger** (:func:`~weightbridge.testing._internal.soak_roles.stranger`, no secret): per ``garbage`` step,
  one value of one kind (:data:`~weightbridge.testing._internal.garbage.GARBAGE_KINDS`) under one key of the
  runtime's layout, enumerated at run time from :class:`weightbridge.sync.messages.Keys`
  (:func:`~weightbridge.testing._internal.garbage.key_targets`); in the ``forge`` step it writes acks claiming
  every rollout staged and applied the push in flight while the rollouts apply it slowly;
* **the impostors** (:func:`~weightbridge.testing._internal.soak_roles.impostor`): two processes posing as trainer
  ranks 0 and 1 with the public ``TrainerBridge``, with no secret (step ``impostor-none``) or a wrong one
  (``impostor-wrong``), pushing version 999+.

Judged per step: **untyped** errors on the real ranks in the step's window (types not
:class:`~weightbridge.errors.BridgeError`, dead threads, crashed processes); **next ok** (the push right
after the attack succeeded); **healed** (the push after that succeeded on every trainer and every
rollout applied it, or a later one, bitwise); **stranger applied** (a rollout applied a version the
real trainers never pushed); **early** (forge, sync mode: a push returned before every rollout
began applying it, i.e. on forged acks); **hang** (the launch deadline hit). Steps after one that
did not heal are marked ``after_break`` and run again in a fresh job (:func:`run_hostile`).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weightbridge.localrun import launch
from weightbridge.testing._internal import garbage as G
from weightbridge.testing._internal import soak_roles as R
from weightbridge.testing._internal.soak import (
    NUM_ROLLOUT,
    NUM_TRAINER,
    Stores,
    _call,
    job_cfg,
    store_cli_available,
    write_spec,
)

APPLY_DELAY_S = 1.5  # the forge step: how long each rollout waits before apply()


def plan_steps(rng: random.Random, *, all_kinds: bool = False, targets: list[dict] | None = None,
               kinds: tuple[str, ...] = G.GARBAGE_KINDS, impostors: bool = True, forge: bool = True) -> list[dict]:
    """Garbage steps (every target once with a rotating kind, or every kind when ``all_kinds``), then the
    impostor and forge steps."""
    if targets is None:
        targets, _ = G.key_targets(NUM_TRAINER, NUM_ROLLOUT)
    steps = []
    offset = rng.randrange(len(kinds))
    for i, t in enumerate(targets):
        for kind in (kinds if all_kinds else [kinds[(i + offset) % len(kinds)]]):
            steps.append({"action": "garbage", "method": t["method"], "args": t["args"], "label": t["label"],
                          "kind": kind, "seed": rng.getrandbits(32)})
    rng.shuffle(steps)
    if impostors:
        steps += [{"action": "impostor", "wrong": False, "label": "TrainerBridge", "kind": "no-secret"},
                  {"action": "impostor", "wrong": True, "label": "TrainerBridge", "kind": "wrong-secret"}]
    if forge:
        steps.append({"action": "forge", "label": "ack(*)", "kind": "forged-acks"})
    return steps


def run_job(steps: list[dict], mode: str, workdir: Path, *, timeout_s: float, stores: Stores, secret: str) -> list[dict]:
    """One job through ``steps``; returns one judged dict per step."""
    store, job = stores.next_job()
    spec = write_spec(workdir, mode, timeout_s, external=store.kind == "cli")
    cfg = job_cfg(spec, store.port, timeout_s, secret, job)
    for j, st in enumerate(steps):
        st.update(step=j, after=1 + 2 * j, versions=(2 + 2 * j, 3 + 2 * j))
    final = 1 + 2 * len(steps)
    trainer_steps = {st["versions"][0]: st["step"] for st in steps}
    forge_v = [st["versions"][0] for st in steps if st["action"] == "forge"]
    procs = [(R.trainer, (cfg, t, {"versions": list(range(1, final + 1)), "steps": trainer_steps}))
             for t in range(NUM_TRAINER)]
    procs += [(R.rollout, (cfg, r, {"staging": r == 0, "last": final,
                                    "apply_delay": {v: APPLY_DELAY_S for v in forge_v}})) for r in range(NUM_ROLLOUT)]
    procs.append((R.stranger, (cfg, [st for st in steps if st["action"] != "impostor"])))
    imp = [st for st in steps if st["action"] == "impostor"]
    for st in imp:
        procs += [(R.impostor, (cfg, t, st["after"], st["step"], st["wrong"])) for t in range(NUM_TRAINER)]
    res = launch(_call, procs, timeout_s=len(steps) * (8 * timeout_s + 10) + 60)
    return judge_job(steps, mode, res)


def judge_job(steps: list[dict], mode: str, res: list) -> list[dict]:
    names = [f"trainer/{t}" for t in range(NUM_TRAINER)] + [f"rollout/{r}" for r in range(NUM_ROLLOUT)]
    real = {n: (r.value if r.ok and isinstance(r.value, list) else []) for n, r in zip(names, res)}
    hang = [n for n, r in zip(names, res) if r.timed_out]
    crashed = [f"{n}: process died (exit {r.exitcode})" for n, r in zip(names, res) if not r.ok and not r.timed_out]
    stranger_ev = res[len(names)].value if res[len(names)].ok else []
    imp_res = res[len(names) + 1:]
    out, broken, t_prev = [], False, 0.0
    for st in steps:
        a, b = st["versions"]
        pushes = {n: {e["v"]: e for e in ev if e.get("v") in (a, b) and e["kind"] in ("pushed", "error")}
                  for n, ev in real.items() if n.startswith("trainer")}
        t_end = max((e["t"] for p in pushes.values() for e in p.values()), default=float("inf"))
        window = [(n, e) for n, ev in real.items() for e in ev if e["kind"] == "error" and t_prev <= e["t"] <= t_end]
        applied = {n: [e for e in ev if e["kind"] == "applied"] for n, ev in real.items() if n.startswith("rollout")}
        next_ok = all(p.get(a, {}).get("kind") == "pushed" for p in pushes.values())
        healed = all(p.get(b, {}).get("kind") == "pushed" for p in pushes.values()) and all(
            any(e["v"] is not None and b <= e["v"] < R.IMPOSTOR_VERSION and not e["bad"] for e in ap)
            for ap in applied.values())
        row: dict[str, Any] = {
            "step": st["step"], "action": st["action"], "target": st["label"], "kind": st["kind"],
            "after_break": broken, "hang": bool(hang) and t_end == float("inf"), "next_ok": next_ok, "healed": healed,
            "untyped": [f"{n}: {e['type']}: {e['msg'][:200]}" for n, e in window if not e["typed"]],
            "errors": dict(Counter(f"{n}: {e['type']}" for n, e in window)),
            "first_error": next((f"{n}: {e['type']}: {e['msg'][:200]}" for n, e in window), None),
        }
        if st["action"] == "garbage":
            ev = next((e for e in stranger_ev if e.get("step") == st["step"]), {})
            row["key"] = ev.get("key")
        if st["action"] == "impostor":
            row["stranger_applied"] = [f"{n}: applied v{e['v']}" for n, ap in applied.items() for e in ap
                                       if e["v"] is not None and e["v"] >= R.IMPOSTOR_VERSION and t_prev <= e["t"] <= t_end]
            mine = [r.value for r in imp_res if r.ok and r.value and any(e.get("v") == R.IMPOSTOR_VERSION + st["step"]
                                                                        for e in r.value)]
            row["impostor"] = [next((e["kind"] if e["kind"] == "pushed" else f"{e['type']}: {e['msg'][:120]}"
                                     for e in ev if e["kind"] in ("pushed", "error")), "?") for ev in mine]
        if st["action"] == "forge":
            row["early"] = []
            if mode == "sync":
                # Compared with when each rollout *began* apply(): its genuine ack is written inside apply(),
                # so a push may return before apply() returns; only forged acks let it return before the
                # last rollout even began (each waits APPLY_DELAY_S before apply()).
                last_began = max(max((e.get("began", e["t"]) for e in ap if e["v"] == a), default=float("inf"))
                                 for ap in applied.values())
                for n, p in pushes.items():
                    e = p.get(a)
                    if e and e["kind"] == "pushed" and e["t"] < last_began:
                        late = "a rollout never applied it" if last_began == float("inf") else \
                            f"{last_began - e['t']:.2f}s before every rollout began applying it"
                        row["early"].append(f"{n}: push({a}) returned, {late}")
        if crashed and st is steps[-1]:
            row["untyped"] += crashed
        row["wrong"] = [f"{n}: v{e['v']}: {e['bad'][0]}" for n, ap in applied.items() for e in ap
                        if e["bad"] and t_prev <= e["t"] <= t_end and (e["v"] or 0) < R.IMPOSTOR_VERSION]
        out.append(row)
        broken = broken or not healed
        t_prev = t_end if t_end != float("inf") else t_prev
    return out


def run_hostile(seed: int, *, modes=("sync",), steps_per_job: int = 12, all_kinds: bool = False, timeout_s: float = 4.0,
                store_kind: str = "auto", limit: int | None = None, targets: list[dict] | None = None,
                budget_s: float | None = None, kinds: tuple[str, ...] = G.GARBAGE_KINDS,
                progress: Callable[[str], None] | None = None) -> dict:
    """Every step of :func:`plan_steps` per mode; ``limit``: only that many garbage steps.

    Garbage steps run ``steps_per_job`` per job; when a step does not heal, the steps after it run
    again in a fresh job (so each key's outcome is its own). The impostor and forge steps each get
    a job of their own. ``budget_s``: stop starting jobs after that long (the rest: not run)."""
    rng = random.Random(seed)
    kind = ("cli" if store_cli_available() else "parent") if store_kind == "auto" else store_kind
    secret = os.environ.get(R.SECRET_ENV) or secrets.token_urlsafe(32)
    _, uncovered = G.key_targets(NUM_TRAINER, NUM_ROLLOUT)
    workdir = Path(tempfile.mkdtemp(prefix="wb-hostile-"))
    stores = Stores(kind, workdir, timeout_s)
    rows: list[dict] = []
    start, not_run = time.monotonic(), 0
    try:
        for mode in modes:
            steps = plan_steps(rng, all_kinds=all_kinds, targets=targets, kinds=kinds)
            garbage = [s for s in steps if s["action"] == "garbage"][:limit]
            jobs = [[s] for s in steps if s["action"] != "garbage"]
            queue = garbage
            while queue or jobs:
                if budget_s is not None and time.monotonic() - start > budget_s:
                    not_run += len(queue) + len(jobs)
                    break
                batch = queue[:steps_per_job] if queue else jobs.pop(0)
                t0 = time.time()
                got = run_job([dict(s) for s in batch], mode, workdir, timeout_s=timeout_s, stores=stores,
                              secret=secret)
                broke = next((i for i, r in enumerate(got) if not r["healed"]), None)
                kept = got if broke is None or not queue else got[:broke + 1]
                if queue:
                    queue = batch[len(kept):] + queue[len(batch):]
                for r in kept:
                    r["mode"] = mode
                    rows.append(r)
                    if progress:
                        progress(f"[hostile {mode}] {r['target']} <- {r['kind']}: " + step_line(r))
                if progress:
                    progress(f"[hostile {mode}] job of {len(batch)} steps ({len(kept)} kept) took {time.time() - t0:.1f}s")
    finally:
        stores.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"steps": rows, "uncovered": uncovered, "store": kind, "not_run": not_run}


def step_line(r: dict) -> str:
    s = (f"next={'ok' if r['next_ok'] else 'FAIL'} healed={'yes' if r['healed'] else 'NO'} "
         f"untyped={len(r['untyped'])} wrong={len(r['wrong'])}")
    if "stranger_applied" in r:
        s += f" stranger_applied={len(r['stranger_applied'])} impostor={r['impostor']}"
    if "early" in r:
        s += f" early={len(r['early'])}"
    if r["after_break"]:
        s += " (after an earlier step broke the job)"
    if r["hang"]:
        s += " HANG"
    bad = r["untyped"][:1] + r["wrong"][:1] + r.get("early", [])[:1] + r.get("stranger_applied", [])[:1]
    if not bad and not r["healed"] and r["first_error"]:
        bad = [r["first_error"]]
    return s + "".join(f"\n    {b[:240]}" for b in bad)


def summarize_hostile(result: dict) -> list[dict]:
    """One row per (mode, key family or attack, garbage kind)."""
    rows: dict[tuple, dict] = {}
    for r in result["steps"]:
        family = r["target"].split("(")[0]
        row = rows.setdefault((r["mode"], family, r["kind"]), {
            "mode": r["mode"], "target": family, "kind": r["kind"], "steps": 0, "after_break": 0, "hangs": 0,
            "untyped": 0, "wrong": 0, "next_failed": 0, "not_healed": 0, "stranger_applied": 0, "early": 0})
        row["steps"] += 1
        row["stranger_applied"] += len(r.get("stranger_applied", []))  # whatever state the job is in
        row["early"] += len(r.get("early", []))
        if r["after_break"]:
            row["after_break"] += 1
            continue
        row["hangs"] += r["hang"]
        row["untyped"] += len(r["untyped"])
        row["wrong"] += len(r["wrong"])
        row["next_failed"] += not r["next_ok"]
        row["not_healed"] += not r["healed"]
    return [rows[k] for k in sorted(rows)]


def format_hostile(rows: list[dict]) -> str:
    cols = ["steps", "after_break", "hangs", "untyped", "wrong", "next_failed", "not_healed", "stranger_applied", "early"]
    head = f"{'mode':6} {'key / attack':14} {'kind':14} " + " ".join(f"{c:>{max(5, len(c))}}" for c in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['mode']:6} {r['target']:14} {r['kind']:14} "
                     + " ".join(f"{r[c]:>{max(5, len(c))}}" for c in cols))
    return "\n".join(lines)


def hostile_passed(rows: list[dict]) -> bool:
    """No hang, no untyped error, no wrong or stranger's weights served, no early return, every step healed."""
    return all(r["hangs"] == r["untyped"] == r["wrong"] == r["stranger_applied"] == r["early"] == r["not_healed"]
               == r["after_break"] == 0 for r in rows)
