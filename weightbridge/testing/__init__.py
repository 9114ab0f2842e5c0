"""The conformance suite for integrations: a pytest plugin, one base class, a few fixtures.

Use (an integration's ``tests/test_weightbridge_conformance.py``)::

    from weightbridge.testing import ConformanceSuite

    class TestMyIntegration(ConformanceSuite):
        known_gaps = {}          # {requirement id: reason} -> strict xfail (never a skip)

and in the same directory's ``conftest.py``::

    import pytest, my_conformance           # a module of yours (not conftest.py)

    @pytest.fixture
    def wb_spec():                          # path of the integration's spec (YAML)
        return Path(__file__).parent / "weightbridge.yaml"

    @pytest.fixture
    def wb_trainer():                       # (ctx: RankContext) -> TrainerRank
        return my_conformance.build_trainer

    @pytest.fixture
    def wb_rollout():                       # (ctx: RankContext) -> RolloutUnit
        return my_conformance.build_rollout

    @pytest.fixture
    def wb_rollout_scope():                 # optional: "rank" (default) or "instance"
        return "rank"

Run ``python -m pytest path/to/test_weightbridge_conformance.py --wb-report=report.json``.

The fixture contract (precisely):

* ``wb_spec`` -> ``str | Path``: the integration's spec. For each scenario the suite writes a
  copy with its own ``sync`` section (mode, ``timeout_s``, ``heartbeat_s``, ``round_bytes``,
  ``min_instances``, ``transport: gloo``; relative model paths made absolute) and hands its path to the factories as ``ctx.spec_path``.
* ``wb_trainer`` / ``wb_rollout`` -> a module-level callable, or ``"module:name"``. It is
  imported and called **inside a fresh rank process** (never in the pytest process) with a
  :class:`RankContext` ``ctx``. It must build the side, connect its bridge with
  ``from_spec(ctx.spec_path, rank=..., tensors=..., **ctx.bridge_kwargs())`` and return:

  - trainer (once per trainer rank ``ctx.rank``): a :class:`TrainerRank` -
    ``tensors()`` (live local tensors by spec name), ``load_weights(iterable of (HF name,
    full tensor))`` (its own loader: the suite sets the weights of each version with it and
    probes it), ``push(version)``, ``close()``;
  - rollout (once per rollout rank, or once per instance with scope ``"instance"``; then
    ``ctx.ranks`` lists the instance's ranks): a :class:`RolloutUnit` - ``poll()``,
    ``apply()``, ``version``, ``torn``, ``tensors(rank)`` (read back rank ``rank``'s live
    weights as CPU tensors, by spec name), ``close()``; and for the probe check one of
    ``probe_layout(rank)`` (a ``RankLayout`` or its JSON, e.g. from
    ``weightbridge.probe.probe_loader`` run where the engine lives) or
    ``load_weights(weights, rank)`` (the engine's own loader; destinations ``tensors(rank)``).

  ``ctx.bridge_kwargs()`` must reach ``from_spec`` unchanged: it points the bridge at the
  suite's control store (hosted by the pytest process, so any rank may be killed) and carries
  ``options`` (a :class:`~weightbridge.bridge.BridgeOptions`: the suite's key prefix and the
  ``on_round`` hook the fault scenarios use). Rollout kwargs are picklable, so an engine
  that runs its ranks in worker processes it starts itself can forward them there; over an
  engine's RPC or HTTP routes send the hook by name instead (weightbridge's vLLM and SGLang
  integrations do: ``FaultHook.hook_name``, ``weightbridge.integrations._engine.hooks``).
  ``ctx.init_process_group()`` starts the side's own Gloo world if the framework needs one.
  Every rank process finds the run's job secret in ``WEIGHTBRIDGE_SECRET``; the ``impostor``
  scenario runs the trainer factory in processes given another one, so a side must take the
  secret from there (or the spec's ``sync.secret_file``), not from ``BridgeOptions(secret=...)``.

Every requirement is listed in :data:`REQUIREMENTS` (``weightbridge.testing.requirements``);
``integration_guides/README.md`` explains how to read failures.

This package is the public suite only: :data:`__all__` is its surface (tested), plus the modules
it is made of (``plugin``, ``suite``, ``contract``, ``requirements``, ``scenarios``, ``ranks``,
``verdict``). :func:`launch` (fresh local processes under a hard deadline, what the suite starts
every rank with) is re-exported from :mod:`weightbridge.localrun`. weightbridge's own harnesses
live in ``weightbridge.testing._internal`` (private: no promise). Names load on first use, so
``import weightbridge.testing`` imports neither pytest nor torch; ``ConformanceSuite`` needs pytest.
"""

from __future__ import annotations

from weightbridge._lazy import lazy_exports

_EXPORTS = {
    "ConformanceSuite": "weightbridge.testing.suite",
    "RankContext": "weightbridge.testing.contract",
    "RolloutUnit": "weightbridge.testing.contract",
    "TrainerRank": "weightbridge.testing.contract",
    "REQUIREMENTS": "weightbridge.testing.requirements",
    "Requirement": "weightbridge.testing.requirements",
    "coverage_problems": "weightbridge.testing.requirements",
    "requirement": "weightbridge.testing.requirements",
    "RankResult": "weightbridge.localrun",
    "launch": "weightbridge.localrun",
}

__all__ = [
    "ConformanceSuite",
    "REQUIREMENTS",
    "RankContext",
    "RankResult",
    "Requirement",
    "RolloutUnit",
    "TrainerRank",
    "coverage_problems",
    "launch",
    "requirement",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
