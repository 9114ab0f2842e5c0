"""Random bytes, text and nested structures fed to spec loading (what every CLI command uses).

``check_text`` never raises, and ``resolve_spec`` on a file either succeeds or raises the
library's typed :class:`~weightbridge.spec.errors.SpecErrors`; each example within a deadline.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightbridge.spec.errors import SpecErrors, SpecProblem
from weightbridge.spec.resolve import check_text, resolve_spec
from weightbridge.spec.sides import MAX_WORLD

ROOT = Path(__file__).resolve().parents[2]
VALID = {
    "version": 1,
    "model": {"bundled": "tiny-qwen2"},
    "trainer": {"preset": "fsdp2", "mesh": {"dp": 2}},
    "rollout": {"preset": "vllm", "instances": 2, "mesh": {"tp": 2}},
    "sync": {"mode": "sync", "round_bytes": "64MiB"},
}
FUZZ = settings(  # WB_FUZZ_EXAMPLES=5000 for a longer hunt
    max_examples=int(os.environ.get("WB_FUZZ_EXAMPLES", "60")),
    deadline=timedelta(seconds=20),
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["tp", "dp", "ep", "pp", "vllm", "fsdp2", "hf", "none", "tiny-qwen2", "64MiB", "bfloat16",
                     "model.layers.{layer}.mlp.down_proj.weight", "{layer}", "num_layers", "*", "", "1e400"]),
)
nested = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=12) | st.sampled_from(
        ["preset", "mesh", "rules", "local", "canonical", "shard", "axis", "dim", "tensors", "name", "shape",
         "dtype", "params", "instances", "pipeline", "layers", "pins", "round_bytes", "network"]), inner, max_size=6)),
    max_leaves=40,
)
tokens = st.lists(
    st.sampled_from(["[", "]", "{", "}", ":", ": ", "- ", ",", "&a ", "*a", "&b ", "*b", "\n", "  ", "a", "1",
                     "'", '"', "!!int ", "!!binary ", "!!timestamp ", "? ", "|\n", ">\n", "#", "%YAML 1.1\n", "---\n",
                     "...\n", "\t", "\x00", "\ufeff", "version: 1\n", "model:", "2001-13-45", "9" * 5000]),
    max_size=80,
).map("".join)


def _assert_problems(problems: list[SpecProblem]) -> None:
    for p in problems:
        assert isinstance(p, SpecProblem) and p.path.startswith("$")
        assert len(str(p)) < 4000


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes_file(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_bytes(data)
    try:
        resolve_spec(path)
    except SpecErrors as exc:
        _assert_problems(exc.problems)


@FUZZ
@given(st.one_of(st.text(max_size=2000), tokens))
def test_random_text(text: str) -> None:
    resolved, problems = check_text(text, "fuzz.yaml")
    assert (resolved is None) == bool(problems)
    _assert_problems(problems)


@FUZZ
@given(nested, st.sampled_from([(), ("model",), ("trainer",), ("rollout",), ("sync",), ("network",),
                                ("trainer", "mesh"), ("rollout", "rules"), ("trainer", "rules"),
                                ("model", "tensors"), ("model", "params"), ("rollout", "pipeline")]))
def test_random_structures_in_a_spec(value: object, where: tuple[str, ...]) -> None:
    import copy

    doc: object = copy.deepcopy(VALID)
    if where:
        node = doc
        for key in where[:-1]:
            node = node[key]  # type: ignore[index]
        node[where[-1]] = value  # type: ignore[index]
    else:
        doc = value
    text = yaml.safe_dump(doc, allow_unicode=True)
    resolved, problems = check_text(text, "fuzz.yaml", base_dir=ROOT)
    assert (resolved is None) == bool(problems)
    _assert_problems(problems)


# Small valid sizes, and any integer outside them (negative, or above the per-side world cap: refused
# before expansion). A valid world of thousands of ranks is no hostile-input case but a scale one:
# its expansion time is measured by bench/plan_scale.py, not by a fuzz deadline on a shared machine.
sizes = st.one_of(st.integers(min_value=-3, max_value=16), st.integers(max_value=-1),
                  st.integers(min_value=MAX_WORLD + 1), st.sampled_from([0, 10**9, 10**40, "2", 2.5]))


@pytest.mark.slow
@FUZZ
@given(sizes, sizes, sizes, sizes, st.one_of(sizes, st.text(max_size=12), st.sampled_from(["1", "4KiB", "0B"])))
def test_random_sizes_in_a_spec(dp: object, tp: object, instances: object, ep: object, round_bytes: object) -> None:
    import copy

    doc = copy.deepcopy(VALID)
    doc["trainer"]["mesh"] = {"dp": dp}
    doc["rollout"].update({"instances": instances, "mesh": {"tp": tp, "ep": ep}})
    doc["sync"]["round_bytes"] = round_bytes
    resolved, problems = check_text(yaml.safe_dump(doc), "fuzz.yaml")
    assert (resolved is None) == bool(problems)
    _assert_problems(problems)
