"""The umbrella base class: derive one test class from :class:`ConformanceSuite` and provide fixtures.

See :mod:`weightbridge.testing` for the fixture contract. Each test checks exactly one
requirement of :data:`weightbridge.testing.requirements.REQUIREMENTS`; tests sharing a
scenario share one run of it per test class (the runs are cached).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from weightbridge.testing.requirements import requirement
from weightbridge.testing.verdict import Verdict, first_bad, typed_error_in_time

_MISSING = {
    "wb_spec": "def wb_spec():\n        return Path(__file__).parent / \"weightbridge.yaml\"  # your integration's spec",
    "wb_trainer": "def wb_trainer():\n        return my_conformance.build_trainer  # (ctx: RankContext) -> TrainerRank",
    "wb_rollout": "def wb_rollout():\n        return my_conformance.build_rollout  # (ctx: RankContext) -> RolloutUnit",
}


def _fixture(request, name: str, default: Any = None) -> Any:
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        if name not in _MISSING:
            return default
        pytest.fail(
            f"weightbridge conformance: fixture {name!r} is missing. Add it to your conftest.py:\n\n"
            f"    @pytest.fixture\n    {_MISSING[name]}\n\n"
            "(factories must live in an importable module, not in conftest.py; see `python -c "
            "\"import weightbridge.testing as t; help(t)\"`)",
            pytrace=False,
        )


class ConformanceSuite:
    """Every requirement of the suite, checked against the integration the fixtures describe.

    Class attributes an integration may set: ``known_gaps`` ({requirement id: reason}: run as
    strict xfail), ``timeout_s`` (the runs' ``sync.timeout_s``), ``startup_s`` (time allowed
    for building a side: engine start; unset, both are the largest of this class's defaults and
    the factories' ``suite_settings``: weightbridge's vLLM and SGLang units ask for what a real
    engine needs), ``slack_s`` (scheduling slack on deadlines),
    ``preload`` (modules the fork server imports once, e.g. the engine).
    """

    known_gaps: ClassVar[dict[str, str]] = {}
    timeout_s: ClassVar[float] = 5.0
    startup_s: ClassVar[float] = 30.0
    slack_s: ClassVar[float] = 2.0
    preload: ClassVar[tuple[str, ...]] = ()

    def _setting(self, name: str, *factories: str) -> float:
        """``name`` as the integration's class sets it; else the largest a factory asks for (its
        ``suite_settings`` dict: an engine's unit knows its start-up time, e.g.
        ``weightbridge.integrations.vllm.conformance:build_rollout``); else this class's default."""
        from weightbridge.testing.contract import load_factory

        for klass in type(self).__mro__:
            if klass is ConformanceSuite:
                break
            if name in vars(klass):
                return float(getattr(self, name))
        asked = [getattr(load_factory(ref), "suite_settings", {}).get(name) for ref in factories]
        return float(max([getattr(ConformanceSuite, name)] + [a for a in asked if isinstance(a, (int, float))]))

    @pytest.fixture
    def wb_runner(self, request, tmp_path_factory):
        from pathlib import Path

        from weightbridge.testing.contract import factory_ref
        from weightbridge.testing.scenarios import Integration, Runner

        from weightbridge.testing import plugin

        if not request.config.pluginmanager.is_registered(plugin):
            pytest.fail("weightbridge conformance: the pytest plugin is not loaded; install weightbridge-rl "
                        "(it registers a pytest11 entry point) or run pytest -p weightbridge.testing.plugin",
                        pytrace=False)
        cache = request.config.stash.setdefault(RUNNERS, {})
        owner = request.node.parent.nodeid  # the test class: its tests share scenario runs
        if owner not in cache:
            spec = Path(_fixture(request, "wb_spec"))
            try:
                trainer = factory_ref(_fixture(request, "wb_trainer"), "wb_trainer")
                rollout = factory_ref(_fixture(request, "wb_rollout"), "wb_rollout")
            except ValueError as exc:
                pytest.fail(f"weightbridge conformance: {exc}", pytrace=False)
            scope = _fixture(request, "wb_rollout_scope", "rank")
            if scope not in ("rank", "instance"):
                pytest.fail(f"wb_rollout_scope must be 'rank' or 'instance', got {scope!r}", pytrace=False)
            cache[owner] = Runner(Integration(
                spec_path=spec, trainer=trainer, rollout=rollout, scope=scope,
                workdir=tmp_path_factory.mktemp("wbconf"), timeout_s=self._setting("timeout_s", trainer, rollout),
                startup_s=self._setting("startup_s", trainer, rollout), preload=tuple(self.preload),
            ))
        return cache[owner]

    # -- the spec ----------------------------------------------------------------------------
    @requirement("spec.resolve.clean")
    def test_the_spec_validates_and_resolves(self, wb_runner):
        from weightbridge.spec.errors import SpecErrors
        from weightbridge.spec.resolve import resolve_spec

        v = Verdict("spec.resolve.clean")
        try:
            resolve_spec(wb_runner.integ.spec_path)
        except SpecErrors as exc:
            v.add(str(exc))
        v.done()

    @requirement("layout.cover.exact")
    def test_the_plan_covers_every_rollout_element_exactly_once(self, wb_runner):
        from weightbridge.plan import build_plan, validate_plan

        r = wb_runner.integ.resolved
        plan = build_plan(r.trainer, r.rollout, round_bytes=int(r.sync.round_bytes))
        v = Verdict("layout.cover.exact")
        for p in validate_plan(plan, r.trainer, r.rollout, canonical=r.canonical):
            v.add(str(p))
        v.done()

    # -- layouts -----------------------------------------------------------------------------
    def _layout(self, wb_runner, req: str, role: str, probed: bool) -> None:
        run = wb_runner.run("layout")
        v = Verdict(req, run)
        for proc in run.role(role):
            if not v.expect(proc.ok, proc.describe()):
                continue
            for ev in proc.events:
                where = f"{role} rank {ev['rank']}"
                if ev["problems"]:
                    v.add(f"{where}: tensors differ from the spec: " + "; ".join(ev["problems"][:4]))
                elif probed and not ev["ok"]:
                    v.add(f"{where}: probing its loader disagrees with the spec:\n{ev['summary']}\n{ev['diff']}")
        v.done()

    @requirement("layout.trainer.tensors-match")
    def test_trainer_tensors_match_the_spec(self, wb_runner):
        self._layout(wb_runner, "layout.trainer.tensors-match", "trainer", probed=False)

    @requirement("layout.rollout.tensors-match")
    def test_rollout_tensors_match_the_spec(self, wb_runner):
        self._layout(wb_runner, "layout.rollout.tensors-match", "rollout", probed=False)

    @requirement("layout.trainer.probe-agrees")
    def test_probing_the_trainer_loader_agrees_with_the_spec(self, wb_runner):
        self._layout(wb_runner, "layout.trainer.probe-agrees", "trainer", probed=True)

    @requirement("layout.rollout.probe-agrees")
    def test_probing_the_rollout_loader_agrees_with_the_spec(self, wb_runner):
        self._layout(wb_runner, "layout.rollout.probe-agrees", "rollout", probed=True)

    # -- landing updates ---------------------------------------------------------------------
    def _bitwise(self, wb_runner, req: str, scenario: str, last: int, more=None) -> None:
        run = wb_runner.run(scenario)
        v = Verdict(req, run)
        if v.processes_ok():
            for proc in run.role("rollout"):
                applied = proc.of("applied")
                v.expect(bool(applied) and applied[-1]["version"] == last,
                         f"{proc.label}: applied {[e['version'] for e in applied]}, never version {last}")
                for e in applied:
                    bad = first_bad(e["bad"])
                    v.expect(not bad, f"{proc.label} version {e['version']}: {bad}")
            if more is not None:
                more(v, run)
        v.done()

    @requirement("sync.push.bitwise")
    def test_sync_pushes_land_bitwise(self, wb_runner):
        self._bitwise(wb_runner, "sync.push.bitwise", "sync", 3)

    @requirement("sync.refit.later-bitwise")
    def test_every_refit_after_the_first_lands_bitwise(self, wb_runner):
        run = wb_runner.run("sync")
        v = Verdict("sync.refit.later-bitwise", run)
        if v.processes_ok():
            for proc in run.role("rollout"):
                applied = proc.of("applied")
                later = applied[1:]
                v.expect(len(later) >= 2, f"{proc.label}: applied {[e['version'] for e in applied]}: fewer than two "
                                          "updates after the first")
                for before, e in zip(applied, later):
                    bad = first_bad(e["bad"])
                    v.expect(not bad, f"{proc.label}: version {e['version']}, applied after version "
                                      f"{before['version']}: {bad}")
        v.done()

    @requirement("async.push.bitwise")
    def test_async_pushes_land_bitwise(self, wb_runner):
        self._bitwise(wb_runner, "async.push.bitwise", "async", 4)

    @requirement("delta.push.bitwise")
    def test_delta_pushes_land_bitwise(self, wb_runner):
        def deltas_were_sent(v, run) -> None:
            for proc in run.role("trainer"):  # when push() returns the bridge's PushStats
                later = [e["delta_buckets"] for e in proc.of("pushed")[1:] if e.get("delta_buckets") is not None]
                v.expect(not later or any(later),
                         f"{proc.label}: pushes 2..6 sent no delta bucket ({later}): is sync.delta on in the spec used?")

        self._bitwise(wb_runner, "delta.push.bitwise", "delta", 6, more=deltas_were_sent)

    @requirement("sync.version.monotonic")
    def test_applied_versions_increase_to_the_last_push(self, wb_runner):
        run = wb_runner.run("sync")
        v = Verdict("sync.version.monotonic", run)
        if v.processes_ok():
            for proc in run.role("rollout"):
                seq = [e["version"] for e in proc.of("applied")]
                v.expect(all(a < b for a, b in zip(seq, seq[1:])), f"{proc.label}: applied versions {seq}")
                v.expect(bool(seq) and seq[-1] == 3, f"{proc.label}: applied {seq}, expected to end at 3")
        v.done()

    @requirement("sync.version.visible")
    def test_the_applied_version_is_visible_before_push_returns(self, wb_runner):
        run = wb_runner.run("sync")
        v = Verdict("sync.version.visible", run)
        if v.processes_ok():
            pushed = {e["version"]: e["time"] for e in run.role("trainer")[0].of("pushed")}
            for proc in run.role("rollout"):
                applied = {e["version"]: e for e in proc.of("applied")}
                for e in applied.values():
                    v.expect(e["seen"] == e["version"],
                             f"{proc.label}: apply() returned {e['version']} but .version then read {e['seen']}")
                for ver, t in pushed.items():
                    e = applied.get(ver)
                    v.expect(e is not None and e["start"] <= t,
                             f"{proc.label}: push({ver}) returned before this unit applied version {ver}")
        v.done()

    @requirement("async.staleness.bound")
    def test_async_receivers_stay_within_the_staleness_bound(self, wb_runner):
        run = wb_runner.run("async")
        k = 1
        v = Verdict("async.staleness.bound", run)
        if v.processes_ok():
            for push in run.role("trainer")[0].of("pushed"):
                for proc in run.role("rollout"):
                    before = [e["version"] for e in proc.of("applied") if e["start"] <= push["time"]]
                    have = max(before, default=0)
                    v.expect(have >= push["version"] - k,
                             f"{proc.label}: had applied only version {have} when push({push['version']}) returned "
                             f"(max_staleness {k})")
        v.done()

    @requirement("async.failed-push.heals")
    def test_async_recovers_after_a_push_that_timed_out(self, wb_runner):
        run = wb_runner.run("async-heal")
        v = Verdict("async.failed-push.heals", run)
        if v.processes_ok():
            slow = run.role("rollout")[-1]
            held = slow.of("held")
            if not held:
                v.add(f"{slow.label}: never had a second version ready to apply")
            elif held[0]["released_by"] is None:
                v.add(f"{slow.label}: held version 2 unapplied, but trainer 0's push(3) neither failed nor returned "
                      f"within {3 * wb_runner.integ.timeout_s + 5:.0f}s")
            for proc in run.role("trainer"):
                ends = {e["version"]: e for e in proc.events if e["kind"] in ("pushed", "error")}
                e3 = ends.get(3)
                if e3 is None:
                    v.add(f"{proc.label}: push(3) never ended")
                elif e3["kind"] == "pushed":
                    v.add(f"{proc.label}: push(3) returned while {slow.label} had not applied version 2 "
                          "(max_staleness 1)")
                else:
                    v.expect(e3["typed"], f"{proc.label}: push(3) raised {e3['type']} (not a weightbridge BridgeError)")
                for ver in (4, 5):
                    e = ends.get(ver)
                    if e is None or e["kind"] != "pushed":
                        v.add(f"{proc.label}: push({ver}) after the failed push(3) "
                              + (f"raised {e['type']}: {e['message'][:300]}" if e else "never ran"))
            for proc in run.role("rollout"):
                seq = [e["version"] for e in proc.of("applied")]
                v.expect(bool(seq) and seq[-1] == 5 and 3 not in seq,
                         f"{proc.label}: applied {seq}, expected to end at 5 (never 3)")
                for e in proc.of("applied"):
                    bad = first_bad(e["bad"])
                    v.expect(not bad, f"{proc.label} version {e['version']}: {bad}")
        v.done()

    # -- faults ------------------------------------------------------------------------------
    def _killed(self, v: Verdict, run) -> bool:
        return v.expect(run.killed_at is not None,
                        "the suite's fault was never injected: pass **ctx.bridge_kwargs() (it carries the on_round "
                        "hook that kills the process mid-update) to TrainerBridge/RolloutBridge.from_spec")

    @requirement("fault.sender-dies.typed-error")
    def test_a_dead_sender_gives_every_survivor_a_typed_error_in_time(self, wb_runner):
        run = wb_runner.run("sender-dies")
        v = Verdict("fault.sender-dies.typed-error", run)
        n = wb_runner.integ.resolved.trainer.world_size
        victim = f"trainer {n - 1}"
        if self._killed(v, run) and v.processes_ok(allow=(victim,)):
            limit = wb_runner.integ.timeout_s + self.slack_s
            survivors = [p for p in run.procs if p.role == "trainer" and p.label.startswith("trainer ")
                         and "restarted" not in p.label and p.label != victim]
            for proc in survivors:
                typed_error_in_time(v, proc, run.killed_at, limit, f"{victim} died", version=2)
            for proc in run.role("rollout"):
                typed_error_in_time(v, proc, run.killed_at, limit, f"{victim} died")
        v.done()

    @requirement("fault.torn-state.safe")
    def test_an_interrupted_update_is_never_served(self, wb_runner):
        run = wb_runner.run("sender-dies")
        v = Verdict("fault.torn-state.safe", run)
        if self._killed(v, run):
            for proc in run.role("rollout"):
                states = proc.of("state")
                if not v.expect(bool(states), f"{proc.label}: no state recorded after the failure ({proc.describe()})"):
                    continue
                s = states[0]
                if s["torn"]:
                    v.expect(s["version"] is None, f"{proc.label}: torn but reports version {s['version']}")
                    v.expect(s["apply_raised"] == "TornModelError",
                             f"{proc.label}: torn, but apply() {'raised ' + s['apply_raised'] if s['apply_raised'] else 'returned'}"
                             " instead of raising TornModelError")
                elif v.expect(s["version"] is not None, f"{proc.label}: neither torn nor at any version"):
                    bad = first_bad(s["bad"])
                    v.expect(not bad, f"{proc.label}: not torn, reports version {s['version']}, but {bad}")
        v.done()

    @requirement("fault.torn-state.heals")
    def test_the_next_complete_push_heals_every_receiver(self, wb_runner):
        run = wb_runner.run("sender-dies")
        n = wb_runner.integ.resolved.trainer.world_size
        v = Verdict("fault.torn-state.heals", run)
        if self._killed(v, run) and v.processes_ok(allow=(f"trainer {n - 1}",)):
            for proc in run.role("rollout"):
                last = [e for e in proc.of("applied") if e["version"] == 3]
                if v.expect(bool(last), f"{proc.label}: never applied version 3 after the failure"):
                    bad = first_bad(last[0]["bad"])
                    v.expect(not bad, f"{proc.label} version 3: {bad}")
                final = proc.of("final")[-1]
                v.expect(not final["torn"] and final["version"] == 3, f"{proc.label}: ended {final}")
            if v.problems:  # what the ranks raised around push(3): the reason it never landed
                for proc in run.role("trainer") + run.role("rollout"):
                    for e in proc.of("error"):
                        what = f"push({e['version']})" if proc.role == "trainer" else "poll/apply"
                        v.add(f"{proc.label}: {what} raised {e['type']}: {e['message'][:400]}")
        v.done()

    @requirement("fault.receiver-dies.typed-error")
    def test_a_dead_receiver_gives_every_trainer_a_typed_error_in_time(self, wb_runner):
        run = wb_runner.run("receiver-dies")
        v = Verdict("fault.receiver-dies.typed-error", run)
        victim = run.role("rollout")[-1].label
        if self._killed(v, run) and v.processes_ok(allow=(victim,)):
            for proc in run.role("trainer"):
                typed_error_in_time(v, proc, run.killed_at, wb_runner.integ.timeout_s + self.slack_s, f"{victim} died",
                                    version=2)
        v.done()

    @requirement("fault.no-receiver.deadline")
    def test_a_push_nobody_receives_fails_in_time(self, wb_runner):
        run = wb_runner.run("no-receiver")
        v = Verdict("fault.no-receiver.deadline", run)
        if v.processes_ok():
            for proc in run.role("trainer"):
                started = proc.events[0]["start"] if proc.events else 0.0
                typed_error_in_time(v, proc, started, wb_runner.integ.timeout_s + self.slack_s, "push(1) started")
        v.done()

    # -- membership and handshake ------------------------------------------------------------
    @requirement("membership.late-joiner.receives")
    def test_a_late_instance_receives_a_later_push(self, wb_runner):
        r = wb_runner.integ.resolved
        v = Verdict("membership.late-joiner.receives")
        if not v.expect(r.rollout.num_instances >= 2,
                        f"the spec has {r.rollout.num_instances} rollout instance; this check needs >= 2 "
                        "(use instances: 2 in the spec, or declare the gap in known_gaps)"):
            v.done()
        run = wb_runner.run("late-joiner")
        v.run = run
        late = r.rollout.num_instances - 1
        if v.processes_ok():
            for proc in run.role("rollout"):
                seq = [e["version"] for e in proc.of("applied")]
                is_late = r.rollout.ranks[proc.ranks[0]].instance == late
                want_ok = bool(seq) and seq[-1] == 3 and (1 not in seq if is_late else seq[0] == 1)
                v.expect(want_ok, f"{proc.label} ({'late' if is_late else 'early'}): applied {seq}")
                for e in proc.of("applied"):
                    bad = first_bad(e["bad"])
                    v.expect(not bad, f"{proc.label} version {e['version']}: {bad}")
        v.done()

    @requirement("auth.unauthenticated-sender.refused")
    def test_a_trainer_without_the_job_secret_gets_nothing_applied(self, wb_runner):
        from weightbridge.testing.scenarios import IMPOSTOR_VERSION as BAD

        run = wb_runner.run("impostor")
        v = Verdict("auth.unauthenticated-sender.refused", run)
        if v.processes_ok():
            for proc in run.role("trainer"):
                impostor = proc.label.endswith("(no secret)")
                if impostor:
                    v.expect(not proc.of("pushed"), f"{proc.label}: push({BAD}) returned: rollout ranks acked a "
                             "trainer without the job secret")
                else:
                    v.expect(bool(proc.of("pushed")), f"{proc.label}: the real push(1) after the impostor "
                             + "; ".join(f"raised {e['type']}: {e['message'][:300]}" for e in proc.of("error")))
                for e in proc.of("error"):
                    v.expect(e["typed"], f"{proc.label}: raised {e['type']} (not a weightbridge BridgeError): "
                             f"{e['message'][:200]}")
            for proc in run.role("rollout"):
                seq = [e["version"] for e in proc.of("applied")]
                v.expect(BAD not in seq,
                         f"{proc.label}: applied version {BAD}, pushed by trainers without the job secret")
                v.expect(seq == [1], f"{proc.label}: applied {seq}, expected only the real trainers' version 1")
                for e in proc.of("applied"):
                    bad = first_bad(e["bad"])
                    v.expect(not bad, f"{proc.label} version {e['version']}: {bad}")
                for e in proc.of("error"):
                    v.expect(e["typed"], f"{proc.label}: raised {e['type']} (not a weightbridge BridgeError): "
                             f"{e['message'][:200]}")
        v.done()

    @requirement("handshake.mismatch.before-data")
    def test_a_spec_mismatch_fails_every_rank_before_data_moves(self, wb_runner):
        run = wb_runner.run("handshake")
        v = Verdict("handshake.mismatch.before-data", run)
        if v.processes_ok():
            for proc in run.procs:
                errors = proc.of("error")
                got = errors[0]["type"] if errors else "no error"
                said = f" ({errors[0]['message'][:300]})" if errors and got != "HandshakeMismatch" else ""
                v.expect(got == "HandshakeMismatch", f"{proc.label}: {got}{said}, expected HandshakeMismatch")
                if proc.role == "rollout":
                    applied = [e["version"] for e in proc.of("applied")]
                    v.expect(not applied, f"{proc.label}: applied versions {applied} despite the mismatch")
                    for ev in proc.of("unchanged"):
                        bad = first_bad(ev["bad"])
                        v.expect(not bad, f"{proc.label}: live weights changed although the handshake failed: {bad}")
        v.done()


try:  # pytest >= 7: a typed stash key for the per-class runner cache
    RUNNERS = pytest.StashKey[dict]()
except AttributeError:  # pragma: no cover
    RUNNERS = "weightbridge_runners"
