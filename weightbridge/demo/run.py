"""``weightbridge demo``: a real trainer world and a real rollout world on CPU/Gloo, verified bitwise.

What runs (all local processes, started from one pre-imported fork server):

1. The parent writes a generated Qwen2-style ``config.json`` and one spec per mode into a
   temporary directory, resolves them once (filling the canonical-model cache), and hosts the
   control store (a ``TCPStore`` on a free port chosen by the OS, so no port race).
2. Trainer ranks 0..1: their own Gloo world, the model under FSDP2 (``fully_shard``, float32),
   AdamW steps on a next-token loss over random tokens; after each step, ``push(version)``.
3. Rollout ranks 0..3 = 2 engine instances x TP 2 (vLLM layout: fused ``qkv_proj`` /
   ``gate_up_proj``, padded vocabulary, bfloat16): ``poll()`` / ``apply()``, then a bitwise check
   of every piece against the trainer's canonical weights of that version.
4. Modes run one after the other (default: ``sync`` then ``async``), versions continuing.

Every process is killed at the hard deadline, so the demo cannot hang. Exit 0 only if every
version every rollout rank applied matched bitwise and every rank reached the last version.

Progress (``progress=True``, what ``weightbridge demo`` does) goes to stderr, so ``--json`` keeps
stdout clean: a line per milestone (specs resolved, each world up, each version pushed and
applied), read from counters the workers add to the store the parent hosts, and a spinner when
stderr is a terminal.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weightbridge.demo.model import DEMO_CONFIG, write_demo_files

HOST = "127.0.0.1"
_PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers.models.qwen2.modeling_qwen2",
    "weightbridge.bridge",
    "weightbridge.demo.workers",
]


def _job(kind: str, job: dict) -> Any:
    from weightbridge.demo.workers import rollout_main, trainer_main

    return (trainer_main if kind == "trainer" else rollout_main)(job)


def _launch(jobs: Sequence[tuple[str, str, dict]], timeout_s: float) -> dict[str, tuple]:
    """Run each ``(name, kind, job)`` in its own process; whatever still runs at ``timeout_s`` is killed."""
    from weightbridge.localrun import launch

    results = launch(_job, [(kind, job) for _, kind, job in jobs], timeout_s=timeout_s, preload=_PRELOAD)
    out: dict[str, tuple] = {}
    for (name, _, _), res in zip(jobs, results):
        if res.ok:
            out[name] = ("ok", res.value)
        elif res.timed_out:
            out[name] = ("error", f"killed at the {timeout_s:.0f}s deadline", "")
        elif res.error is not None:
            out[name] = ("error", f"{type(res.error).__name__}: {res.error}", res.traceback)
        else:
            out[name] = ("error", f"process exited with code {res.exitcode}", "")
    return out


class _Progress:
    """What the demo is doing, on stderr: a line per milestone, a spinner on a terminal.

    The workers add to counters in the store the parent hosts (``workers.progress_key``); the
    parent polls them while the worlds run. Progress never fails the demo: a failed read is skipped.
    """

    def __init__(self, enabled: bool, *, modes: Sequence[str], steps: int) -> None:
        self.enabled, self.modes, self.steps = enabled, tuple(modes), steps
        self.t0 = time.perf_counter()
        self._status: Any = None
        self._said: set[str] = set()
        self._next_version = 1
        self.console: Any = None
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True, highlight=False)

    def line(self, message: str) -> None:
        if self.enabled:
            self._spin(None)
            self.console.print(f"[dim]{time.perf_counter() - self.t0:5.1f}s[/dim] {message}", soft_wrap=True)

    def _spin(self, message: str | None) -> None:
        if not self.enabled or not self.console.is_terminal:
            return
        if message is None:
            if self._status is not None:
                self._status.stop()
                self._status = None
        elif self._status is None:
            self._status = self.console.status(message)
            self._status.start()
        else:
            self._status.update(message)

    def once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.line(message)

    def watch(self, store: Any, *, trainers: int, rollouts: int, instances: int) -> None:
        """One read of the workers' counters; prints the milestones reached since the last."""
        if not self.enabled:
            return
        from weightbridge.demo.workers import progress_key

        try:
            t_up, r_up = store.add(progress_key("trainer-up"), 0), store.add(progress_key("rollout-up"), 0)
            pushed = store.add(progress_key("pushed"), 0)
            if t_up >= trainers:
                self.once("trainer-up", f"trainer world up: {trainers} ranks (FSDP2, float32, Gloo)")
            if r_up >= rollouts:
                self.once("rollout-up", f"rollout world up: {rollouts} ranks ({instances} instances x TP {rollouts // instances}, bfloat16)")
            last = len(self.modes) * self.steps
            while self._next_version <= min(pushed, last):
                v = self._next_version
                applied = store.add(progress_key(f"applied/{v}"), 0)
                if applied < rollouts:
                    self._spin(f"v{v}: applied on {applied}/{rollouts} rollout ranks")
                    break
                self.line(f"push v{v} ({self.modes[(v - 1) // self.steps]}): applied on {rollouts}/{rollouts} rollout ranks")
                self._next_version += 1
            else:
                if t_up < trainers or r_up < rollouts:
                    self._spin(f"starting worlds: trainer {t_up}/{trainers}, rollout {r_up}/{rollouts} ranks")
                elif self._next_version <= last:
                    self._spin(f"training step and push v{self._next_version} ({self.modes[(self._next_version - 1) // self.steps]})")
        except Exception:  # noqa: BLE001 - progress is best effort
            pass

    def close(self) -> None:
        self._spin(None)


