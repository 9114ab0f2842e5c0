"""Rule expressions and name templates."""

from __future__ import annotations

import pytest

from weightbridge.layout.expr import ExprError, evaluate, evaluate_int
from weightbridge.layout.templates import CanonicalPattern, NameIndex, TemplateError, fill, skeleton


def test_expressions() -> None:
    names = {"tp": 4, "pp": 2, "vocab_multiple": 128, "tie_word_embeddings": True}
    assert evaluate_int("vocab_multiple * tp", names) == 512
    assert evaluate("tie_word_embeddings and pp > 1", names) is True
    assert evaluate("not tie_word_embeddings or tp == 4", names) is True
    assert evaluate_int(7, names) == 7
    with pytest.raises(ExprError, match="unknown name 'tq'"):
        evaluate("tq * 2", names)
    with pytest.raises(ExprError, match="unsupported"):
        evaluate("__import__('os')", names)
    with pytest.raises(ExprError, match="not an integer"):
        evaluate_int("pp > 1", names)


def test_skeleton_and_binding() -> None:
    assert skeleton("model.layers.12.mlp.experts.3.up_proj.weight") == ("model.layers.#.mlp.experts.#.up_proj.weight", (12, 3))
    pat = CanonicalPattern.compile("model.layers.{layer}.mlp.experts.{expert}.up_proj.weight")
    idx = NameIndex(["model.layers.12.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.up_proj.weight"])
    assert idx.match(pat) == [("model.layers.12.mlp.experts.3.up_proj.weight", {"layer": 12, "expert": 3})]
    lit = CanonicalPattern.compile("decoder.layers.{layer}.mlp.linear_fc1.weight")
    assert lit.bind((4, 1)) == {"layer": 4} and lit.bind((4, 2)) is None
    assert fill("decoder.layers.{local_layer}.mlp.experts.linear_fc1.weight{local_expert}", {"local_layer": 0, "local_expert": 7}) == (
        "decoder.layers.0.mlp.experts.linear_fc1.weight7"
    )


def test_template_errors() -> None:
    with pytest.raises(TemplateError, match="unknown variable"):
        CanonicalPattern.compile("model.layers.{lyr}.x")
    with pytest.raises(TemplateError, match="whole template"):
        CanonicalPattern.compile("model.{*}")
    with pytest.raises(TemplateError, match="no value"):
        fill("a.{expert}", {})
