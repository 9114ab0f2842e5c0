"""A zoo of synthetic loaders that mimic real engines (each holds parameters and has
``load_weights(iterable of (name, tensor))``), plus small canonical models for them.

* :class:`VllmLike` — vLLM model runner rank: fused qkv (TP heads, KV heads replicated
  when tp > kv heads), fused gate_up, vocab-parallel padded embedding / lm_head, FusedMoE
  ``w13_weight [E, 2I/tp, H]`` / ``w2_weight [E, H, I/tp]``, replicated norms, q/k norm and
  router; PP by layer range; optional per-parameter dtypes (casts).
* :class:`MegatronLike` — Megatron-Core TP rank: interleaved GQA ``linear_qkv``, fused
  ``linear_fc1``, padded vocab, input norms fused into the next linear.
* :class:`HfLike` — a whole HF model; tied ``lm_head`` (one canonical -> two destinations),
  optional transposed storage of some weights, optional numerical changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from weightbridge.canonical.inline import from_inline
from weightbridge.layout.expand import expand_side
from weightbridge.layout.ir import CanonicalModel, SideLayout
from weightbridge.spec.models import SideSpec
from weightbridge.spec.sides import side_config
from weightbridge.tensors import torch_dtype

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def qwen_like(
    *,
    vocab=100,
    hidden=32,
    heads=4,
    kv=2,
    head_dim=8,
    inter=48,
    layers=2,
    bias=True,
    tied=False,
    experts=0,
    moe_inter=16,
    qk_norm=False,
    dtype="bfloat16",
) -> CanonicalModel:
    """An inline canonical model in HF naming (Qwen2 / Qwen3 / Qwen3-MoE / Llama style)."""
    ts = [("model.embed_tokens.weight", [vocab, hidden]), ("model.norm.weight", [hidden])]
    if not tied:
        ts.append(("lm_head.weight", [vocab, hidden]))
    for i in range(layers):
        p = f"model.layers.{i}."
        ts += [(p + "input_layernorm.weight", [hidden]), (p + "post_attention_layernorm.weight", [hidden])]
        for n, rows in (("q", heads * head_dim), ("k", kv * head_dim), ("v", kv * head_dim)):
            ts.append((p + f"self_attn.{n}_proj.weight", [rows, hidden]))
            if bias:
                ts.append((p + f"self_attn.{n}_proj.bias", [rows]))
        ts.append((p + "self_attn.o_proj.weight", [hidden, heads * head_dim]))
        if qk_norm:
            ts += [(p + "self_attn.q_norm.weight", [head_dim]), (p + "self_attn.k_norm.weight", [head_dim])]
        if experts:
            ts.append((p + "mlp.gate.weight", [experts, hidden]))
            for e in range(experts):
                q = p + f"mlp.experts.{e}."
                ts += [(q + "gate_proj.weight", [moe_inter, hidden]), (q + "up_proj.weight", [moe_inter, hidden])]
                ts.append((q + "down_proj.weight", [hidden, moe_inter]))
        else:
            ts += [(p + "mlp.gate_proj.weight", [inter, hidden]), (p + "mlp.up_proj.weight", [inter, hidden])]
            ts.append((p + "mlp.down_proj.weight", [hidden, inter]))
    params = {"num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim, "tie_word_embeddings": tied}
    return from_inline([{"name": n, "shape": s, "dtype": dtype} for n, s in ts], params)


def expand(preset: str, mesh: dict, model: CanonicalModel, side: str = "rollout", **spec) -> SideLayout:
    """A preset's layouts for ``model`` exactly as a spec would expand them."""
    layout, problems = expand_side(side_config(side, SideSpec(preset=preset, mesh=mesh, **spec)), model)
    assert not problems, problems
    return layout