def run_demo(
    *, modes: Sequence[str] = ("sync", "async"), steps: int = 3, timeout_s: float = 120.0, workdir: Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the demo and return its report (``verified``, one row per version, errors).

    ``progress=True`` prints what it is doing to stderr while it runs (never to stdout)."""
    from weightbridge.spec.resolve import load_spec
    from weightbridge.transport.store import open_store

    t0 = time.perf_counter()
    show = _Progress(progress, modes=modes, steps=steps)
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="weightbridge-demo-")
        workdir = Path(tmp.name)
    specs = write_demo_files(workdir, tuple(modes), timeout_s=min(60.0, timeout_s))
    show.line(f"resolving the specs ({', '.join(modes)}): a Qwen2-style model on the meta device")
    resolved = {m: load_spec(p) for m, p in specs.items()}  # fills the canonical-model cache once
    first = resolved[modes[0]]
    num_trainers, num_rollout = first.trainer.world_size, first.rollout.world_size
    instances = first.rollout.num_instances
    store = open_store(HOST, 0, is_master=True, timeout_s=timeout_s)
    base = {
        "host": HOST, "port": store.port, "timeout_s": min(60.0, timeout_s), "modes": list(modes), "steps": steps,
        "specs": {m: str(p) for m, p in specs.items()}, "workdir": str(workdir), "num_trainers": num_trainers,
    }
    jobs = [(f"trainer {t}", "trainer", {**base, "rank": t}) for t in range(num_trainers)]
    jobs += [(f"rollout {r}", "rollout", {**base, "rank": r}) for r in range(num_rollout)]
    show.line(f"starting trainer world ({num_trainers} ranks) and rollout world ({num_rollout} ranks): "
              f"{len(modes) * steps} versions to push")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["results"] = _launch(jobs, timeout_s)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="weightbridge-demo-launch", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            show.watch(store, trainers=num_trainers, rollouts=num_rollout, instances=instances)
            worker.join(0.25)
        show.watch(store, trainers=num_trainers, rollouts=num_rollout, instances=instances)
    finally:
        show.close()
    if "error" in outcome:
        raise outcome["error"]
    results = outcome["results"]
    report = _report(results, modes=modes, steps=steps, num_rollout=num_rollout, resolved=first)
    report["wall_s"] = time.perf_counter() - t0
    del store
    if tmp is not None:
        tmp.cleanup()
    return report


def _report(results: dict[str, tuple], *, modes: Sequence[str], steps: int, num_rollout: int, resolved) -> dict:
    errors = [
        f"{name}: {res[1]}" + (f"\n{res[2]}" if res[2] else "") for name, res in results.items() if res[0] != "ok"
    ]
    pushes = results.get("trainer 0", ("error",))
    rows: list[dict[str, Any]] = []
    applied: dict[int, list[dict]] = {}
    for r in range(num_rollout):
        res = results.get(f"rollout {r}")
        if res and res[0] == "ok":
            for rec in res[1]:
                applied.setdefault(rec["version"], []).append({**rec, "rank": r})
    last = len(modes) * steps
    if pushes[0] == "ok":
        for p in pushes[1]:
            got = applied.get(p["version"], [])
            rows.append({
                "version": p["version"], "mode": p["mode"], "bytes": p["wire_bytes"], "seconds": p["seconds"],
                "gbps": p["gbps"], "receiver_stall_s": max((g["stall_s"] for g in got), default=None),
                "receivers": len(got),
                "verified": len(got) == num_rollout and all(g["verified"] for g in got) and p["trainer_layout_ok"],
                "loss": p["loss"], "epoch": p["epoch"],
            })
    problems = [pr for recs in applied.values() for g in recs for pr in g["problems"]]
    every_rank_done = all(any(g["rank"] == r for g in applied.get(last, [])) for r in range(num_rollout))
    all_applied_ok = all(g["verified"] for recs in applied.values() for g in recs)
    verified = not errors and len(rows) == last and every_rank_done and all_applied_ok and all(
        row["verified"] for row in rows
    )
    return {
        "verified": verified,
        "model": {"config": DEMO_CONFIG, "canonical_bytes": resolved.canonical.total_bytes(),
                  "num_tensors": len(resolved.canonical)},
        "trainer": "fsdp2 dp=2, float32, Gloo default group of its own",
        "rollout": f"vllm tp=2 x {resolved.rollout.num_instances} instances, bfloat16",
        "steps": rows,
        "problems": problems[:10],
        "errors": errors,
    }


def render(report: dict[str, Any]) -> None:
    """Print the report as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"weightbridge demo: {report['trainer']}  ->  {report['rollout']}")
    for col in ("version", "mode", "bytes", "seconds", "GB/s", "receiver stall", "verified"):
        table.add_column(col, justify="right" if col not in ("mode", "verified") else "left")
    for row in report["steps"]:
        stall = row["receiver_stall_s"]
        table.add_row(
            str(row["version"]), row["mode"], f"{row['bytes'] / 1e6:.2f} MB", f"{row['seconds'] * 1e3:.1f} ms",
            f"{row['gbps']:.3f}", "-" if stall is None else f"{stall * 1e3:.2f} ms",
            "[green]yes[/green]" if row["verified"] else "[red]NO[/red]",
        )
    console.print(table)
    console.print(
        "bytes: update bytes on the wire per version (all receivers); seconds: push() wall time on trainer 0; "
        "receiver stall: the slowest rollout rank's time not serving because of the update "
        "(sync: receive + apply; async: apply only)."
    )
    for e in report["errors"]:
        console.print(f"[red]error[/red] {e}")
    for p in report["problems"]:
        console.print(f"[red]mismatch[/red] {p}")
    status = "[green]verified[/green]" if report["verified"] else "[red]NOT verified[/red]"
    console.print(f"{status}: every rollout tensor bitwise equal to the trainer's canonical weights "
                  f"after each update ({report['wall_s']:.1f}s)")


def main(modes: Sequence[str], steps: int, timeout_s: float, as_json: bool) -> int:
    report = run_demo(modes=modes, steps=steps, timeout_s=timeout_s, progress=True)
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(report)
    return 0 if report["verified"] else 1
