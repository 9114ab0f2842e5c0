"""from_safetensors: header-only parsing, index files, params from config or names."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from weightbridge.canonical import CanonicalSourceError, from_safetensors
from weightbridge.canonical.safetensors_header import read_header


def _write_header_only(path: Path, header: dict) -> None:
    """A safetensors file whose data section is missing: only the header is valid."""
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


def _entry(dtype: str, shape: list[int]) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}


def test_reads_headers_only(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    _write_header_only(
        f,
        {
            "__metadata__": {"format": "pt"},
            "model.layers.10.mlp.experts.3.w.weight": _entry("F8_E4M3", [4096, 7168]),
            "model.layers.2.mlp.experts.11.w.weight_scale_inv": _entry("F32", [32, 56]),
            "model.embed_tokens.weight": _entry("BF16", [129280, 7168]),
        },
    )
    m = from_safetensors(f)
    assert [t.name for t in m.tensors] == [
        "model.embed_tokens.weight",
        "model.layers.2.mlp.experts.11.w.weight_scale_inv",
        "model.layers.10.mlp.experts.3.w.weight",
    ]
    assert m["model.layers.10.mlp.experts.3.w.weight"].dtype == "float8_e4m3fn"
    assert m["model.layers.2.mlp.experts.11.w.weight_scale_inv"].dtype == "float32"
    p = m.param_dict
    assert (p["num_layers"], p["num_experts"], p["first_k_dense"]) == (11, 12, 2)
    assert (p["vocab_size"], p["hidden_size"], p["tie_word_embeddings"]) == (129280, 7168, True)
    assert m.source == f"safetensors:{f}"


def test_real_file_and_dtypes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from weightbridge.tensors import dtype_name

    tensors = {
        "a.weight": torch.zeros(2, 3, dtype=torch.bfloat16),
        "b": torch.zeros(4, dtype=torch.float32),
        "c": torch.zeros(1, 2, 3, dtype=torch.float16),
        "d": torch.zeros(5, dtype=torch.int64),
        "e": torch.zeros(2, dtype=torch.float8_e4m3fn),
    }
    save_file(tensors, tmp_path / "x.safetensors")
    m = from_safetensors(tmp_path / "x.safetensors")
    got = {t.name: (t.shape, t.dtype) for t in m}
    assert got == {k: (tuple(v.shape), dtype_name(v.dtype)) for k, v in tensors.items()}
    assert read_header(tmp_path / "x.safetensors")[0].name in tensors


def test_index_and_directory(tmp_path: Path) -> None:
    _write_header_only(tmp_path / "s1.safetensors", {"model.layers.0.x.weight": _entry("BF16", [8, 8])})
    _write_header_only(
        tmp_path / "s2.safetensors",
        {"model.layers.1.x.weight": _entry("BF16", [8, 8]), "lm_head.weight": _entry("BF16", [16, 8])},
    )
    index = {
        "metadata": {},
        "weight_map": {
            "model.layers.0.x.weight": "s1.safetensors",
            "model.layers.1.x.weight": "s2.safetensors",
            "lm_head.weight": "s2.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2})
    )
    via_dir = from_safetensors(tmp_path)
    via_index = from_safetensors(tmp_path / "model.safetensors.index.json")
    assert via_dir.tensors == via_index.tensors and len(via_dir) == 3
    p = via_dir.param_dict
    assert (p["model_type"], p["head_dim"], p["num_kv_heads"], p["num_experts"]) == ("llama", 4, 2, 0)

    index["weight_map"]["model.norm.weight"] = "s2.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CanonicalSourceError, match="in no shard header"):
        from_safetensors(tmp_path)
    index["weight_map"]["model.norm.weight"] = "s3.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CanonicalSourceError, match="shard listed .* is missing"):
        from_safetensors(tmp_path)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(CanonicalSourceError, match="no such file") as err:
        from_safetensors(tmp_path / "nope")
    assert err.value.key == "safetensors" and str(err.value).startswith("model.safetensors:")
    with pytest.raises(CanonicalSourceError, match="no model.safetensors.index.json"):
        from_safetensors(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x02")
    with pytest.raises(CanonicalSourceError, match="too short"):
        from_safetensors(bad)
    bad.write_bytes(struct.pack("<Q", 10) + b"{}")
    with pytest.raises(CanonicalSourceError, match="truncated"):
        from_safetensors(bad)
    _write_header_only(bad, {"x": _entry("C64", [1])})
    with pytest.raises(CanonicalSourceError, match="unsupported dtype"):
        from_safetensors(bad)
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(CanonicalSourceError, match="implausible"):
        from_safetensors(bad)