class Engine(nn.Module):
    """Holds parameters by their local (dotted) names; counts ``load_weights`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self._p: dict[str, nn.Parameter] = {}
        self.calls = 0

    def add(self, name: str, shape, dtype=torch.bfloat16) -> None:
        p = nn.Parameter(torch.randn(*shape).to(dtype), requires_grad=False)
        self._p[name] = p
        self.register_parameter(name.replace(".", "__"), p)

    def params(self) -> dict[str, torch.Tensor]:
        return dict(self._p)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.calls += 1
        with torch.no_grad():
            for name, w in weights:
                self.load_one(name, w)

    def load_one(self, name: str, w: torch.Tensor) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


class VllmLike(Engine):
    def __init__(
        self, m: CanonicalModel, tp=1, rank=0, *, vocab_multiple=64, layers=None, first=True, last=True, dtypes=None
    ):
        super().__init__()
        P = m.param_dict
        self.tp, self.rank = tp, rank
        self.nh, self.nkv, self.hd = P["num_heads"], P["num_kv_heads"], P["head_dim"]
        H, V = m["model.embed_tokens.weight"].shape[1], m["model.embed_tokens.weight"].shape[0]
        self.V, self.vl = V, _ceil_to(V, vocab_multiple) // tp
        self.ql = self.nh // tp * self.hd
        self.kvh = max(1, self.nkv // tp)
        self.kvl = self.kvh * self.hd
        self.layers = range(P["num_layers"]) if layers is None else layers
        dt = dtypes or {}
        cdt = torch_dtype(m["model.embed_tokens.weight"].dtype)

        def add(name, shape):
            self.add(name, shape, dt.get(name, dt.get("*", cdt)))

        if first:
            add("model.embed_tokens.weight", (self.vl, H))
        if last:
            add("model.norm.weight", (H,))
            if "lm_head.weight" in m:
                add("lm_head.weight", (self.vl, H))
        for i in self.layers:
            p = f"model.layers.{i}."
            add(p + "input_layernorm.weight", (H,))
            add(p + "post_attention_layernorm.weight", (H,))
            add(p + "self_attn.qkv_proj.weight", (self.ql + 2 * self.kvl, H))
            if p + "self_attn.q_proj.bias" in m:
                add(p + "self_attn.qkv_proj.bias", (self.ql + 2 * self.kvl,))
            add(p + "self_attn.o_proj.weight", (H, self.ql))
            if p + "self_attn.q_norm.weight" in m:
                add(p + "self_attn.q_norm.weight", (self.hd,))
                add(p + "self_attn.k_norm.weight", (self.hd,))
            if p + "mlp.gate.weight" in m:
                E, I = m[p + "mlp.gate.weight"].shape[0], m[p + "mlp.experts.0.up_proj.weight"].shape[0]
                self.il_moe = I // tp
                add(p + "mlp.gate.weight", (E, H))
                add(p + "mlp.experts.routed_experts.w13_weight", (E, 2 * self.il_moe, H))
                add(p + "mlp.experts.routed_experts.w2_weight", (E, H, self.il_moe))
            else:
                I = m[p + "mlp.up_proj.weight"].shape[0]
                self.il = I // tp
                add(p + "mlp.gate_up_proj.weight", (2 * self.il, H))
                add(p + "mlp.down_proj.weight", (H, self.il))

    def _vocab(self, name, w):
        if name in self._p:
            a = self.rank * self.vl
            b = min(self.V, a + self.vl)
            p = self._p[name]
            p[: max(0, b - a)].copy_(w[a:b])
            p[max(0, b - a) :].zero_()  # vLLM zeroes the padding rows

    def load_one(self, name, w):
        r, tp = self.rank, self.tp
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return self._vocab(name, w)
        if name == "model.norm.weight":
            if name in self._p:
                self._p[name].copy_(w)
            return
        mt = _LAYER.match(name)
        if not mt or int(mt.group(1)) not in self.layers:
            return  # another pipeline stage's layer
        p, rest = f"model.layers.{mt.group(1)}.", mt.group(2)
        am = re.match(r"self_attn\.([qkv])_proj\.(weight|bias)$", rest)
        if am:
            part, kind = am.groups()
            dst = self._p[p + f"self_attn.qkv_proj.{kind}"]
            if part == "q":
                dst[0 : self.ql].copy_(w[r * self.ql : (r + 1) * self.ql])
            else:
                h0 = r * self.kvh if self.nkv >= tp else r // (tp // self.nkv)
                off = self.ql if part == "k" else self.ql + self.kvl
                dst[off : off + self.kvl].copy_(w[h0 * self.hd : h0 * self.hd + self.kvl])
            return
        if rest == "self_attn.o_proj.weight":
            self._p[p + rest].copy_(w[:, r * self.ql : (r + 1) * self.ql])
            return
        gm = re.match(r"mlp\.(gate|up)_proj\.weight$", rest)
        if gm:
            dst = self._p[p + "mlp.gate_up_proj.weight"]
            off = 0 if gm.group(1) == "gate" else self.il
            dst[off : off + self.il].copy_(w[r * self.il : (r + 1) * self.il])
            return
        if rest == "mlp.down_proj.weight":
            self._p[p + rest].copy_(w[:, r * self.il : (r + 1) * self.il])
            return
        em = re.match(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", rest)
        if em:
            e, kind = int(em.group(1)), em.group(2)
            il = self.il_moe
            if kind == "down":
                self._p[p + "mlp.experts.routed_experts.w2_weight"][e].copy_(w[:, r * il : (r + 1) * il])
            else:
                off = 0 if kind == "gate" else il
                self._p[p + "mlp.experts.routed_experts.w13_weight"][e, off : off + il].copy_(w[r * il : (r + 1) * il])
            return
        self._p[name].copy_(w)  # norms, q_norm / k_norm, router: replicated


class MegatronLike(Engine):
    """Megatron-Core GPT rank (TE layer spec), no PP: local layer index = global."""

    def __init__(self, m: CanonicalModel, tp: int = 1, rank: int = 0, *, vocab_multiple=128):
        super().__init__()
        P = m.param_dict
        self.tp, self.rank = tp, rank
        nh, nkv, hd = P["num_heads"], P["num_kv_heads"], P["head_dim"]
        self.hd, self.qpg, self.ngl = hd, nh // nkv, nkv // tp
        self.gl = (self.qpg + 2) * hd  # rows of one query group
        V, H = m["model.embed_tokens.weight"].shape
        self.V, self.vl = V, _ceil_to(V, vocab_multiple * tp) // tp
        self.add("embedding.word_embeddings.weight", (self.vl, H))
        self.add("output_layer.weight", (self.vl, H))
        self.add("decoder.final_layernorm.weight", (H,))
        for i in range(P["num_layers"]):
            d = f"decoder.layers.{i}."
            self.il = m[f"model.layers.{i}.mlp.up_proj.weight"].shape[0] // tp
            self.add(d + "self_attention.linear_qkv.weight", (self.ngl * self.gl, H))
            self.add(d + "self_attention.linear_qkv.layer_norm_weight", (H,))
            self.add(d + "self_attention.linear_proj.weight", (H, nh * hd // tp))
            self.add(d + "mlp.linear_fc1.weight", (2 * self.il, H))
            self.add(d + "mlp.linear_fc1.layer_norm_weight", (H,))
            self.add(d + "mlp.linear_fc2.weight", (H, self.il))
        self.qcols = nh * hd // tp

    def load_one(self, name, w):
        r = self.rank
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            dst = self._p["embedding.word_embeddings.weight" if name.startswith("model") else "output_layer.weight"]
            a, b = r * self.vl, min(self.V, (r + 1) * self.vl)
            dst[: max(0, b - a)].copy_(w[a:b])
            return
        if name == "model.norm.weight":
            self._p["decoder.final_layernorm.weight"].copy_(w)
            return
        mt = _LAYER.match(name)
        d, rest = f"decoder.layers.{mt.group(1)}.", mt.group(2)
        am = re.match(r"self_attn\.([qkv])_proj\.weight$", rest)
        if am:
            dst = self._p[d + "self_attention.linear_qkv.weight"]
            for g in range(self.ngl):
                G = r * self.ngl + g
                base = g * self.gl
                if am.group(1) == "q":
                    n = self.qpg * self.hd
                    dst[base : base + n].copy_(w[G * n : (G + 1) * n])
                else:
                    off = base + self.qpg * self.hd + (0 if am.group(1) == "k" else self.hd)
                    dst[off : off + self.hd].copy_(w[G * self.hd : (G + 1) * self.hd])
            return
        simple = {
            "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
        }
        if rest in simple:
            self._p[d + simple[rest]].copy_(w)
        elif rest == "self_attn.o_proj.weight":
            self._p[d + "self_attention.linear_proj.weight"].copy_(w[:, r * self.qcols : (r + 1) * self.qcols])
        elif rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            off = 0 if "gate" in rest else self.il
            self._p[d + "mlp.linear_fc1.weight"][off : off + self.il].copy_(w[r * self.il : (r + 1) * self.il])
        elif rest == "mlp.down_proj.weight":
            self._p[d + "mlp.linear_fc2.weight"].copy_(w[:, r * self.il : (r + 1) * self.il])
        else:
            raise KeyError(name)


class HfLike(Engine):
    """Whole HF model. ``transposed``: local names stored as ``w.T``; ``scale``/``shift``: names
    the loader changes numerically (``w * 2`` / ``w + 1``); tied lm_head when the model has none."""

    def __init__(self, m: CanonicalModel, *, transposed=(), scale=(), shift=(), dtypes=None):
        super().__init__()
        self.transposed, self.scale, self.shift = set(transposed), set(scale), set(shift)
        dt = dtypes or {}
        for t in m.tensors:
            shape = tuple(reversed(t.shape)) if t.name in self.transposed else t.shape
            self.add(t.name, shape, dt.get(t.name, torch_dtype(t.dtype)))
        self.tied = "lm_head.weight" not in m
        if self.tied:
            emb = m["model.embed_tokens.weight"]
            self.add("lm_head.weight", emb.shape, torch_dtype(emb.dtype))

    def load_one(self, name, w):
        if name in self.transposed:
            w = w.T
        if name in self.scale:
            w = w * 2
        if name in self.shift:
            w = w + 1
        self._p[name].copy_(w)
        if self.tied and name == "model.embed_tokens.weight":
            self._p["lm_head.weight"].copy_(w)


def vllm_factory(resolved, side: str, rank: int) -> VllmLike:
    """``weightbridge probe --loader tests.probe._zoo:vllm_factory``: a vLLM-like rank of the spec's rollout."""
    mesh = resolved.spec.rollout.mesh
    tp = mesh.get("tp", 1)
    return VllmLike(resolved.canonical, tp, rank % tp)
