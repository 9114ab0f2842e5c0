"""End-to-end check of weightbridge with a real ``vllm serve`` (used by the tests and the bench).

Processes: this one (the driver: hosts the control store, paces the trainer, verifies through
HTTP), a ``vllm serve`` subprocess (API server, engine core, TP workers; the weightbridge backend
in each worker), and 2 FSDP2 trainer ranks (:func:`weightbridge.testing._internal.vllm_selfcheck.trainer_main`)
whose rank 0 drives the server: ``VLLMServers.init()`` per phase and ``VLLMServers.push(bridge, v)``
per version (vLLM's HTTP routes: pause, start, update, finish, resume).

Phases: ``sync`` then ``async`` mode (a new bridge each, the server re-initialised). Per version
the driver lets the trainer step (``go/{v}``), waits until the server's ``/weight_info`` says ``v``,
and records: every worker's bitwise check against vLLM's own load of the trainer's checkpoint
(``/collective_rpc weightbridge_check``), and ``/v1/completions`` greedy output next to the trainer
HF model's. Meanwhile a client keeps one ``/inference/v1/generate`` request in flight at all times
(logprobs and vLLM's ``weight_versions`` spans recorded), so every update lands in the middle of a
request; :func:`~weightbridge.testing._internal.vllm_online.replay_problems` checks the labels afterwards.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from weightbridge.testing._internal import vllm_online as online
from weightbridge.testing._internal import vllm_selfcheck as sc

# Liveness is not what these checks test: a vLLM worker pinned to a busy core can stall for
# seconds on a loaded 2-core machine, so peers are declared dead only after 10 x this.
HEARTBEAT_S = 2.0


class Traffic:
    """One request in flight at all times on ``/inference/v1/generate`` (a thread), until stop()."""

    def __init__(self, server: Any, vocab: int, *, seed: int = 0, max_tokens: tuple[int, int] = (40, 80)) -> None:
        self.server, self.vocab, self.rng, self.max_tokens = server, vocab, random.Random(seed), max_tokens
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wb-traffic", daemon=True)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            ids = online.prompt(self.rng, self.vocab)
            new = min(self.rng.randrange(*self.max_tokens), online.MAX_MODEL_LEN - len(ids))
            body = {"token_ids": ids, "sampling_params": {"max_tokens": new, "temperature": 0.0,
                                                          "ignore_eos": True, "logprobs": 1}}
            try:
                reply = self.server.call("/inference/v1/generate", body)
                self.samples.append(online.sample_from_json(reply["choices"][0], ids, f"traffic-{n}"))
            except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
                self.errors.append(f"{type(exc).__name__}: {exc}"[:500])
                time.sleep(0.2)
            n += 1


def completions(server: Any, model: str, prompts: list[list[int]] = sc.PROMPTS, n: int = sc.NEW_TOKENS) -> list[list[int]]:
    """Greedy continuations through the OpenAI route ``/v1/completions`` (token ids in and out)."""
    out = []
    for p in prompts:
        reply = server.call("/v1/completions", {"model": model, "prompt": p, "max_tokens": n, "temperature": 0.0,
                                                "ignore_eos": True, "return_token_ids": True})
        out.append(list(reply["choices"][0]["token_ids"]))
    return out


def run(kind: str, tp: int, workdir: str | Path, *, steps: tuple[int, int] = (2, 2), timeout_s: float = 120.0,
        traffic: bool = True, log: Any = print, after_version: Any = None) -> dict[str, Any]:
    """The whole check; returns a JSON-able report (per version: problems, generations; samples).
    ``after_version(v, server)``: called once version ``v`` is live and verified (its result in the
    update's ``"after"``), e.g. a stranger's requests to the server between two versions."""
    import torch
    from transformers import AutoModelForCausalLM

    from weightbridge.localrun import launch
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.transport.store import open_store

    ensure_env_secret()  # inherited by the server's workers and the trainer ranks
    workdir = Path(workdir)
    model_dir = sc.write_model(workdir / "v0", kind)
    v0 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    (model_dir / "greedy.json").write_text(json.dumps(sc.greedy(v0)))
    vocab = v0.config.vocab_size
    del v0
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    modes = [m for m, n in zip(("sync", "async"), steps) if n]
    phases = [{"mode": m, "prefix": f"wb-{m}", "steps": n, "spec": sc.spec_text(kind, model_dir, tp, m, timeout_s, heartbeat_s=HEARTBEAT_S)}
              for m, n in zip(("sync", "async"), steps) if n]
    phases[0]["initial_version"] = 0  # label the weights the server started with "0"
    total = sum(steps)
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(model_dir), "workdir": str(workdir),
           "phases": phases, "timeout_s": timeout_s, "kind": kind, "go_key": "go", "greedy": True,
           "go_wait_s": 900.0}  # rank 1 waits for go/1 while the server starts
    results: list[Any] = []
    trainers = threading.Thread(target=lambda: results.extend(launch(
        sc.trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=timeout_s * (total + 2), threads=1)),
        daemon=True)
    t0 = time.perf_counter()
    proc, server = online.start_server(model_dir, tp, workdir / "server.log", start=False)
    job["servers"] = [server.url]
    trainers.start()  # they set up (Gloo, FSDP2) while the server starts; rank 0's init waits for it
    report: dict[str, Any] = {"kind": kind, "tp": tp, "url": server.url, "modes": modes, "updates": [],
                              "samples": [], "traffic_errors": [], "trainer": None}
    try:
        online.wait_server(proc, server, workdir / "server.log")
        report["server_start_s"] = time.perf_counter() - t0
        log(f"[server] {kind} TP{tp}: vllm serve up in {report['server_start_s']:.1f}s at {server.url}")
        report["initial"] = completions(server, str(model_dir))
        for v in range(1, total + 1):
            phase = phases[0 if v <= steps[0] else -1]
            master.set(f"go/setup/{phase['prefix']}", b"1")  # (a no-op for the first phase)
            _wait_key(master, f"go/ready/{phase['prefix']}", trainers, proc, timeout_s * 2)
            # one request in flight across the update (its spans then straddle the version change)
            load = Traffic(server, vocab, seed=v).start() if traffic else None
            t = time.perf_counter()
            master.set(f"go/{v}", b"1")
            try:
                _wait_label(server, str(v), trainers, proc, timeout_s * 2)
            finally:
                live_s = time.perf_counter() - t
                if load is not None:
                    load.stop()
                    report["samples"] += load.samples
                    report["traffic_errors"] += load.errors
            report["updates"].append(_verify(server, workdir, model_dir, v, phase["mode"], live_s))
            u = report["updates"][-1]
            if after_version is not None:
                u["after"] = after_version(v, server)
            log(f"[server] v{v} ({u['mode']}): live {live_s:.2f}s after go; {u['problems'] or 'bitwise equal'}; "
                f"/v1/completions {'equal' if u['generation_equal'] else 'DIFFER'}")
        report["final_label"] = server.weight_version()
    finally:
        trainers.join(timeout=timeout_s * (total + 2))
        report["trainer"] = [{"ok": r.ok, "error": repr(r.error) if r.error else None, "timed_out": r.timed_out,
                              "value": r.value} for r in results]
        for r in results:
            if not r.ok:
                log(f"[server] trainer rank {r.index} failed: {r.error!r}\n{(r.traceback or '')[-2000:]}")
        online.stop_server(proc)
    return report


def _wait_key(store: Any, key: str, trainers: threading.Thread, proc: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.check([key]):
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}) waiting for {key}")
        if not trainers.is_alive():
            raise RuntimeError(f"the trainer ranks ended before {key}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key} not set within {timeout_s:.0f}s")
        time.sleep(0.05)


def _wait_label(server: Any, want: str, trainers: threading.Thread, proc: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while server.weight_version() != want:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}) waiting for version {want}")
        if not trainers.is_alive():
            raise RuntimeError(f"the trainer ranks ended before version {want} was live")
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {want} not live within {timeout_s:.0f}s")
        time.sleep(0.02)


def _verify(server: Any, workdir: Path, model_dir: Path, version: int, mode: str, live_s: float) -> dict[str, Any]:
    vdir = sc.version_dir(workdir, version)
    problems = [p for ps in server.collective_rpc("weightbridge_check", (str(vdir),)) for p in ps]
    got = completions(server, str(model_dir))
    want = json.loads((vdir / "greedy.json").read_text())
    status = server.collective_rpc("weightbridge_status")
    return {"mode": mode, "version": version, "live_s": live_s, "problems": problems, "generated": got,
            "trainer_greedy": want, "generation_equal": got == want, "workers": status,
            "label": server.weight_version()}
