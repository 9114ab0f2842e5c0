#!/usr/bin/env python
"""Benchmark: delta updates (``sync.delta``) on real training, full vs delta pushes on Gloo, in one run.

A small Qwen2-style model (transformers ``Qwen2ForCausalLM`` built locally from a generated config,
no hub) is trained with real AdamW steps on an fp32 master (one trainer rank, ``fsdp2`` with ``dp: 1``:
its parameters are the live tensors the bridge reads) and pushed to a bf16 rollout instance of vLLM TP
``--rollout-tp`` (separate processes). For each learning rate, after every optimizer step (one version),
the same processes push the version twice over the same Gloo group: with a full executor
(``delta="off"``) and with a delta executor (``delta="on"``), each into its own destination, timed
between barriers (slowest rank), checksums on (the default) for both. Every rollout rank checks that
the delta destination equals the full one bitwise after every version.

Per version it prints the changed fraction (bf16 elements that differ from the previous version,
measured on the trainer), the wire bytes of both pushes (what actually moved: headers, deltas and
trailers included), their ratio against ``1.5 x changed fraction + fixed per-bucket overhead``, and both
times; per learning rate the mean ratios.

    python bench/delta.py                       # ~28M params (56 MB bf16), 4 learning rates x 6 versions
    python bench/delta.py --lrs 1e-6 1e-5 --versions 4 --json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from weightbridge.localrun import launch
from weightbridge.plan import build_plan
from weightbridge.spec.resolve import check_text
from weightbridge.tensors import diff_tensors, empty_like_layout
from weightbridge.transport import Executor, create_bridge_group, open_store
from weightbridge.transport.delta import FIRST_BYTES, HEADER_BYTES


def qwen2_config(args: argparse.Namespace) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_attention_heads": args.heads,
        "num_hidden_layers": args.layers, "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": False,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": args.layers,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02,
    }


def spec_text(config_dir: str, args: argparse.Namespace) -> str:
    return f"""
