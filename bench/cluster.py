#!/usr/bin/env python
"""Benchmark: topology-aware plans on a 4-host cluster of network namespaces with 1 Gbit/s host links.

Each host is a network namespace with one ``tc tbf``-shaped veth (1 Gbit/s each way) to a shared
bridge (``weightbridge/testing/_internal/cluster.py``; needs root, ``ip`` and ``tc``). For each
layout, in ONE run on the same processes and weights (generated bf16 models):

* **weightbridge**: the plan of the spec's ``network:`` section (``hosts`` as placed here,
  ``nic_gbit_per_s: 1``, ``nics_per_node: 1``), run by :class:`weightbridge.transport.Executor`
  between barriers (best of ``--iters``, slowest rank), every rollout tensor verified bitwise;
* **predicted**: the cost model's time for that plan on that network (``plan.cost.price``), and the
  **lower bound**: the busiest link's bytes / its rate;
* **gather+broadcast**: per tensor, the trainers all-gather, trainer 0 broadcasts to every rollout
  rank (``testing/_internal/gather_broadcast.py``), verified bitwise;
* **bytes on each host link**: TCP payload counted on the host's interface (frame bytes less 66
  header bytes per frame) during the weightbridge run, against the plan's bytes crossing that host
  boundary (equal within 0.2%: Gloo's message headers, checksum trailers and the barriers).

The last line: ``worst measured/predicted = X.XX; worst wb/bound = Y.YY; min gb/wb = Z.ZZ; verified True``
(``worst measured/predicted``: the ratio furthest from 1).

    python bench/cluster.py                     # three layouts, ~150 MB models
    python bench/cluster.py --scale 0.25 --json # smaller, JSON out
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from weightbridge.plan import build_plan, network_model
from weightbridge.plan.cost import price
from weightbridge.spec.resolve import check_text
from weightbridge.tensors import canonical_tensors, diff_tensors, empty_like_layout, materialize, needed_names
from weightbridge.testing._internal.bench_models import qwen2_config, qwen3_moe_config
from weightbridge.testing._internal.cluster import Cluster, Link, read_counters, unavailable
from weightbridge.testing._internal.gather_broadcast import GatherBroadcast
from weightbridge.transport import Executor, create_bridge_group, open_store

FILL = 3.0
PORT = 29500
LAYOUTS = {
    "fsdp2-dp4->tp2x4": {
        "title": "FSDP2 dp 4 (hosts 0-1) -> vLLM-style TP2 x 4 (hosts 2-3)", "model": "dense",
        "trainer": "{preset: fsdp2, mesh: {dp: 4}}", "rollout": "{preset: vllm, instances: 4, mesh: {tp: 2}}",
        "hosts": [(2, 0), (2, 0), (0, 4), (0, 4)],
    },
    "megatron-tp2pp2->tp1x4-shared": {
        "title": "Megatron TP2 PP2 -> 4 x TP1, both sides on every host", "model": "dense",
        "trainer": "{preset: megatron, mesh: {tp: 2, pp: 2}}", "rollout": "{preset: vllm, instances: 4, mesh: {tp: 1}}",
        "hosts": [(1, 1), (1, 1), (1, 1), (1, 1)],
    },
    "megatron-tp2pp2->tp1x4-shared2": {
        "title": "Megatron TP2 PP2 -> 4 x TP1, both sides on hosts 0-1 (a pipeline stage each)", "model": "dense",
        "trainer": "{preset: megatron, mesh: {tp: 2, pp: 2}}", "rollout": "{preset: vllm, instances: 4, mesh: {tp: 1}}",
        "hosts": [(2, 2), (2, 2), (0, 0), (0, 0)],
    },
    "megatron-ep4->tp2ep2x4": {
        "title": "MoE: Megatron EP4 (dense dp 4; hosts 0-1) -> vLLM-style TP2 EP2 x 4 (hosts 2-3)", "model": "moe",
        "trainer": "{preset: megatron, mesh: {tp: 1, dp: 4, ep: 4, etp: 1}}",
        "rollout": "{preset: vllm, instances: 4, mesh: {tp: 2, ep: 2}}",
        "hosts": [(2, 0), (2, 0), (0, 4), (0, 4)],
    },
}


def model_config(kind: str, scale: float) -> dict:
    layers = max(2, 2 * round(2 * scale))  # even: pipeline stages of equal layers
    if kind == "dense":  # ~158 MB at scale 1
        return qwen2_config(hidden=1024, layers=layers, vocab=16384, inter=2816, heads=16, kv_heads=4)
    return qwen3_moe_config(hidden=1024, layers=layers, vocab=16384, experts=8, moe_inter=768, heads=16,
                            kv_heads=4, head_dim=64)  # ~145 MB at scale 1


def spec_text(config_path: str, lay: dict, round_mib: int) -> str:
    hosts = ", ".join(f"{{trainer: {t}, rollout: {r}}}" for t, r in lay["hosts"])
    return f"""
