"""Process bodies of the conformance scenarios (run inside ``localrun.launch`` processes).

Each body builds the integration's side with its factory, follows the scenario's script and
returns a list of plain dict events (picklable) that the suite's tests assert on. Every wait
here is bounded by the script's ``run_s``; the parent kills the process at its own deadline.

Store keys of the suite (prefix ``wbtest/``): ``ready/rollout/R`` (unit built), ``pushing/V`` (a trainer
rank began push V), ``pushed/T/V``,
``failed/T/V`` (push V raised on trainer rank T), ``trainer-done/T`` (``impostor-done/T`` for a trainer
without the job secret), ``killed_at`` (set by :class:`~weightbridge.testing.contract.FaultHook`),
``state/rollout/R`` (post-failure state recorded).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from weightbridge.testing.contract import TEST_KEYS, RankContext, load_factory

GRACE_S = 0.5  # rollout: how long to keep polling once every trainer is done
SLACK_S = 2.0  # scheduling slack on top of a deadline


def key(*parts: object) -> str:
    return "/".join([TEST_KEYS, *map(str, parts)])


SPARSE_FRACTION = 0.02  # "sparse" scripts: the share of elements each version redraws


def expected_weights(resolved, version: int, sparse: bool = False) -> dict[str, Any]:
    """The canonical weights of ``version``: the same in every process (seeded by version).

    ``sparse``: a fixed base with :data:`SPARSE_FRACTION` of its elements redrawn per version, so
    consecutive versions differ in about twice that share (what a delta update sends)."""
    import torch

    from weightbridge.tensors import canonical_tensors

    if not sparse:
        return canonical_tensors(resolved.canonical, seed=1000 + version)
    out = canonical_tensors(resolved.canonical, seed=1000)
    fresh = canonical_tensors(resolved.canonical, seed=5000 + version)
    g = torch.Generator().manual_seed(version)
    for name in sorted(out):
        mask = torch.rand(out[name].shape, generator=g) < SPARSE_FRACTION
        out[name][mask] = fresh[name][mask]
    return out


def wait_key(store, name: str, deadline: float, why: str) -> None:
    while not store.check([name]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"conformance suite: gave up waiting for {why} ({name})")
        time.sleep(0.01)


def error_event(exc: BaseException, **extra: Any) -> dict[str, Any]:
    from weightbridge.errors import BridgeError

    return {"kind": "error", "type": type(exc).__name__, "typed": isinstance(exc, BridgeError),
            "message": str(exc)[:2000], "time": time.time(), **extra}


def tensor_problems(layout, tensors: Mapping[str, Any]) -> list[str]:
    """Names, shapes and dtypes of ``tensors`` against the spec's ``layout`` (extra tensors are fine)."""
    from weightbridge.tensors import dtype_name

    out = []
    for t in layout.tensors:
        got = tensors.get(t.name)
        if got is None:
            out.append(f"{t.name}: missing (spec: {list(t.shape)} {t.dtype})")
            continue
        dtype = dtype_name(got.dtype)
        if tuple(got.shape) != tuple(t.shape) or dtype != t.dtype:
            out.append(f"{t.name}: {list(got.shape)} {dtype}, spec {list(t.shape)} {t.dtype}")
    return out


def probe_against_spec(resolved, want, load_weights, destinations) -> dict[str, Any]:
    """Probe ``load_weights`` into IR and diff it with the spec's layout ``want`` of that rank."""
    import traceback

    from weightbridge.probe import probe_loader
    from weightbridge.probe.diff import diff_layouts, format_diff

    try:
        res = probe_loader(
            resolved.canonical, load_weights, destinations, side=want.side, rank=want.rank,
            instance=want.instance, local_rank=want.local_rank, coords=dict(want.coords),
        )
    except Exception:  # noqa: BLE001 - the loader's own error is the finding
        return {"probed": True, "ok": False, "summary": "the loader raised while being probed",
                "diff": traceback.format_exc(limit=-4)}
    diffs = diff_layouts(res.layout, want)
    return {"probed": True, "ok": res.ok and not diffs, "summary": res.summary(), "diff": format_diff(diffs)}


