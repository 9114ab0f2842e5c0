"""Real FSDP2 + TP on a CPU Gloo world, compared with the fsdp2 preset's IR.

Run as ``python _fsdp2_worker.py JOB_DIR`` (by tests/layout/test_fsdp2_dtensor.py).
``JOB_DIR/job.json`` holds::

    {"config": ".../tiny-llama.json", "seed": 0, "timeout_s": 60,
     "worlds": [{"dp": 2, "tp": 2, "layouts": "layouts_2x2.json"}, ...]}

where each ``layouts`` file is the list of ``RankLayout.to_json()`` of the fsdp2
preset for that mesh, rank-ordered. torch and transformers are imported once here,
then each world's ranks are forked (before any torch compute in this process), so
a world costs a second or two beyond the import. Every rank builds the same HF
model (same seed; every weight element a distinct float32 value), keeps its full
weights, applies torch's tensor-parallel plan on the ``tp`` mesh dim and FSDP2
``fully_shard`` on ``dp``, and compares each parameter's ``to_local()`` bitwise with what the IR says the rank holds (gathered
from the full weights through the pieces). Each rank writes
``JOB_DIR/result_{dp}x{tp}_{rank}.json``; the launcher exits non-zero if a rank
failed or the world ran past its deadline (its ranks are then killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from weightbridge.layout.box import box_shape
from weightbridge.layout.ir import RankLayout

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def _slices(box):
    return tuple(slice(a, b) for a, b in box)


def run_rank(job_dir: Path, job: dict, world: dict, rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    dp, tp = world["dp"], world["tp"]
    size = dp * tp
    store = job_dir / f"store_{dp}x{tp}"
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=size, timeout=timedelta(seconds=job["timeout_s"])
    )
    try:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        cfg = LlamaConfig.from_json_file(job["config"])
        torch.manual_seed(job["seed"])
        model = LlamaForCausalLM(cfg).float()
        # Random but pairwise distinct values (exact in float32), identical on every rank: norms
        # initialised to ones would make every chunk look alike.
        params = list(model.named_parameters())
        total = sum(p.numel() for _, p in params)
        assert total < 2**24
        values = torch.randperm(total, generator=torch.Generator().manual_seed(job["seed"])).float()
        off = 0
        with torch.no_grad():
            for _, p in params:
                p.copy_(values[off : off + p.numel()].view_as(p))
                off += p.numel()
        full = {k: v.detach().clone() for k, v in model.named_parameters()}

        # torch's own TP plan (as the fsdp2 preset doc describes it)
        plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()), "lm_head": ColwiseParallel()}
        for i in range(cfg.num_hidden_layers):
            for n in COLWISE:
                plan[f"model.layers.{i}.{n}"] = ColwiseParallel()
            for n in ROWWISE:
                plan[f"model.layers.{i}.{n}"] = RowwiseParallel()
        parallelize_module(model, mesh["tp"], plan)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])

        layouts = json.loads((job_dir / world["layouts"]).read_text())
        layout = RankLayout.from_json(layouts[rank])
        assert layout.rank == rank
        out: dict = {
            "rank": rank,
            "coords": dict(layout.coords),
            "mesh_coord": list(mesh.get_coordinate()),
            "params": {},
        }
        names = set()
        for name, param in model.named_parameters():
            names.add(name)
            is_dt = isinstance(param, DTensor)
            local = param.to_local() if is_dt else param.detach()
            rec = {
                "placements": [str(p) for p in param.placements] if is_dt else [],
                "placements_repr": repr(tuple(param.placements)) if is_dt else "",
                "mesh_dims": list(param.device_mesh.mesh_dim_names or ()) if is_dt else [],
                "local_shape": list(local.shape),
            }
            try:
                t = layout.tensor(name)
            except KeyError:
                rec["error"] = "not in the fsdp2 layout"
                out["params"][name] = rec
                continue
            rec["ir_shape"] = list(t.shape)
            expected = torch.zeros(t.shape, dtype=local.dtype)
            covered = torch.zeros(t.shape, dtype=torch.bool)
            for p in t.pieces:
                src = full[p.canonical][_slices(p.canonical_box)]
                if p.transpose:
                    src = src.permute(*reversed(range(src.dim())))
                expected[_slices(p.local_box)] = src.reshape(box_shape(p.local_box))
                covered[_slices(p.local_box)] = True
            rec["all_covered"] = bool(covered.all())
            rec["bitwise_equal"] = tuple(local.shape) == tuple(t.shape) and torch.equal(local.contiguous(), expected)
            out["params"][name] = rec
        out["missing_in_model"] = sorted({t.name for t in layout.tensors} - names)
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


def main(job_dir: Path) -> int:
    job = json.loads((job_dir / "job.json").read_text())
    status = 0
    for world in job["worlds"]:
        size = world["dp"] * world["tp"]
        pids = {}
        for rank in range(size):
            pid = os.fork()
            if pid == 0:  # child: never returns
                code = 1
                res_path = job_dir / f"result_{world['dp']}x{world['tp']}_{rank}.json"
                try:
                    res = run_rank(job_dir, job, world, rank)
                    res_path.write_text(json.dumps(res))
                    code = 0
                except BaseException:  # noqa: BLE001 - report everything to the parent
                    res_path.write_text(json.dumps({"rank": rank, "error": traceback.format_exc()}))
                finally:
                    sys.stdout.flush()
                    os._exit(code)
            pids[pid] = rank
        deadline = time.monotonic() + job["timeout_s"]
        while pids and time.monotonic() < deadline:
            pid, st = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                time.sleep(0.05)
                continue
            if pid in pids:
                pids.pop(pid)
                if os.waitstatus_to_exitcode(st) != 0:
                    status = 1
        if pids:  # a hung world: kill exactly the ranks we forked
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            for pid in pids:
                os.waitpid(pid, 0)
            print(f"world dp={world['dp']} tp={world['tp']}: ranks {sorted(pids.values())} timed out", file=sys.stderr)
            return 2
    return status


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
