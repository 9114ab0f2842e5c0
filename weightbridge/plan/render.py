"""Human views of a plan: the rich summary table and the ``--render`` PNG (matplotlib, imported lazily)."""

from __future__ import annotations

from typing import Any

from weightbridge.plan.types import ROLLOUT, TRAINER, TransferPlan

BALANCE_LIMIT = 1.05


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def balance_reason(m: dict[str, Any]) -> str | None:
    """Why the sender balance is above 1.05, when the layouts force it; None when it is within limits."""
    bal, bound = m["sender_balance"], m["sender_balance_bound"]
    if bal <= BALANCE_LIMIT:
        return None
    if bal <= bound * BALANCE_LIMIT:
        return (f"sender balance {bal:.3f} is forced by the layouts (no plan can go below {bound:.3f}): some "
                f"senders hold more data that no other sender has (e.g. unequal pipeline stages or unreplicated "
                f"experts); the shareable data is split evenly")
    return f"sender balance {bal:.3f} exceeds {BALANCE_LIMIT} and the layouts' limit {bound:.3f}"


def summary_table(m: dict[str, Any], plan: TransferPlan, title: str = "weightbridge plan", *, gpus: bool = True):
    """The summary of ``plan --json``'s ``m``; ``gpus`` False (a CPU / Gloo spec): the stall row names ranks,
    not GPUs."""
    from rich.table import Table

    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("note")
    send = [v for v in plan.sender_bytes(TRAINER).values() if v > 0]
    recv = list(plan.receiver_bytes().values())
    ratio = m["wire_bytes"] / m["min_wire_bytes"] if m["min_wire_bytes"] else 1.0
    t.add_row("plan hash", m["plan_hash"][:16], "")
    t.add_row("rounds", str(m["num_rounds"]), f"{m['num_buckets']} buckets, {m['num_items']} items")
    t.add_row("round cap", human_bytes(m["round_bytes"]),
              f"busiest rank-round {human_bytes(m['max_round_rank_bytes'])}")
    t.add_row("streaming receiver", human_bytes(m["max_stream_bytes"]),
              "most local-tensor bytes an engine's rank holds at once (docs/memory.md)")
    t.add_row("wire bytes", human_bytes(m["wire_bytes"]), f"{ratio:.3f} x min {human_bytes(m['min_wire_bytes'])}")
    for dtype, n in m["wire_bytes_by_dtype"].items() if len(m["wire_bytes_by_dtype"]) > 1 else ():
        t.add_row(f"  {dtype}", human_bytes(n), f"{n / m['wire_bytes']:.1%} of the wire bytes" if m["wire_bytes"] else "")
    if m.get("fp8_wire_ratio") is not None:
        t.add_row("FP8 saving", f"{m['fp8_wire_ratio']:.4f}",
                  f"wire / unquantised {human_bytes(m['unquantized_wire_bytes'])} ({m['quantized_weights']} weights "
                  "quantised at the senders)")
    if m["exchange_bytes"]:
        t.add_row("  from trainers", human_bytes(m["update_bytes"]), "")
        t.add_row("  forwarded", human_bytes(m["exchange_bytes"]), "rollout -> rollout (receiver de-replication)")
    if send:
        t.add_row("bytes per sender", human_bytes(m["max_sender_bytes"]),
                  f"max; min {human_bytes(min(send))}, mean {human_bytes(m['mean_sender_bytes'])} "
                  f"over {len(send)} senders")
    t.add_row("sender balance", f"{m['sender_balance']:.3f}",
              f"max/mean; layouts allow {m['sender_balance_bound']:.3f}")
    if recv:
        t.add_row("bytes per receiver", human_bytes(max(recv)),
                  f"max; min {human_bytes(min(recv))}, mean {human_bytes(sum(recv) / len(recv))} "
                  f"over {len(recv)} receivers")
    t.add_row("predicted", f"{m['predicted_seconds']:.4g} s",
              f"{m['predicted_seconds'] / m['lower_bound_seconds']:.3f} x lower bound {m['lower_bound_seconds']:.4g} s"
              if m["lower_bound_seconds"] else "lower bound 0")
    if m.get("predicted_delta_seconds") is not None:
        t.add_row("with deltas", f"{m['predicted_delta_seconds']:.4g} s",
                  f"sync.delta at {m['change_rate']:.3g} changed: {human_bytes(m['delta_wire_bytes'])} on the wire")
    t.add_row("baseline", f"{m['baseline_seconds']:.4g} s", "gather-then-broadcast, same network")
    t.add_row(f"{'GPU' if gpus else 'rank'} stall ({m['sync_mode']})", f"{m['stall_seconds']:.4g} s",
              f"baseline {m['baseline_stall_seconds']:.4g} s"
              + (f" ({m['baseline_stall_seconds'] / m['stall_seconds']:.1f}x)" if m["stall_seconds"] else ""))
    t.add_row("planning", f"{m['planning_seconds']:.3f} s", f"network {m['network']}")
    return t


def render_png(plan: TransferPlan, path: str, title: str = "") -> None:
    """Sender x receiver byte matrix and per-round load (max and mean per rank vs the cap)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("--render needs matplotlib: pip install 'weightbridge-rl[plot]'") from exc
    import numpy as np

    ns, nr = max(plan.num_senders, 1), max(plan.num_receivers, 1)
    mat = np.zeros((ns + (nr if plan.exchange_bytes else 0), nr))
    rounds = []
    for r in plan.rounds:
        loads: dict[tuple[str, int], int] = {}
        for b in r.buckets:
            row = b.sender if b.src_side == TRAINER else ns + b.sender
            mat[row, b.receiver] += b.nbytes
            for k in ((b.src_side, b.sender), (ROLLOUT, b.receiver)):
                loads[k] = loads.get(k, 0) + b.nbytes
        vals = list(loads.values()) or [0]
        rounds.append((max(vals), sum(vals) / len(vals)))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [1.1, 1]})
    im = ax0.imshow(mat / 2**30, aspect="auto", interpolation="nearest", cmap="viridis")
    ax0.set_xlabel("rollout rank (receiver)")
    ax0.set_ylabel("trainer rank (sender)" + (" / rollout rank (forward)" if plan.exchange_bytes else ""))
    ax0.set_title("bytes sent (GiB)")
    fig.colorbar(im, ax=ax0)
    x = np.arange(len(rounds))
    ax1.bar(x, [m / 2**30 for m, _ in rounds], color="tab:orange", label="busiest rank")
    ax1.bar(x, [a / 2**30 for _, a in rounds], color="tab:blue", label="mean rank")
    ax1.axhline(plan.round_bytes / 2**30, color="k", linestyle="--", label="round_bytes cap")
    ax1.set_xlabel("round")
    ax1.set_ylabel("GiB moved by a rank (sent + received)")
    ax1.set_title("per-round load")
    ax1.legend()
    fig.suptitle(title or f"plan {plan.plan_hash[:12]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