version: 1
model: {{config: {json.dumps(config_path)}}}
trainer: {lay['trainer']}
rollout: {lay['rollout']}
sync: {{round_bytes: {round_mib}MiB}}
network: {{preset: cpu-gloo, nic_gbit_per_s: 1, nics_per_node: 1, hosts: [{hosts}]}}
"""


def planned_link_bytes(plan, net, nhosts: int) -> list[list[int]]:
    """Per host: [bytes out, bytes in] crossing its link, by the plan."""
    out = [[0, 0] for _ in range(nhosts)]
    for _, b in plan.buckets():
        src, dst = net.node_of(b.src_side, b.sender), net.node_of("rollout", b.receiver)
        if src != dst:
            out[src[1]][0] += b.nbytes
            out[dst[1]][1] += b.nbytes
    return out


def _barrier(pg) -> None:
    pg.allreduce([torch.zeros(1)]).wait()


def worker(cfg: dict) -> dict:
    r, problems = check_text(cfg["spec"])
    assert r is not None, problems
    net = network_model(r.network)
    plan = build_plan(r.trainer, r.rollout, round_bytes=r.sync.round_bytes, network=net)
    assert plan.plan_hash == cfg["plan_hash"]
    side, rank, timeout_s = cfg["side"], cfg["rank"], cfg["timeout_s"]
    S, R = r.trainer.world_size, r.rollout.world_size
    store = open_store(cfg["store"], PORT, is_master=side == "trainer" and rank == 0, timeout_s=timeout_s)
    me = rank if side == "trainer" else S + rank
    group = create_bridge_group(store, rank=me, world_size=S + R, num_trainers=S, backend="gloo",
                                timeout_s=timeout_s, prefix="bench/pg")
    td = datetime.timedelta(seconds=timeout_s)
    tgroup = (dist.ProcessGroupGloo(dist.PrefixStore("bench/t/", store), rank, S, td) if side == "trainer" else None)
    bgroup = (dist.ProcessGroupGloo(dist.PrefixStore("bench/b/", store), 0 if side == "trainer" else 1 + rank, 1 + R, td)
              if side == "rollout" or rank == 0 else None)
    layout = (r.trainer if side == "trainer" else r.rollout).ranks[rank]
    canon = canonical_tensors(r.canonical, seed=1, names=needed_names(layout))
    local = materialize(layout, canon) if side == "trainer" else empty_like_layout(layout, fill=FILL)
    want = None if side == "trainer" else materialize(layout, canon, fill=FILL)
    del canon
    out: dict = {"side": side, "rank": rank, "times": {}, "verified": {}, "links": {}}
    ex = Executor(plan, group, side=side, rank=rank, device=torch.device("cpu"), checksums=r.sync.checksums)
    methods = {"weightbridge": lambda: ex.run(local), "gather_broadcast": GatherBroadcast(r, side, rank, local, tgroup, bgroup).run}
    for name, iters in (("weightbridge", cfg["iters"]), ("gather_broadcast", cfg["gb_iters"])):
        for _ in range(iters):
            if side == "rollout":
                for t in local.values():
                    t.fill_(FILL)
            _barrier(group.pg)
            c0 = read_counters() if cfg["leader"] else None
            _barrier(group.pg)
            t0 = time.perf_counter()
            methods[name]()
            _barrier(group.pg)
            out["times"].setdefault(name, []).append(time.perf_counter() - t0)
            if c0 is not None:
                d = read_counters() - c0
                out["links"].setdefault(name, []).append([d.tx_payload, d.rx_payload, d.tx_bytes, d.rx_bytes,
                                                          d.retrans_segs])
            if side == "rollout":
                out["verified"][name] = out["verified"].get(name, True) and not diff_tensors(local, want)
    _barrier(group.pg)
    ex.release_buffers()
    group.close()
    return out


def run_layout(cluster: Cluster, key: str, lay: dict, args, tmp: Path) -> dict:
    cfg_path = tmp / f"{key.replace('>', '')}.json"
    cfg_path.write_text(json.dumps(model_config(lay["model"], args.scale)))
    text = spec_text(str(cfg_path), lay, args.round_mib)
    r, problems = check_text(text)
    if r is None:
        raise SystemExit("\n".join(str(p) for p in problems))
    net = network_model(r.network)
    plan = build_plan(r.trainer, r.rollout, round_bytes=r.sync.round_bytes, network=net)
    predicted, bound = price(plan, net)
    S, R = r.trainer.world_size, r.rollout.world_size
    hosts = lay["hosts"]
    placed, leaders = [], set()
    for side, n in (("trainer", S), ("rollout", R)):
        for rank in range(n):
            h = net.node_of(side, rank)[1]  # ("host", h): the spec's network.hosts is the placement
            cfg = {"spec": text, "plan_hash": plan.plan_hash, "side": side, "rank": rank, "timeout_s": args.timeout,
                   "store": cluster.address(net.node_of("trainer", 0)[1]), "iters": args.iters,
                   "gb_iters": args.gb_iters, "leader": h not in leaders, "host": h}
            leaders.add(h)
            placed.append((h, (cfg,)))
    results = cluster.launch(worker, placed, timeout_s=args.timeout * 6)
    for res in results:
        if not res.ok:
            cfg = placed[res.index][1][0]
            print(f"{key}: {cfg['side']} {cfg['rank']} failed: {res.traceback[-2000:] or res}", file=sys.stderr)
    outs = [res.unwrap() for res in results]

    def best(name: str) -> float:  # per iteration the slowest rank, then the best iteration
        return min(max(o["times"][name][i] for o in outs) for i in range(len(outs[0]["times"][name])))

    wb, gb = best("weightbridge"), best("gather_broadcast")
    planned = planned_link_bytes(plan, net, len(hosts))
    leaders = [o for (h, (cfg,)), o in zip(placed, outs) if cfg["leader"]]
    # link bytes of the weightbridge run with the fewest TCP retransmissions (resent payload crosses twice)
    n = len(leaders[0]["links"]["weightbridge"])
    it = min(range(n), key=lambda i: (sum(o["links"]["weightbridge"][i][4] for o in leaders), i))
    measured = [[0, 0] for _ in hosts]
    framed = [[0, 0] for _ in hosts]
    gb_links = [[0, 0] for _ in hosts]
    retrans = 0
    for (h, (cfg,)), o in zip(placed, outs):
        if cfg["leader"]:
            measured[h] = o["links"]["weightbridge"][it][:2]
            framed[h] = o["links"]["weightbridge"][it][2:4]
            retrans += o["links"]["weightbridge"][it][4]
            gb_links[h] = o["links"]["gather_broadcast"][-1][:2]
    equal = all(abs(m - p) <= 0.002 * p + 65536 for mh, ph in zip(measured, planned) for m, p in zip(mh, ph))
    verified = all(all(o["verified"].values()) for o in outs if o["side"] == "rollout")
    return {"layout": key, "title": lay["title"], "model_bytes": r.canonical.total_bytes(), "trainer_ranks": S,
            "rollout_ranks": R, "hosts": hosts, "rounds": plan.num_rounds, "receiver_dedup": plan.receiver_dedup,
            "notes": list(plan.notes), "weightbridge_s": wb, "predicted_s": predicted, "lower_bound_s": bound,
            "gather_broadcast_s": gb, "measured_over_predicted": wb / predicted, "wb_over_bound": wb / bound,
            "gb_over_wb": gb / wb, "link_bytes_planned": planned, "link_payload_measured": measured,
            "link_frame_bytes": framed, "link_payload_gather_broadcast": gb_links, "link_bytes_equal": equal,
            "tcp_retransmitted_segments": retrans,
            "verified": verified and equal, "iterations": {k: outs[0]["times"][k] for k in outs[0]["times"]}}


def report(res: dict) -> None:
    mb = 1e6
    print(f"\n{res['title']}  [{res['layout']}]")
    print(f"  model {res['model_bytes'] / mb:.1f} MB bf16, {res['trainer_ranks']} -> {res['rollout_ranks']} ranks, "
          f"{res['rounds']} rounds, receiver de-replication {res['receiver_dedup']}"
          f"{'; ' + res['notes'][0] if res['notes'] else ''}")
    print(f"  weightbridge {res['weightbridge_s']:.3f} s | predicted {res['predicted_s']:.3f} s | busiest-link bound "
          f"{res['lower_bound_s']:.3f} s | gather+broadcast {res['gather_broadcast_s']:.3f} s")
    print(f"  measured/predicted {res['measured_over_predicted']:.2f}, wb/bound {res['wb_over_bound']:.2f}, "
          f"gb/wb {res['gb_over_wb']:.2f}")
    print(f"  {'host':<6}{'planned out MB':>15}{'measured out':>13}{'planned in MB':>14}{'measured in':>12}"
          f"{'gb out':>8}{'gb in':>8}")
    for h, (p, m, g) in enumerate(zip(res["link_bytes_planned"], res["link_payload_measured"],
                                      res["link_payload_gather_broadcast"])):
        print(f"  {h:<6}{p[0] / mb:>15.3f}{m[0] / mb:>13.3f}{p[1] / mb:>14.3f}{m[1] / mb:>12.3f}"
              f"{g[0] / mb:>8.1f}{g[1] / mb:>8.1f}")
    print(f"  link bytes equal to the plan's (within 0.2%): {res['link_bytes_equal']} "
          f"({res['tcp_retransmitted_segments']} TCP segments resent); verified bitwise {res['verified']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of: {', '.join(LAYOUTS)}")
    ap.add_argument("--scale", type=float, default=1.0, help="model layers x scale (1: ~150 MB)")
    ap.add_argument("--round-mib", type=int, default=16, help="sync.round_bytes in MiB (several rounds: forwards overlap)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--gb-iters", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"bench/cluster.py: cannot build the cluster here: {reason}", file=sys.stderr)
        return 2
    keys = [k for k in args.layouts.split(",") if k]
    unknown = [k for k in keys if k not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layouts {unknown}; known: {', '.join(LAYOUTS)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="wb-cluster-") as tmp, Cluster(4, link=Link(gbit=1.0)) as cluster:
        for key in keys:
            results.append(run_layout(cluster, key, LAYOUTS[key], args, Path(tmp)))
            if not args.json:
                report(results[-1])
    worst_mp = max((r["measured_over_predicted"] for r in results), key=lambda x: abs(math.log(x)))
    worst_bound = max(r["wb_over_bound"] for r in results)
    min_gb = min(r["gb_over_wb"] for r in results)
    ok = all(r["verified"] for r in results)
    if args.json:
        print(json.dumps({"layouts": results, "worst_measured_over_predicted": worst_mp,
                          "worst_wb_over_bound": worst_bound, "min_gb_over_wb": min_gb, "verified": ok}, indent=2))
    print(f"worst measured/predicted = {worst_mp:.2f}; worst wb/bound = {worst_bound:.2f}; min gb/wb = {min_gb:.2f}; "
          f"verified {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
