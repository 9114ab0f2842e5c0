"""``weightbridge probe`` and ``weightbridge diff`` (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from weightbridge.cli.main import main
from weightbridge.layout.ir import layout_hash, RankLayout
from weightbridge.probe.dtensor import layout_from_dtensors
from weightbridge.spec.resolve import resolve_spec
from weightbridge.tensors import canonical_tensors

SPEC = """\
version: 1
model:
  bundled: tiny-qwen2
trainer:
  preset: fsdp2
  mesh: {dp: 2}
rollout:
  preset: vllm
  mesh: {tp: 2}
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("spec") / "spec.yaml"
    p.write_text(SPEC)
    return p


def test_probe_then_diff(spec: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "probe1.json"
    loader = "tests.probe._zoo:vllm_factory"
    rc = main(["probe", str(spec), "--loader", loader, "--rank", "1", "-o", str(out), "--check"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "identical to" in text
    obj = json.loads(out.read_text())
    assert obj["hash"] == layout_hash([RankLayout.from_json(obj["layout"])]) and obj["verified"]
    assert main(["diff", f"{spec}:rollout:1", str(out)]) == 0
    assert main(["diff", str(out), f"{spec}:rollout:0"]) == 1
    text = capsys.readouterr().out
    assert "differ" in text and "only in A" in text
    assert main(["diff", f"{spec}:rollout:1", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True


def test_diff_dtensor_json_against_spec(spec: Path, tmp_path: Path) -> None:
    resolved = resolve_spec(spec)
    full = canonical_tensors(resolved.canonical)
    for rank in range(2):
        mesh = DeviceMesh("cpu", torch.arange(2), mesh_dim_names=("dp",), _init_backend=False, _rank=rank)
        params = {n: distribute_tensor(x, mesh, (Shard(0),), src_data_rank=None) for n, x in full.items()}
        path = tmp_path / f"dtensor{rank}.json"
        path.write_text(json.dumps(layout_from_dtensors(params, rank=rank).to_json()))
        assert main(["diff", f"{spec}:trainer:{rank}", str(path)]) == 0
        assert main(["diff", f"{spec}:trainer:{1 - rank}", str(path)]) == 1


def test_user_errors_exit_2(spec: Path, tmp_path: Path, capsys) -> None:
    assert main(["diff", str(tmp_path / "nope.json"), f"{spec}:rollout:0"]) == 2
    assert main(["diff", f"{spec}:rollout:9", f"{spec}:rollout:0"]) == 2
    assert main(["diff", f"{spec}:sideways:0", f"{spec}:rollout:0"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["diff", str(bad), f"{spec}:rollout:0"]) == 2
    assert main(["probe", str(spec), "--loader", "no_such_module_xyz:f", "-o", str(tmp_path / "x.json")]) == 2
    assert "no_such_module_xyz" in capsys.readouterr().err
