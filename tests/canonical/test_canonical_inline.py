"""from_inline: validation and name-based param inference."""

from __future__ import annotations

import pytest

from weightbridge.canonical import CanonicalSourceError, from_inline


def test_inline_infers_params() -> None:
    tensors = [
        {"name": "model.layers.10.mlp.experts.3.up_proj.weight", "shape": [32, 64], "dtype": "bf16"},
        {"name": "model.layers.0.mlp.up_proj.weight", "shape": [128, 64], "dtype": "bfloat16"},
        {"name": "model.layers.1.mlp.experts.7.up_proj.weight", "shape": [32, 64], "dtype": "BF16"},
        {"name": "model.embed_tokens.weight", "shape": [256, 64], "dtype": "torch.bfloat16"},
        {"name": "lm_head.weight", "shape": [256, 64], "dtype": "bf16"},
    ]
    m = from_inline(tensors)
    assert [t.name for t in m] == [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.1.mlp.experts.7.up_proj.weight",
        "model.layers.10.mlp.experts.3.up_proj.weight",
    ]
    assert {t.dtype for t in m} == {"bfloat16"}
    assert m.param_dict == {
        "num_layers": 11,
        "num_experts": 8,
        "first_k_dense": 1,
        "vocab_size": 256,
        "hidden_size": 64,
        "tie_word_embeddings": False,
    }
    assert m.source == "inline"
    m2 = from_inline(tensors, {"num_experts": 16, "model_type": "custom"})
    assert m2.param_dict["num_experts"] == 16 and m2.param_dict["model_type"] == "custom"


def test_fused_experts_and_dense() -> None:
    m = from_inline(
        [
            {"name": "model.layers.0.mlp.experts.gate_up_proj", "shape": [4, 64, 32], "dtype": "bf16"},
            {"name": "w", "shape": [], "dtype": "fp32"},
        ]
    )
    assert m.param_dict == {"num_layers": 1, "num_experts": 4, "first_k_dense": 0}
    assert from_inline([{"name": "w", "shape": [3], "dtype": "fp32"}]).param_dict == {"num_experts": 0}


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        ([], "is empty"),
        ("x", "must be a list"),
        ([{"name": "a", "shape": [1], "dtype": "bf17"}], r"\[0\]\.dtype: unknown dtype 'bf17'"),
        ([{"name": "a", "shape": [-1], "dtype": "bf16"}], r"\[0\]\.shape"),
        ([{"name": "a", "shape": [True], "dtype": "bf16"}], r"\[0\]\.shape"),
        ([{"name": "", "shape": [1], "dtype": "bf16"}], r"\[0\]\.name"),
        ([{"name": "a", "shape": [1], "dtype": "bf16", "x": 1}], "unknown key"),
        ([{"name": "a", "shape": [1], "dtype": "bf16"}, {"name": "a", "shape": [1], "dtype": "bf16"}], "duplicate"),
        ([3], "expected a mapping"),
    ],
)
def test_inline_errors(tensors: object, match: str) -> None:
    with pytest.raises(CanonicalSourceError, match=match) as err:
        from_inline(tensors)  # type: ignore[arg-type]
    assert err.value.key == "tensors"
