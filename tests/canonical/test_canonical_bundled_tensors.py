"""The shipped canonical lists of the bundled configs (weightbridge/canonical/bundled_tensors.py).

Each equals what transformers builds for its config today (so a spec resolves them without
transformers or a cache), the compact form round-trips any sorted list, and a dtype other than
the one shipped still goes through transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightbridge.canonical import bundled_config_path, bundled_names, from_hf_config, load_canonical
from weightbridge.canonical.naming import sort_tensors
from weightbridge.canonical.params import params_from_names
from weightbridge.canonical.bundled_tensors import decode, encode, installed_transformers, shipped_path, shipped_tensors
from weightbridge.layout.ir import CanonicalTensor


def _shipped_versions(name: str) -> dict:
    return json.loads(shipped_path(name).read_text())["versions"]


@pytest.mark.parametrize("name", bundled_names())
def test_the_shipped_list_is_what_transformers_builds(name: str) -> None:
    """For the installed transformers: the list shipped for it is what it builds (CI: phase 1's
    latest release and phase 2's, the version vLLM pins); a version with none builds it."""
    built = from_hf_config(bundled_config_path(name), use_cache=False)
    version = installed_transformers()
    entry = _shipped_versions(name).get(version)
    if entry is None:
        assert shipped_tensors(name, built.tensors[0].dtype) is None
        pytest.skip(f"no list shipped for transformers {version}: "
                    f"python -m weightbridge.canonical.bundled_tensors --write {name}")
    found = shipped_tensors(name, entry["dtype"])
    assert found is not None and found[0] == built.tensors and found[1] == params_from_names(built.tensors)
    loaded = load_canonical({"bundled": name})
    assert loaded.tensors == built.tensors and loaded.params == built.params
    assert loaded.source == f"bundled:{name}"


def test_a_list_is_used_only_under_the_transformers_version_it_was_built_with(monkeypatch) -> None:
    from weightbridge.canonical import bundled_tensors

    shipped = _shipped_versions("deepseek-v3")
    assert len(shipped) >= 2  # the router weight's dtype differs between them (5.19: bf16, 5.24+: fp32)
    router = {v: [g for g in e["groups"] if g[0] == "model.layers.#.mlp.gate.weight"][0][2] for v, e in shipped.items()}
    assert set(router.values()) == {"bfloat16", "float32"}
    for version in shipped:
        monkeypatch.setattr(bundled_tensors, "installed_transformers", lambda v=version: v)
        tensors, _ = shipped_tensors("deepseek-v3", "bfloat16")
        assert dict((t.name, t.dtype) for t in tensors)["model.layers.3.mlp.gate.weight"] == router[version]
    monkeypatch.setattr(bundled_tensors, "installed_transformers", lambda: "0.0.1")
    assert shipped_tensors("deepseek-v3", "bfloat16") is None


def test_another_dtype_goes_through_transformers() -> None:
    fp32 = load_canonical({"bundled": "tiny-qwen3-moe", "dtype": "float32"})
    assert fp32.tensors == from_hf_config(bundled_config_path("tiny-qwen3-moe"), "float32", use_cache=False).tensors
    assert {t.dtype for t in fp32.tensors} == {"float32"}
    assert {t.dtype for t in load_canonical({"bundled": "tiny-qwen3-moe"}).tensors} == {"bfloat16"}


def test_a_bundled_model_resolves_without_importing_transformers(tmp_path) -> None:
    if installed_transformers() not in _shipped_versions("deepseek-v3"):
        pytest.skip(f"no list shipped for transformers {installed_transformers()}")
    code = ("import sys; from weightbridge.canonical import load_canonical; "
            "m = load_canonical({'bundled': 'deepseek-v3'}); "
            "print(len(m.tensors), 'transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={"WEIGHTBRIDGE_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["45395", "False", "False"], out.stderr[-2000:]


_names = st.lists(
    st.tuples(st.sampled_from(["model.layers.#.mlp.experts.#.w", "model.layers.#.attn.q", "lm_head.weight",
                               "blk#_x#y.#"]),
              st.lists(st.integers(0, 300), min_size=3, max_size=3),
              st.sampled_from([(4, 4), (8,), ()]), st.sampled_from(["bfloat16", "float32"])),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_names)
def test_the_compact_form_round_trips_a_sorted_list(rows) -> None:
    tensors = {}
    for skel, nums, shape, dtype in rows:
        parts = skel.split("#")
        name = parts[0] + "".join(f"{n}{lit}" for n, lit in zip(nums, parts[1:]))
        tensors[name] = CanonicalTensor(name, shape, dtype)
    ordered = sort_tensors(tensors.values())
    assert decode(encode(ordered)) == ordered


def test_a_full_grid_is_stored_as_ranges() -> None:
    grid = sort_tensors(CanonicalTensor(f"model.layers.{l}.mlp.experts.{e}.w", (2, 2), "bfloat16")
                        for l in range(3, 61) for e in range(256))
    groups = encode(grid)
    assert groups == [["model.layers.#.mlp.experts.#.w", [2, 2], "bfloat16", {"ranges": [[3, 61], [0, 256]]}]]
    assert decode(groups) == grid
