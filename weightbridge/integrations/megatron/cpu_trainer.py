"""A Megatron-Core trainer rank on CPU (Gloo): the conformance suites', the vLLM selfcheck's and the bench's.

* :func:`cpu_patches` — the three CPU shims of ``../shared/background/RECIPES.md`` (rotary
  ``inv_freq`` device, the inference RNG tracker, no TE GEMM in the router);
* :func:`transformer_config` — an HF config (Qwen2 / Llama / Qwen3-MoE) as Megatron's
  ``TransformerConfig`` at the given parallel sizes, fusions off, fp32 on CPU;
* :class:`MegatronWorld` — one trainer rank: its own Gloo world (never the bridge's),
  ``parallel_state``, the ``GPTModel`` of its pipeline stage, its layout IR (introspected), the
  HF checkpoint loaded into its shards, full HF tensors (a collective, verification only) and one
  optimizer step (pp = 1);
* :class:`MegatronTrainerRank` — a ready-made ``wb_trainer`` factory for the conformance suite
  (``weightbridge examples engine_suites``: ``megatron/``).

Frames: *local* names are Megatron's (``decoder.layers.0.self_attention.linear_qkv.weight``),
*canonical* ones the HF checkpoint's; the IR of
:func:`weightbridge.integrations.megatron.layout_from_megatron` translates. Every method runs on
every rank of the world (the collectives say so). Imports Megatron and torch.distributed lazily.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from weightbridge.tensors import read_canonical, write_canonical


def cpu_patches() -> None:
    """Shims for Megatron-Core 0.16.1's forward on CPU (idempotent)."""
    torch.cuda.current_device = lambda: torch.device("cpu")  # rotary inv_freq, p2p buffers
    try:
        from megatron.core.transformer.moe import moe_utils

        moe_utils.te_general_gemm = None  # the router's GEMM needs Transformer Engine otherwise
    except ImportError:  # pragma: no cover - older/newer layouts of the module
        pass


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron-LM's ``make-vocab-size-divisible-by`` padding (what the ``megatron`` preset assumes)."""
    m = multiple * tp
    return -(-vocab // m) * m


def transformer_config(hf: Any, *, tp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None) -> Any:
    """``TransformerConfig`` of HF config ``hf`` at these parallel sizes (local layer spec, fp32, CPU)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    heads = hf.num_attention_heads
    kw: dict[str, Any] = dict(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, num_attention_heads=heads,
        num_query_groups=getattr(hf, "num_key_value_heads", None) or heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        ffn_hidden_size=hf.intermediate_size, normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=bool(getattr(hf, "attention_bias", hf.model_type == "qwen2")),
        qk_layernorm=hf.model_type.startswith("qwen3"), hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
        use_cpu_initialization=True, perform_initialization=True, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, masked_softmax_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
    )
    if etp is not None:
        kw["expert_tensor_parallel_size"] = etp
    if getattr(hf, "num_experts", None):
        kw.update(num_moe_experts=hf.num_experts, moe_router_topk=hf.num_experts_per_tok,
                  moe_ffn_hidden_size=hf.moe_intermediate_size, moe_token_dispatcher_type="allgather",
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_grouped_gemm=False)
    return TransformerConfig(**kw)


class MegatronWorld:
    """One Megatron-Core trainer rank: ``parallel_state`` at (tp, pp, ep, etp) and the stage's GPTModel.

    With ``store`` the rank first starts its own Gloo default group on ``PrefixStore(prefix, store)``
    (the training framework's world; the bridge never touches it); without, the caller did.
    ``hf`` is a transformers config (the canonical model); the vocabulary is padded as
    Megatron-LM pads it (``vocab_multiple * tp``).
    """

    def __init__(self, hf: Any, *, rank: int, world_size: int, tp: int = 1, pp: int = 1, ep: int = 1,
                 etp: int | None = None, store: Any = None, prefix: str = "trainer-world/", seed: int = 1234,
                 vocab_multiple: int = 128) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        from weightbridge.integrations.megatron import layout_from_megatron, megatron_tensors

        cpu_patches()
        if store is not None:
            dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                 expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
        tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
        self.rank, self.hf = rank, hf
        self.config = transformer_config(hf, tp=tp, pp=pp, ep=ep, etp=etp)
        experts = getattr(hf, "num_experts", None)
        spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False,
                                        qk_layernorm=self.config.qk_layernorm, normalization="RMSNorm")
        cuda, torch.Tensor.cuda = torch.Tensor.cuda, lambda t, *a, **k: t  # tied + pp > 1: .data.cuda()
        try:
            self.model = self._build(GPTModel, spec, tp, vocab_multiple)
        finally:
            torch.Tensor.cuda = cuda
        self.layout = layout_from_megatron(self.model, vocab_size=hf.vocab_size, rank=rank)
        self.params = megatron_tensors(self.model)

    def _build(self, GPTModel: Any, spec: Any, tp: int, vocab_multiple: int) -> Any:
        from megatron.core import parallel_state

        hf = self.hf
        return GPTModel(
            self.config, spec, vocab_size=padded_vocab(hf.vocab_size, tp, vocab_multiple),
            max_sequence_length=hf.max_position_embeddings, pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(), position_embedding_type="rope",
            rotary_base=int(getattr(hf, "rope_theta", None) or hf.rope_parameters["rope_theta"]),
            share_embeddings_and_output_weights=bool(hf.tie_word_embeddings),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """This rank's live tensors by Megatron local name (what the bridge reads)."""
        return {n: t.detach() for n, t in self.params.items()}

    @torch.no_grad()
    def load_full(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full HF tensors -> this rank's shards, through its IR (no communication)."""
        full = dict(weights)
        missing = sorted({p.canonical for t in self.layout.tensors for p in t.pieces} - set(full))
        if missing:
            raise KeyError(f"weights lack {len(missing)} tensor(s) this rank holds: {missing[:5]}")
        for t in self.layout.tensors:
            for p in t.pieces:
                shape = tuple(b - a for a, b in p.canonical_box)
                vals = read_canonical(full[p.canonical], p.canonical_box, False, shape)
                write_canonical(self.params[t.name].data, p.local_box, p.transpose, vals)

    def load_checkpoint(self, model_dir: str | os.PathLike) -> None:
        """The HF safetensors checkpoint in ``model_dir`` into this rank's shards."""
        from pathlib import Path

        from safetensors.torch import load_file

        full: dict[str, torch.Tensor] = {}
        for f in sorted(Path(model_dir).glob("*.safetensors")):
            full.update(load_file(str(f)))
        self.load_full(full.items())

    @torch.no_grad()
    def full_tensors(self, *, check_replicas: bool = True) -> dict[str, torch.Tensor]:
        """Every canonical HF tensor, on every rank (``all_gather_object``: verification only).

        With ``check_replicas`` a canonical element held by several ranks must be bitwise equal
        on all of them (replicas that drifted apart raise).
        """
        import torch.distributed as dist

        mine = [(p.canonical, p.canonical_box, read_canonical(self.params[t.name].detach(), p.local_box, p.transpose,
                                                              tuple(b - a for a, b in p.canonical_box)).clone())
                for t in self.layout.tensors for p in t.pieces]
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        shapes: dict[str, list[int]] = {}
        for part in everyone:
            for name, box, _ in part:
                s = shapes.setdefault(name, [0] * len(box))
                for d, (_, b) in enumerate(box):
                    s[d] = max(s[d], b)
        out = {n: torch.empty(s, dtype=self.config.params_dtype) for n, s in shapes.items()}
        seen: dict[str, torch.Tensor] = {n: torch.zeros(s, dtype=torch.bool) for n, s in shapes.items()}
        for src, part in enumerate(everyone):
            for name, box, vals in part:
                sl = tuple(slice(a, b) for a, b in box)
                if check_replicas and seen[name][sl].any():
                    held = seen[name][sl]
                    if not torch.equal(out[name][sl][held].view(torch.int32), vals[held].view(torch.int32)):
                        raise RuntimeError(f"{name}{list(box)}: trainer rank {src} disagrees with another replica")
                out[name][sl] = vals.to(out[name].dtype)
                seen[name][sl] = True
        return out

    def step(self, opt: Any, ids: torch.Tensor) -> float:
        """One optimizer step of the next-token loss on ``ids`` [batch, seq] (same ids on every rank;
        pp = 1). Dense gradients are averaged over the data-parallel group, expert gradients over
        the expert-data-parallel group (what Megatron's DDP does), so replicas stay equal."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() != 1:
            raise NotImplementedError("MegatronWorld.step trains pp = 1 worlds only")
        s = ids.shape[1] - 1
        pos = torch.arange(s).unsqueeze(0).expand(ids.shape[0], s)
        mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), 1)
        loss = self.model(input_ids=ids[:, :-1], position_ids=pos, attention_mask=mask, labels=ids[:, 1:]).mean()
        loss.backward()
        groups = {True: (ps.get_data_parallel_group(), ps.get_data_parallel_world_size()),
                  False: (ps.get_expert_data_parallel_group(), ps.get_expert_data_parallel_world_size())}
        for p in self.model.parameters():
            group, size = groups[getattr(p, "allreduce", True)]
            if p.grad is not None and size > 1:
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(size)
        opt.step()
        opt.zero_grad()
        return float(loss.detach())

    def close(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


class MegatronTrainerRank:
    """A :class:`~weightbridge.testing.TrainerRank`: its own Gloo world, Megatron-Core parallel state.

    The mesh (tp, pp, ep, etp) is the spec's ``trainer.mesh``; the model is the spec's canonical
    HF config (``model.config`` or ``model.bundled``), random init. Override :meth:`hf_config` for
    another model source.
    """

    def __init__(self, ctx: Any) -> None:
        from weightbridge.bridge import TrainerBridge

        ctx.init_process_group("gloo")
        mesh = dict(ctx.resolved().spec.trainer.mesh)
        self.world = MegatronWorld(self.hf_config(ctx), rank=ctx.rank, world_size=ctx.world_size,
                                   tp=mesh.get("tp", 1), pp=mesh.get("pp", 1), ep=mesh.get("ep", 1),
                                   etp=mesh.get("etp"))
        self.bridge = TrainerBridge.from_spec(ctx.spec_path, rank=ctx.rank, tensors=self.tensors(),
                                              **ctx.bridge_kwargs())

    def hf_config(self, ctx: Any) -> Any:
        """The transformers config of the spec's model (``model.config`` or ``model.bundled``)."""
        from weightbridge.canonical.bundled import transformers_config

        return transformers_config(ctx.resolved().spec.model, os.path.dirname(ctx.spec_path))

    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self.world.tensors()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.world.load_full(weights)

    def push(self, version: int) -> Any:
        return self.bridge.push(version, tensors=self.tensors())

    def close(self) -> None:
        self.bridge.close()
        self.world.close()
