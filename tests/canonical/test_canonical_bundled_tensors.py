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
from weightbridge.canonical.bundled_tensors import decode, encode, shipped_path, shipped_tensors
from weightbridge.layout.ir import CanonicalTensor


@pytest.mark.parametrize("name", bundled_names())
def test_the_shipped_list_is_what_transformers_builds(name: str) -> None:
    built = from_hf_config(bundled_config_path(name), use_cache=False)
    assert shipped_path(name).is_file(), "python -m weightbridge.canonical.bundled_tensors --write NAME"
    loaded = load_canonical({"bundled": name})
    assert loaded.tensors == built.tensors
    assert loaded.params == built.params
    assert loaded.source == f"bundled:{name}"
    found = shipped_tensors(name, json.loads(shipped_path(name).read_text())["dtype"])
    assert found is not None and found[1] == params_from_names(built.tensors)


def test_another_dtype_goes_through_transformers() -> None:
    fp32 = load_canonical({"bundled": "tiny-qwen3-moe", "dtype": "float32"})
    assert fp32.tensors == from_hf_config(bundled_config_path("tiny-qwen3-moe"), "float32", use_cache=False).tensors
    assert {t.dtype for t in fp32.tensors} == {"float32"}
    assert {t.dtype for t in load_canonical({"bundled": "tiny-qwen3-moe"}).tensors} == {"bfloat16"}


def test_a_bundled_model_resolves_without_importing_transformers(tmp_path) -> None:
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
