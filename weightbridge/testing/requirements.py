"""The conformance requirements: stable ids, one-line behaviours, and what to check when one fails.

Pure data (no torch). Ids are ``area.subject.property`` in lower case with dashes; an id never
changes meaning once published: a changed behaviour gets a new id and the old one is retired.
Every requirement has exactly one test in :class:`weightbridge.testing.ConformanceSuite`, and every
test there names one requirement (checked by :func:`coverage_problems`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

ID_PATTERN = re.compile(r"^[a-z]+(\.[a-z0-9]+(-[a-z0-9]+)*){2}$")


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """One behaviour an integration must show. ``scenario`` names the run that gives the evidence."""

    id: str
    behavior: str  # one sentence, present tense
    scenario: str  # "parent" (no process) or the multiprocess scenario (weightbridge.testing.scenarios)
    hint: str  # the first thing to check in the integration when the requirement fails

    def __post_init__(self) -> None:
        if not ID_PATTERN.match(self.id):
            raise ValueError(f"requirement id {self.id!r} is not area.subject.property (lower case, dashes)")
        if not self.behavior.endswith(".") or "\n" in self.behavior:
            raise ValueError(f"{self.id}: behavior must be one sentence ending with '.'")


def _r(id: str, scenario: str, behavior: str, hint: str) -> Requirement:
    return Requirement(id=id, scenario=scenario, behavior=behavior, hint=hint)


_ALL = (
    _r("spec.resolve.clean", "parent",
       "The integration's spec validates and resolves with no problem.",
       "run `weightbridge validate SPEC`; every problem is printed as file:line: $.path: message (hint)"),
    _r("layout.cover.exact", "parent",
       "The transfer plan for the spec delivers every element each rollout rank needs exactly once.",
       "run `weightbridge plan SPEC`; an uncovered element means the trainer layout lacks a canonical tensor"),
    _r("layout.trainer.tensors-match", "layout",
       "Every trainer rank holds the local tensors the spec names, with the spec's shapes and dtypes.",
       "compare TrainerRank.tensors() with `weightbridge explain SPEC --side trainer --rank R`"),
    _r("layout.rollout.tensors-match", "layout",
       "Every rollout rank holds the local tensors the spec names, with the spec's shapes and dtypes.",
       "compare RolloutUnit.tensors(rank) with `weightbridge explain SPEC --side rollout --rank R`"),
    _r("layout.trainer.probe-agrees", "layout",
       "Probing each trainer rank's own load_weights yields exactly the spec's trainer layout.",
       "the spec's trainer rules or the trainer's loader are wrong; `weightbridge diff` shows which pieces"),
    _r("layout.rollout.probe-agrees", "layout",
       "Probing each rollout rank's own load_weights yields exactly the spec's rollout layout.",
       "the spec's rollout rules or the engine's loader are wrong; `weightbridge diff` shows which pieces"),
    _r("sync.push.bitwise", "sync",
       "In sync mode every version a rollout rank applies equals the trainer's weights of that version bitwise.",
       "tensors(rank) must return the live tensors given to RolloutBridge (not copies)"),
    _r("sync.version.monotonic", "sync",
       "The versions each rollout rank applies strictly increase and end at the last version pushed.",
       "call apply() only after poll() returned True, and return its value"),
    _r("sync.version.visible", "sync",
       "Right after apply() returns v the rollout reports version v, and in sync mode before push(v) returns.",
       "RolloutUnit.version must read RolloutBridge.version (the engine's own counter may lag)"),
    _r("sync.refit.later-bitwise", "sync",
       "Every update a rollout rank applies after its first one (the second refit and each later one) equals the "
       "trainer's weights of that version bitwise.",
       "an engine that post-processes what it loads (quantises, prepacks, fuses, keeps derived copies) must redo it "
       "from the received checkpoint-format tensors on every update, not only on the first"),
    _r("async.push.bitwise", "async",
       "In async mode every version a rollout rank applies equals the trainer's weights of that version bitwise.",
       "with staging, apply() copies the staged version into the live tensors: read those back"),
    _r("async.staleness.bound", "async",
       "In async mode, when push(v) returns, every rollout rank has applied at least v - max_staleness.",
       "apply() must ack through RolloutBridge.apply(); do not bypass the bridge when making weights live"),
    _r("delta.push.bitwise", "delta",
       "With sync.delta on, every version a rollout rank applies equals the trainer's weights of that version "
       "bitwise, while each push changes few elements and travels as deltas.",
       "the receive tensors must be written only by the bridge between pushes (deltas apply onto them): an engine "
       "that rewrites, re-allocates or casts them gets DeltaBaseMismatch or wrong weights"),
    _r("async.failed-push.heals", "async-heal",
       "In async mode, after a push fails because a receiver applied too slowly, the next pushes succeed bitwise.",
       "keep calling push() after a typed error (never remember it and re-raise), and keep poll()/apply() going"),
    _r("fault.sender-dies.typed-error", "sender-dies",
       "A trainer rank killed mid-push makes every surviving rank raise a typed BridgeError within the deadline.",
       "let BridgeError subclasses propagate from push() and poll(); do not catch and retry them"),
    _r("fault.receiver-dies.typed-error", "receiver-dies",
       "A rollout rank killed mid-receive makes every trainer's push raise a typed BridgeError within the deadline.",
       "let BridgeError subclasses propagate from push()"),
    _r("fault.no-receiver.deadline", "no-receiver",
       "A push that no rollout instance joins raises a typed BridgeError within the deadline instead of hanging.",
       "do not retry push() on DeadlineExceeded; open the bridge from ctx.spec_path (it holds the suite's timeout_s)"),
    _r("fault.torn-state.safe", "sender-dies",
       "After an interrupted update a rollout rank reports either a version whose weights match it bitwise or torn.",
       "RolloutUnit.torn and .version must read the bridge's; apply() must raise TornModelError while torn"),
    _r("fault.torn-state.heals", "sender-dies",
       "The next complete push after an interrupted update lands bitwise on every rollout rank and clears torn.",
       "keep polling after an error: the bridge stays usable for the next push"),
    _r("membership.late-joiner.receives", "late-joiner",
       "A rollout instance that starts after the first push receives a later push bitwise.",
       "connect the RolloutBridge whenever the engine starts; never require the trainer to wait for it"),
    _r("auth.unauthenticated-sender.refused", "impostor",
       "A trainer process without the job secret gets no version applied, and the next genuine push lands bitwise.",
       "the suite gives the impostor processes another WEIGHTBRIDGE_SECRET: take the job secret from it (or "
       "sync.secret_file), not from BridgeOptions(secret=...) fed by code or a file of your own; keep sync.auth "
       "required"),
    _r("handshake.mismatch.before-data", "handshake",
       "A rank with a different spec makes every rank raise HandshakeMismatch before any weight changes.",
       "every rank must build its bridge from ctx.spec_path (the same spec everywhere)"),
)

REQUIREMENTS: dict[str, Requirement] = {r.id: r for r in _ALL}


def requirement(req_id: str):
    """Decorator: the test checks requirement ``req_id`` (which must be in :data:`REQUIREMENTS`)."""
    if req_id not in REQUIREMENTS:
        raise KeyError(f"unknown requirement id {req_id!r}; add it to weightbridge/testing/requirements.py first")

    def mark(fn):
        fn.wb_requirement = req_id
        return fn

    return mark


def requirement_of(obj: object) -> str | None:
    """The requirement id a test function (or pytest item's function) names, or None."""
    return getattr(obj, "wb_requirement", None)


def coverage_problems(test_functions: Iterable[tuple[str, object]]) -> list[str]:
    """Both directions: every requirement has exactly one test, every test names a known requirement."""
    problems: list[str] = []
    tested: dict[str, list[str]] = {}
    for name, fn in test_functions:
        req = requirement_of(fn)
        if req is None:
            problems.append(f"test {name} names no requirement (decorate it with @requirement(ID))")
        elif req not in REQUIREMENTS:
            problems.append(f"test {name} names unknown requirement {req!r}")
        else:
            tested.setdefault(req, []).append(name)
    for req in REQUIREMENTS:
        if req not in tested:
            problems.append(f"requirement {req} has no test")
        elif len(tested[req]) > 1:
            problems.append(f"requirement {req} has {len(tested[req])} tests: {', '.join(tested[req])}")
    return problems


def check_known_gaps(gaps: dict[str, str]) -> list[str]:
    """Problems with a ``known_gaps`` declaration (unknown ids, empty reasons)."""
    out = []
    for req, reason in gaps.items():
        if req not in REQUIREMENTS:
            out.append(f"known_gaps names unknown requirement {req!r} (known: see weightbridge.testing.REQUIREMENTS)")
        if not isinstance(reason, str) or not reason.strip():
            out.append(f"known_gaps[{req!r}] needs a reason (a non-empty string)")
    return out
