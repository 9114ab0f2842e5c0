"""A tiny RL loop on CPU that checks the SGLang integration end to end; used by the tests and the bench.

Processes: the driver (the caller's process, under ``if __name__ == "__main__":``) hosts the
control store, starts the 2 trainer ranks (:func:`weightbridge.testing._internal.vllm_selfcheck.trainer_main`:
FSDP2 dp 2, or Megatron-Core with ``trainer_kind="megatron"``; rank 0 saves each version's full HF
checkpoint and the HF model's greedy continuations, for verification only), owns the
``sglang.Engine`` (or starts ``python -m sglang.launch_server`` with ``http=True``) and drives
updates through :class:`~weightbridge.integrations.sglang.driver.SGLangWeightSync`; SGLang's TP
workers receive. After every update: every worker is checked bitwise against SGLang's own load of
the trainer's checkpoint (``SGLangWeightSync.check``), greedy tokens are compared with the HF
model's, and SGLang's ``weight_version`` label with the applied version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from weightbridge.integrations._engine.hooks import record_writes
from weightbridge.integrations.sglang.cpu_engine import ENGINE_ARGS, cpu_env, make_engine
from weightbridge.testing._internal.vllm_selfcheck import (
    MEGATRON_OVERRIDES,
    NEW_TOKENS,
    PROMPTS,
    WRONG_QKV_RULES,
    spec_data,
    trainer_main,
    version_dir,
    write_model,
)

# SGLang on CPU (only there: ``adjust_config_with_unaligned_cpu_tp``) pads what does not divide
# evenly instead of replicating or splitting it as on GPU: KV heads to a multiple of tp (with the
# query heads to match), MoE and dense intermediate sizes to a multiple of tp * 32. The sglang
# preset's ``cpu_pad: true`` describes the intermediate padding (the MoE model's 32 experts' rows
# are padded to 64 at TP 2: TP rank 1 holds only zeros); no param describes the KV-head padding, so
# the dense model has 2 KV heads (the bundled one has 1).
MODEL_OVERRIDES: dict[str, dict[str, Any]] = {"qwen2": {"num_key_value_heads": 2}, "qwen3-moe": {}}


def spec_text(kind: str, model_dir: str | Path, tp: int, mode: str, timeout_s: float = 120.0, *,
              rollout_rules: list[dict[str, Any]] | None = None, instances: int | None = None,
              trainer_kind: str = "fsdp2") -> str:
    """The vLLM selfcheck's spec with the ``sglang`` rollout preset."""
    import yaml

    data = spec_data(kind, model_dir, tp, mode, timeout_s, rollout_rules=rollout_rules, instances=instances,
                     trainer_kind=trainer_kind)
    data["rollout"]["preset"] = "sglang"
    data["rollout"]["params"] = {"cpu_pad": True}  # SGLang's CPU engine (see MODEL_OVERRIDES)
    return f"# {kind}: {trainer_kind} trainer (float32) -> SGLang TP{tp}, {mode} mode (weightbridge selfcheck).\n" + \
        yaml.safe_dump(data, sort_keys=False)