def _diff_given(want, got) -> dict[str, Any]:
    from weightbridge.layout.ir import RankLayout
    from weightbridge.probe.diff import diff_layouts, format_diff

    layout = got if isinstance(got, RankLayout) else RankLayout.from_json(got)
    diffs = diff_layouts(layout, want)
    return {"probed": True, "ok": not diffs, "summary": "probe_layout() of the unit", "diff": format_diff(diffs)}


def _build(job: dict[str, Any]):
    return load_factory(job["factory"], f"{job['role']} factory")(job["ctx"])


def _hold(store, hold: dict[str, Any]) -> dict[str, Any]:
    """Hold the unit before an apply until one of ``hold["until"]`` is set (at most ``max_s``): an
    engine slower to reach its safe point than the trainer's deadline."""
    t0, end, released = time.time(), time.monotonic() + hold["max_s"], None
    while released is None and time.monotonic() < end:
        released = next((k for k in hold["until"] if store.check([k])), None)
        time.sleep(0.01)
    return {"kind": "held", "start": t0, "time": time.time(), "released_by": released}


# ---------------------------------------------------------------------------------------------
# trainer ranks
# ---------------------------------------------------------------------------------------------


def trainer_body(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One trainer rank: build, then either probe (layout) or load + push each version of the script."""
    ctx: RankContext = job["ctx"]
    s = job["script"]
    store, resolved = ctx.store(), ctx.resolved()
    deadline = time.monotonic() + s["run_s"]
    for name in s.get("after_keys", ()):
        wait_key(store, name, deadline, "the failure to be handled before restarting")
    done = key(s.get("done_key", "trainer-done"), ctx.rank)
    if s.get("wrong_secret"):
        # An impostor: the integration's own trainer code in a process that does not hold the job
        # secret (the environment is where the suite's processes find it), but another one that
        # every impostor rank shares (so they act as one trainer side).
        from weightbridge.sync.auth import ENV

        os.environ[ENV] = s["wrong_secret"]
        try:
            side = _build(job)
        except BaseException as exc:  # noqa: BLE001 - refused while connecting: reported to the test
            store.set(done, "1")
            return [error_event(exc, version=None, start=time.time())]
    else:
        side = _build(job)
    layout = resolved.trainer.ranks[ctx.rank]
    if s.get("probe"):
        out = {"kind": "layout", "rank": ctx.rank, "problems": tensor_problems(layout, side.tensors())}
        if not out["problems"]:
            out.update(probe_against_spec(resolved, layout, side.load_weights, side.tensors))
        side.close()
        return [out]
    for r in s.get("await_ready", ()):
        wait_key(store, key("ready/rollout", r), deadline, f"rollout rank {r} to be built")
    events: list[dict[str, Any]] = []
    for v in s["versions"]:
        for name in s.get("wait_keys", {}).get(v, ()):
            wait_key(store, name, deadline, f"{name} before pushing version {v}")
        side.load_weights(iter(expected_weights(resolved, v, s.get("sparse", False)).items()))
        store.set(key("pushing", v), "1")  # FaultHook: the push in flight
        t0 = time.time()
        try:
            result = side.push(v)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            events.append(error_event(exc, version=v, start=t0))
            store.set(key("failed", ctx.rank, v), "1")
            if s.get("stop_on_error", True):
                break
            continue
        events.append({"kind": "pushed", "version": v, "start": t0, "time": time.time(),
                       "delta_buckets": getattr(result, "delta_buckets", None)})
        store.set(key("pushed", ctx.rank, v), "1")
    store.set(done, "1")
    side.close()
    return events


# ---------------------------------------------------------------------------------------------
# rollout units
# ---------------------------------------------------------------------------------------------


def _probe_unit(unit, resolved, rank: int) -> dict[str, Any]:
    want = resolved.rollout.ranks[rank]
    if hasattr(unit, "probe_layout"):
        return _diff_given(want, unit.probe_layout(rank))
    if hasattr(unit, "load_weights"):
        return probe_against_spec(resolved, want, lambda w: unit.load_weights(w, rank), lambda: unit.tensors(rank))
    return {"probed": False, "ok": False, "summary": "", "diff": (
        f"{type(unit).__name__} has neither probe_layout(rank) nor load_weights(weights, rank): "
        "nothing to probe; add the engine's own loader (see weightbridge.testing.contract)")}


def _state_event(unit, ctx: RankContext, resolved) -> dict[str, Any]:
    """The unit's state after a failed update: torn flag, version, what apply() does, weights."""
    from weightbridge.tensors import layout_mismatches

    torn, version = unit.torn, unit.version
    apply_raised = None
    if torn:
        try:
            unit.apply()
        except BaseException as exc:  # noqa: BLE001
            apply_raised = type(exc).__name__
    bad = None
    if not torn and version is not None:
        want = expected_weights(resolved, version)
        bad = {r: layout_mismatches(resolved.rollout.ranks[r], unit.tensors(r), want) for r in ctx.ranks}
    return {"kind": "state", "torn": torn, "version": version, "apply_raised": apply_raised, "bad": bad,
            "time": time.time()}


def rollout_body(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One rollout unit: build, then probe (layout) or poll/apply until the script's last version."""
    from weightbridge.tensors import layout_mismatches
    from weightbridge.tensors import diff_tensors

    ctx: RankContext = job["ctx"]
    s = job["script"]
    store, resolved = ctx.store(), ctx.resolved()
    deadline = time.monotonic() + s["run_s"]
    if s.get("start_key"):
        wait_key(store, s["start_key"], deadline, "the moment this late instance starts")
    unit = _build(job)
    if s.get("probe"):
        out = []
        for r in ctx.ranks:
            ev = {"kind": "layout", "rank": r, "problems": tensor_problems(resolved.rollout.ranks[r], unit.tensors(r))}
            if not ev["problems"]:
                ev.update(_probe_unit(unit, resolved, r))
            out.append(ev)
        unit.close()
        return out
    initial = {r: {n: t.clone() for n, t in unit.tensors(r).items()} for r in ctx.ranks} if s.get("snapshot") else None
    for r in ctx.ranks:
        store.set(key("ready/rollout", r), "1")
    events: list[dict[str, Any]] = []
    trainers_done = [key("trainer-done", t) for t in range(s["num_trainers"])]
    state_pending, failed_after_kill, done_at = bool(s.get("record_state")), False, None
    hold, ready_count = s.get("hold_apply"), 0
    while time.monotonic() < deadline:
        if done_at is None and store.check(trainers_done):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > GRACE_S:
            break
        try:
            if unit.poll():
                ready_count += 1
                if hold and ready_count == hold["nth"]:
                    events.append(_hold(store, hold))
                time.sleep(s.get("apply_delay_s", 0.0))  # a slow engine reaching its safe point
                t0 = time.time()
                v = unit.apply()
                seen = unit.version
                want = expected_weights(resolved, v, s.get("sparse", False))
                bad = {r: layout_mismatches(resolved.rollout.ranks[r], unit.tensors(r), want) for r in ctx.ranks}
                events.append({"kind": "applied", "version": v, "seen": seen, "start": t0, "bad": bad})
                if v >= s["last"]:
                    break
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            events.append(error_event(exc))
            failed_after_kill = store.check([key("killed_at")])
            if s.get("stop_on_error"):
                break
        if state_pending and store.check([key("killed_at")]):
            killed_at = float(store.get(key("killed_at")))
            if failed_after_kill or time.time() > killed_at + ctx.timeout_s + SLACK_S:
                events.append(_state_event(unit, ctx, resolved))
                for r in ctx.ranks:
                    store.set(key("state/rollout", r), "1")
                state_pending = False
        time.sleep(0.002)
    if initial is not None:
        events.append({"kind": "unchanged", "bad": {r: diff_tensors(unit.tensors(r), initial[r]) for r in ctx.ranks}})
    events.append({"kind": "final", "version": unit.version, "torn": unit.torn})
    unit.close()
    return events


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Entry point of every scenario process (``localrun.launch`` target)."""
    return (trainer_body if job["role"] == "trainer" else rollout_body)(job)