version: 1
model: {{config: {json.dumps(config_dir)}}}
trainer: {{preset: fsdp2, mesh: {{dp: 1}}, dtype: float32}}
rollout: {{preset: vllm, instances: 1, mesh: {{tp: {args.rollout_tp}}}, dtype: bfloat16}}
sync: {{round_bytes: {args.round_mib}MiB}}
"""


def _pg(store, rank: int, size: int, timeout_s: float):
    return dist.ProcessGroupGloo(dist.PrefixStore("bench/ctl/", store), rank, size,
                                 datetime.timedelta(seconds=timeout_s))


def _max(pg, x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    pg.allreduce([t], opts).wait()
    return float(t.item())


def _barrier(pg) -> None:
    pg.allreduce([torch.zeros(1)]).wait()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.bfloat16).view(torch.int16)


def worker(cfg: dict) -> dict:
    if cfg.get("first_bytes"):  # how a message's length reaches the receiver (docs/delta.md): both ends equal
        import weightbridge.transport.delta as wd

        wd.FIRST_BYTES = cfg["first_bytes"]
    r, problems = check_text(cfg["spec"], base_dir=Path(cfg["dir"]))
    assert r is not None, problems
    plan = build_plan(r.trainer, r.rollout, round_bytes=cfg["round_bytes"], receiver_dedup="off")
    side, rank = cfg["side"], cfg["rank"]
    S, R = r.trainer.world_size, r.rollout.world_size
    me = rank if side == "trainer" else S + rank
    timeout_s = cfg["timeout_s"]
    store = open_store("127.0.0.1", cfg["port"], is_master=False, timeout_s=timeout_s)
    group = create_bridge_group(store, rank=me, world_size=S + R, num_trainers=S, backend="gloo", timeout_s=timeout_s)
    ctl = _pg(store, me, S + R, timeout_s)
    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    rows: list[dict] = []
    if side == "trainer":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**json.loads((Path(cfg["dir"]) / "config.json").read_text())))
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        params = dict(model.named_parameters())
        live = {t.name: params[t.name].data for t in layout.tensors}
        g = torch.Generator().manual_seed(1)
        batch = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
    else:
        dst_full = empty_like_layout(layout, fill=0.0)
        dst_delta = empty_like_layout(layout, fill=0.0)
    version = 0
    for lr in cfg["lrs"]:
        ex_full = Executor(plan, group, side=side, rank=rank, device="cpu", checksums=True, delta="off")
        ex_delta = Executor(plan, group, side=side, rank=rank, device="cpu", checksums=True, delta="on")
        if side == "trainer":
            model.load_state_dict(initial)
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
            prev = {n: _bits(t).clone() for n, t in live.items()}
        for step in range(cfg["versions"]):
            version += 1
            row = {"lr": lr, "version": version, "step": step}
            if side == "trainer":
                if step:
                    opt.zero_grad(set_to_none=True)
                    model(input_ids=batch, labels=batch).loss.backward()
                    opt.step()
                changed = total = 0
                for n, t in live.items():
                    now = _bits(t)
                    changed += int((now != prev[n]).sum())
                    total += now.numel()
                    prev[n] = now
                row["changed"] = changed / total
                src = live
            else:
                src = None
            times = {}
            for name, ex in (("full", ex_full), ("delta", ex_delta)):
                dst = None if side == "trainer" else dst_full if name == "full" else dst_delta
                _barrier(ctl)
                t0 = time.perf_counter()
                st = ex.run(src, version=version) if side == "trainer" else ex.run(dst, version=version)
                times[name] = _max(ctl, time.perf_counter() - t0)
                row[f"{name}_wire"] = st.wire_bytes_sent if side == "trainer" else st.wire_bytes_received
                row[f"{name}_encode_s"] = st.encode_seconds
                row[f"{name}_decode_s"] = st.decode_seconds
                row[f"{name}_buckets"] = (st.delta_buckets, st.full_buckets)
            row.update({"full_s": times["full"], "delta_s": times["delta"]})
            if side == "rollout":
                row["bitwise"] = diff_tensors(dst_delta, dst_full) == []
            rows.append(row)
        ex_full.release_buffers()
        ex_delta.release_buffers()
    _barrier(ctl)
    group.close()
    return {"side": side, "rank": rank, "rows": rows, "buckets": sum(1 for _, b in plan.buckets() if b.sender == rank)
            if side == "trainer" else 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--rollout-tp", type=int, default=2)
    ap.add_argument("--round-mib", type=int, default=256)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4, 1e-3])
    ap.add_argument("--versions", type=int, default=6, help="versions per learning rate (the first is the initial model)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--first-bytes", type=int, default=None,
                    help=f"the first piece of every message (default {FIRST_BYTES}); 64: the header alone (a size "
                    "first), 1099511627776: always the planned size")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="wb-delta-"))
    (tmp / "config.json").write_text(json.dumps(qwen2_config(args)))
    text = spec_text(str(tmp), args)
    r, problems = check_text(text, base_dir=tmp)
    if r is None:
        print("\n".join(str(p) for p in problems), file=sys.stderr)
        return 2
    S, R = r.trainer.world_size, r.rollout.world_size
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=args.timeout)
    base = {"spec": text, "dir": str(tmp), "round_bytes": args.round_mib << 20, "port": store.port,
            "timeout_s": args.timeout, "lrs": args.lrs, "versions": args.versions, "vocab": args.vocab,
            "batch": args.batch, "seq": args.seq, "first_bytes": args.first_bytes}
    cfgs = [({**base, "side": "trainer", "rank": t},) for t in range(S)]
    cfgs += [({**base, "side": "rollout", "rank": q},) for q in range(R)]
    t0 = time.monotonic()
    outs = [res.unwrap() for res in launch(worker, cfgs, timeout_s=args.timeout * 2)]
    wall = time.monotonic() - t0
    trainer = outs[0]
    rollouts = [o for o in outs if o["side"] == "rollout"]
    first = args.first_bytes or FIRST_BYTES
    overhead = trainer["buckets"] * (min(first, 1 << 40) + 8)  # per bucket: at most the first piece + the checksum
    rows = []
    for i, row in enumerate(trainer["rows"]):
        full, delta, f = row["full_wire"], row["delta_wire"], row["changed"]
        bound = 1.5 * f * full + overhead
        rows.append({**row, "wire_ratio": delta / full, "bound_ok": None if row["step"] == 0 else delta <= bound,
                     "time_ratio": row["delta_s"] / row["full_s"],
                     "bitwise": all(o["rows"][i]["bitwise"] for o in rollouts)})
    for i, x in enumerate(rows):  # codec CPU seconds: the trainer's encode, the slowest rollout rank's decode
        x["encode_s"] = x["delta_encode_s"]
        x["decode_s"] = max(o["rows"][i]["delta_decode_s"] for o in rollouts)
    summary = {}
    for lr in args.lrs:
        mine = [x for x in rows if x["lr"] == lr and x["step"] > 0]
        if mine:
            summary[lr] = {k: sum(x[k] for x in mine) / len(mine) for k in ("changed", "wire_ratio", "time_ratio",
                                                                           "full_s", "delta_s", "encode_s",
                                                                           "decode_s")}
    res = {"model_bytes_bf16": r.canonical.total_bytes() // 2, "rollout_tp": args.rollout_tp, "rows": rows,
           "per_lr": {str(k): v for k, v in summary.items()}, "fixed_overhead_bytes": overhead,
           "header_bytes": HEADER_BYTES, "all_bitwise": all(x["bitwise"] for x in rows),
           "all_within_bound": all(x["bound_ok"] for x in rows if x["step"] > 0), "wall_s": wall}
    if args.json:
        print(json.dumps(res, indent=1))
        return 0 if res["all_bitwise"] else 1
    print(f"Qwen2-style model, {res['model_bytes_bf16'] / 1e6:.1f} MB bf16 on the wire per push | fp32 master, "
          f"AdamW | 1 trainer -> vLLM TP{args.rollout_tp} | Gloo, checksums on | first piece {first} B | fixed overhead "
          f"{overhead} B per push ({trainer['buckets']} buckets)")
    print(f"{'lr':>8} {'ver':>4} {'changed':>8} {'full MB':>8} {'delta MB':>9} {'d/f':>7} {'d/(f*ch)':>8} "
          f"{'<=1.5ch':>7} {'full s':>7} {'delta s':>8} {'t d/f':>6} {'bitwise':>7}")
    for x in rows:
        per = x["wire_ratio"] / x["changed"] if x["changed"] else float("nan")
        print(f"{x['lr']:>8.0e} {x['version']:>4} {x['changed']:>8.4f} {x['full_wire'] / 1e6:>8.2f} "
              f"{x['delta_wire'] / 1e6:>9.3f} {x['wire_ratio']:>7.4f} {per:>8.3f} {'-' if x['bound_ok'] is None else str(x['bound_ok']):>7} "
              f"{x['full_s']:>7.3f} {x['delta_s']:>8.3f} {x['time_ratio']:>6.2f} {str(x['bitwise']):>7}")
    print("per learning rate (versions after the first):")
    for lr, s in summary.items():
        print(f"  lr {lr:.0e}: changed {s['changed']:.4f}, wire delta/full {s['wire_ratio']:.4f} "
              f"({s['wire_ratio'] / max(s['changed'], 1e-12):.2f} x changed), time delta/full {s['time_ratio']:.2f} "
              f"({s['delta_s']:.3f} s vs {s['full_s']:.3f} s; encode {s['encode_s']:.3f} s, decode {s['decode_s']:.3f} s)")
    print(f"every version bitwise equal to the full push: {res['all_bitwise']}; wire bytes within "
          f"1.5 x changed + overhead: {res['all_within_bound']}; wall {wall:.0f} s")
    return 0 if res["all_bitwise"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