def start_server(model_dir: str | Path, tp: int, port: int, log_path: str | Path) -> subprocess.Popen:
    """``python -m sglang.launch_server`` with the same settings (the HTTP path)."""
    from weightbridge.integrations.sglang import LOADER
    from weightbridge.localrun import ensure_env_secret

    ensure_env_secret()
    record_writes()  # its workers keep what they wrote: the bitwise check of the checkpoint format
    cpu_env(tp)
    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--tp-size", str(tp),
            "--host", "127.0.0.1", "--port", str(port), "--custom-weight-loader", LOADER]
    for key, value in ENGINE_ARGS.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, str(value)]
    with open(log_path, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_server(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang.launch_server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{url} not healthy within {timeout_s} s")


def generate(engine: Any, prompts: list[list[int]] = PROMPTS, n: int = NEW_TOKENS) -> tuple[list[list[int]], list[str]]:
    """Greedy tokens and SGLang's weight_version per prompt (``engine``: an Engine or a URL)."""
    params = {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}
    if isinstance(engine, str):
        import urllib.request

        body = json.dumps({"input_ids": prompts, "sampling_params": params}).encode()
        req = urllib.request.Request(engine + "/generate", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            outs = json.loads(resp.read())
    else:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    return [list(o["output_ids"]) for o in outs], [o["meta_info"].get("weight_version") for o in outs]


def run(kind: str, tp: int, workdir: str | Path, *, modes: tuple[str, ...] = ("sync", "async"), steps: int = 2,
        timeout_s: float = 300.0, check_wrong_spec: bool = True, log: Any = print, trainer_kind: str = "fsdp2",
        http: bool = False, after_update: Any = None) -> dict[str, Any]:
    """The whole loop; returns a report (per applied version: mismatches, generations, labels).
    ``after_update(v, engine, sync)``: called once version ``v`` is live and verified (its result in
    the update's ``"after"``), e.g. a stranger's commands to the engine between two versions.

    Every wait is bounded: the trainer ranks are killed at ``timeout_s * (steps + 2)`` per mode,
    each update waits ``timeout_s``, the HTTP server is killed at the end.
    """
    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.sglang.driver import SGLangWeightSync
    from weightbridge.localrun import launch
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.transport.store import open_store

    ensure_env_secret()  # before the trainers and the engine's workers start: all share it
    workdir = Path(workdir)
    overrides = {**MODEL_OVERRIDES[kind], **(MEGATRON_OVERRIDES[kind] if trainer_kind == "megatron" else {})}
    model_dir = write_model(workdir / "v0", kind, **overrides)
    (model_dir / "greedy.json").write_text("null")
    for mode in modes:  # for `weightbridge diff` against the probe cache afterwards
        (workdir / f"spec_{mode}.yaml").write_text(spec_text(kind, model_dir, tp, mode, timeout_s,
                                                             trainer_kind=trainer_kind))
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    phases = [{"mode": m, "prefix": f"wb-{m}", "steps": steps,
               "spec": spec_text(kind, model_dir, tp, m, timeout_s, trainer_kind=trainer_kind)} for m in modes]
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(model_dir), "workdir": str(workdir),
           "phases": phases, "timeout_s": timeout_s, "kind": kind, "trainer_kind": trainer_kind}
    trainer_results: list[Any] = []
    trainers = threading.Thread(target=lambda: trainer_results.extend(
        launch(trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=timeout_s * (steps + 2) * len(modes),
               threads=1)), daemon=True)
    trainers.start()  # they start while the engine starts; push(1) waits for it
    t0 = time.perf_counter()
    server = None
    if http:
        port = _free_port()
        server = start_server(model_dir, tp, port, workdir / "server.log")
        engine: Any = f"http://127.0.0.1:{port}"
        wait_server(engine, server, timeout_s * 3)
    else:
        record_writes()
        engine = make_engine(model_dir, tp)
    cache = str(workdir / "sglang-probe")
    initial, _ = generate(engine)
    report: dict[str, Any] = {"kind": kind, "tp": tp, "http": http, "engine_start_s": time.perf_counter() - t0,
                              "initial": initial, "updates": [], "trainer": None, "probe_cache": cache}
    log(f"[sglang selfcheck] {kind} TP{tp}{' http' if http else ''}: engine up in {report['engine_start_s']:.1f}s")
    try:
        for phase in phases:
            t0 = time.perf_counter()
            sync = SGLangWeightSync(engine, phase["spec"], host="127.0.0.1", port=master.port, cache_dir=cache,
                                    options=BridgeOptions(prefix=phase["prefix"]))
            log(f"[sglang selfcheck] {phase['mode']}: joined the bridge in {time.perf_counter() - t0:.1f}s")
            last = steps * (1 + phases.index(phase))
            deadline = time.monotonic() + timeout_s * (steps + 1)
            while (sync.version or 0) < last and time.monotonic() < deadline:
                t0 = time.perf_counter()
                if phase["mode"] == "sync":
                    v = sync.update((sync.version or last - steps) + 1)
                else:
                    generate(engine)  # serving continues while the next version lands in staging
                    v = sync.update()
                    if v is None:
                        time.sleep(0.05)
                        continue
                update_s = time.perf_counter() - t0
                report["updates"].append(_verify(engine, sync, phase["mode"], v, workdir, update_s))
                u = report["updates"][-1]
                if after_update is not None:
                    u["after"] = after_update(v, engine, sync)
                log(f"[sglang selfcheck] {phase['mode']} v{v}: update {update_s * 1e3:.0f} ms, "
                    f"{u['problems'] or 'bitwise equal'}, generations {'equal' if u['generation_equal'] else 'DIFFER'}"
                    f", weight_version {u['labels']}")
            report.setdefault("status", []).append(sync.status())
            sync.close()
        if check_wrong_spec:  # the engine's loader is the truth: a spec that disagrees fails at init
            wrong = spec_text(kind, model_dir, tp, "sync", timeout_s, rollout_rules=WRONG_QKV_RULES,
                              trainer_kind=trainer_kind)
            try:
                SGLangWeightSync(engine, wrong, host="127.0.0.1", port=master.port, cache_dir=cache,
                                 options=BridgeOptions(prefix="wb-wrong"))
                report["wrong_spec_error"] = None
            except Exception as exc:  # noqa: BLE001 - the worker's typed error, re-raised here
                report["wrong_spec_error"] = f"{type(exc).__name__}: {exc}"
            log(f"[sglang selfcheck] wrong spec -> {str(report['wrong_spec_error'])[:300]}")
            initial_after, _ = generate(engine)
            report["serves_after_wrong_spec"] = initial_after == report["updates"][-1]["generated"] \
                if report["updates"] else None
    finally:
        trainers.join(timeout=timeout_s * (steps + 2) * len(modes))
        report["trainer"] = [{"ok": r.ok, "error": r.error, "timed_out": r.timed_out, "value": r.value}
                             for r in trainer_results]
        for r in trainer_results:
            if not r.ok:
                log(f"[sglang selfcheck] trainer rank {r.index} failed: {r.error!r}\n{(r.traceback or '')[-2000:]}")
        if server is not None:
            _stop(server)
        else:
            engine.shutdown()
    return report


def _verify(engine: Any, sync: Any, mode: str, version: int, workdir: Path, update_s: float) -> dict[str, Any]:
    vdir = version_dir(workdir, version)
    problems = sync.check(vdir)
    got, labels = generate(engine)
    want = json.loads((vdir / "greedy.json").read_text())
    return {"mode": mode, "version": version, "update_s": update_s, "problems": problems, "generated": got,
            "trainer_greedy": want, "generation_equal": got == want, "labels": labels,
            "label_ok": all(label == str(version) for label in labels)}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
