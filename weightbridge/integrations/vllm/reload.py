"""Writing a rank's local tensors into a live vLLM model through vLLM's layerwise reload.

Runs inside a vLLM worker process (the weight-transfer engine calls it). Frame: the tensors
written are the rank's *checkpoint-format* local tensors (the names, shapes and dtypes vLLM's
``load_weights`` fills before ``process_weights_after_loading``: fused ``qkv_proj``,
``gate_up_proj``, ``mlp.experts.routed_experts.w13_weight``, vocab-parallel shards, ...), i.e. the
``vllm`` preset's local tensors and what probing vLLM's loader reports.

Why not copy into ``model.parameters()``: post-processing replaces them (on CPU linear weights
are prepacked for oneDNN and the parameters left empty; FP8 and other quantised layers do the
same on GPU), so an in-place write is not an update. Instead (vLLM's checkpoint-format reload):
``initialize_layerwise_reload`` restores checkpoint-format parameters on the meta device and
wraps their loaders; each wrapped load is buffered, and when a layer has all its elements it is
materialised, loaded, post-processed and copied into the kernel tensors the engine runs on.
weightbridge swaps the loader *inside* that wrapper for a plain copy of the whole local tensor,
so no HF-name routing runs and nothing is gathered.

Two vLLM 0.32 CPU defects hit every in-place reload (vLLM's own ``reload_weights`` too; see
docs/vllm_integration_notes.md §4.2) and are worked around here:

1. a tied ``lm_head`` keeps its old prepacked GEMM: re-process it after finalising;
2. CPU MoE layers skip their kernel's padding/prepacking on reload when ``moe_kernel`` is
   already set: drop ``moe_kernel`` before the reload so the first-load path runs, and put back
   any kernel a layer did not rebuild (a layer not updated this time);
3. MLA on AMX hosts (DeepSeek-V2/V3, Kimi-K2: the ``AMX_MLA`` backend) empties ``kv_b_proj.weight``
   after packing its own copies, so the reload's copy of the re-loaded ``[N, kv_lora_rank]`` weight
   into that empty kernel tensor fails ("The size of tensor a (0) must match the size of tensor b
   (512) at non-singleton dimension 1"): give ``kv_b_proj`` a kernel tensor of its checkpoint
   shape before the reload (MLA's re-processing packs from it and empties it again), and keep the
   packed copies of a layer whose ``kv_b_proj`` this reload does not write.

FP8 weights quantised at the sender for an engine that quantises online (``fp8`` names) do not go
through the layer's loader (it takes bf16): :class:`~weightbridge.integrations.vllm.fp8.OnlineFp8Writes`
writes those layers whole, inside the same reload (a streaming write holds a layer's tensors until
the last of them arrived).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def _direct_copy_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """A rank's local tensor as-is (checkpoint format, already sharded for this rank)."""
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ValueError(f"local tensor shape {tuple(loaded_weight.shape)} != parameter shape {tuple(param.shape)}")
    param.data.copy_(loaded_weight)


class ReloadSession:
    """One weight update of one vLLM model: ``begin()``, ``write(tensors)`` (any number), ``finish()``.

    Called by the worker's weight-transfer engine from ``start_weight_update`` /
    ``update_weights`` / ``finish_weight_update``; all in the worker's thread, between engine steps.
    """

    def __init__(self, model: torch.nn.Module, model_config: Any, fp8: frozenset[str] = frozenset(),
                 names: Iterable[str] = (), *, adopt: bool = False) -> None:
        """``fp8``: the local FP8 weight names this rank receives (quantised at the sender); ``names``:
        every local tensor this rank writes (a module's tensors then go in together, see :meth:`write`);
        ``adopt``: the tensors written are handed over (a streaming receive drops them), so vLLM's
        parameter may take them instead of copying (never a staging copy: it is kept and reused)."""
        self.model = model
        self.loader = self._adopting_loader if adopt else _direct_copy_loader
        self.model_config = model_config
        self.fp8 = fp8
        by_module: dict[str, set[str]] = {}
        for name in names:
            by_module.setdefault(name.rpartition(".")[0], set()).add(name)
        self._expected = {m: ns for m, ns in by_module.items() if len(ns) > 1}
        self._held: dict[str, dict[str, torch.Tensor]] = {}
        self._online: Any = None
        self._moe_kernels: list[tuple[Any, Any]] = []
        self._mla: list[_AmxMla] = []
        self._written: set[str] = set()
        self._loaders: list[tuple[torch.Tensor, Any]] = []
        self._swapped: set[int] = set()  # ids of the parameters in _loaders
        self._modules: dict[str, torch.nn.Module] | None = None  # the model's modules by name, once per session
        self._active = False

    def begin(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        for mod in self.model.modules():  # defect 2: force the first-load kernel setup
            qm = getattr(mod, "quant_method", None)
            kernel = getattr(qm, "moe_kernel", None)
            if kernel is not None:
                self._moe_kernels.append((qm, kernel))
                qm.moe_kernel = None
        self._mla = _AmxMla.prepare(self.model)  # defect 3
        try:
            initialize_layerwise_reload(self.model)
            if self.fp8:
                from weightbridge.integrations.vllm.fp8 import OnlineFp8Writes

                self._online = OnlineFp8Writes(self.model, set(self.fp8))
        except BaseException:
            self._put_back_kernels()
            for m in self._mla:
                m.restore()
            self._mla = []
            raise
        self._active = True

    def write(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Load whole local tensors (name -> tensor in this rank's checkpoint-format layout).

        A module's tensors (of ``names``) are held until the last of them arrived, then loaded in
        name order, the order of a checkpoint's keys: vLLM's layerwise reload processes a layer once
        the elements it counts have loaded, and a tensor loaded after that is dropped ("Excessive
        loading"). DeepSeek-V3's router lost its ``e_score_correction_bias`` so on the TP rank
        that received ``gate.weight`` first (streaming hands tensors over in arrival order). vLLM
        holds a layer's loaded tensors until it processes the layer anyway: no extra memory.

        Returns the number of elements written now. Raises ``KeyError`` naming a tensor the model
        does not have (the layout disagrees with the engine: probe it).
        """
        if not self._active:
            raise RuntimeError("ReloadSession.write() before begin()")
        ready: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            module = name.rpartition(".")[0]
            want = self._expected.get(module)
            if want is None or name not in want:
                ready[name] = tensor
                continue
            held = self._held.setdefault(module, {})
            held[name] = tensor
            if len(held) == len(want):
                ready.update(sorted(self._held.pop(module).items()))
        return self._load(ready)

    def _load(self, tensors: Mapping[str, torch.Tensor]) -> int:
        from vllm.model_executor.model_loader.reload.layerwise import (
            _get_original_loader,
            make_online_process_loader,
        )

        if self._modules is None:  # write() runs once per tensor when streaming: look the modules up once
            self._modules = dict(self.model.named_modules())
        modules = self._modules
        n = 0
        if self._online is not None:  # FP8 into layers that quantise online: written whole, elsewhere
            rest = self._online.take(tensors)
            n += sum(t.numel() for name, t in tensors.items() if name not in rest)
            tensors = rest
        for name, tensor in tensors.items():
            mod_name, _, pname = name.rpartition(".")
            mod = modules.get(mod_name)
            if mod is None or pname not in mod._parameters:
                raise KeyError(f"vLLM model has no checkpoint-format parameter {name!r}")
            param = mod._parameters[pname]
            # Swap the loader inside vLLM's buffering wrapper for a plain copy. The parameter is
            # vLLM's recorded metadata object (restored on meta; ``bias`` is the live one), reused
            # by every later reload: finish() puts the original loader back.
            if id(param) not in self._swapped:
                self._swapped.add(id(param))
                self._loaders.append((param, _get_original_loader(param)))
            param.weight_loader = self.loader
            param.weight_loader = make_online_process_loader(mod, pname)
            param.weight_loader(param, tensor)
            n += tensor.numel()
            self._written.add(name)
        return n

    def finish(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if not self._active:
            return
        try:
            for module in sorted(self._held):  # a module some of whose tensors this update did not write
                self._load(dict(sorted(self._held.pop(module).items())))
            if self._online is not None and self._online.unfinished():
                raise RuntimeError(f"FP8 layers not written whole this update: {self._online.unfinished()[:4]}")
            finalize_layerwise_reload(self.model, self.model_config)
            lm = getattr(self.model, "lm_head", None)  # defect 1
            tied = getattr(getattr(self.model_config, "hf_config", None), "tie_word_embeddings", False)
            if tied and lm is not None and hasattr(lm, "quant_method") and self._written:
                lm.quant_method.process_weights_after_loading(lm)
        finally:
            for m in self._mla:
                if m.weight_name not in self._written:  # its packs were re-made from the placeholder
                    m.restore()
                elif not m.kv.weight.numel():  # re-emptied under the reload's default dtype: the engine's own
                    m.kv.weight = m.empty
            self._mla = []
            for param, loader in self._loaders:
                param.weight_loader = loader
            self._loaders, self._swapped, self._modules, self._held = [], set(), None, {}
            self._put_back_kernels()
            self._active = False

    def _adopting_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        """As :func:`_direct_copy_loader`, but a parameter vLLM materialised for the module's processing
        takes the streamed tensor itself (the stream dropped it on handing it over), so the module's
        reload holds one copy of it instead of two while it post-processes (issue 28). The parameters
        :meth:`_load` saw (vLLM's meta records, counted by its copy-counting pass, and live kernel
        tensors such as a ``bias``, whose storage the engine keeps) are always copied into."""
        if (id(param) not in self._swapped and not param.is_meta and loaded_weight.device == param.device
                and loaded_weight.dtype == param.dtype and loaded_weight.is_contiguous()
                and tuple(param.shape) == tuple(loaded_weight.shape)):
            param.data = loaded_weight
            return
        _direct_copy_loader(param, loaded_weight)

    def _put_back_kernels(self) -> None:
        for qm, kernel in self._moe_kernels:
            if getattr(qm, "moe_kernel", None) is None:
                qm.moe_kernel = kernel
        self._moe_kernels = []


# The attributes of vLLM 0.32's AMXMLAImpl that hold its packed copies of kv_b_proj.
_AMX_PACKS = ("_w_uk_packed", "_w_uv_packed", "_w_scale")


class _AmxMla:
    """Defect 3: one ``MLAAttention`` layer whose AMX impl emptied ``kv_b_proj.weight`` (vLLM 0.32's
    ``MLAAttention.process_weights_after_loading``, ``is_amx_bmm_enabled``).

    :meth:`prepare` gives each such ``kv_b_proj`` a kernel tensor of its checkpoint-format shape
    (from vLLM's reload metadata) before ``initialize_layerwise_reload`` saves the kernel tensors:
    the reload then copies the re-loaded weight into it, and MLA's deferred re-processing packs from
    it and empties it again. :meth:`restore` puts back the packed copies and the empty weight (a
    reload that did not write this ``kv_b_proj`` re-packed from the placeholder's zeros).
    """

    def __init__(self, attn: torch.nn.Module, weight_name: str) -> None:
        self.attn = attn
        self.kv = attn.kv_b_proj
        self.weight_name = weight_name
        self.empty = self.kv.weight
        self.packs = {a: getattr(attn.impl, a) for a in _AMX_PACKS if hasattr(attn.impl, a)}

    @classmethod
    def prepare(cls, model: torch.nn.Module) -> list[_AmxMla]:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

        names = {id(m): n for n, m in model.named_modules()}
        out = []
        for mod in model.modules():
            kv = getattr(mod, "kv_b_proj", None)
            if not getattr(mod, "is_amx_bmm_enabled", False) or kv is None or kv.weight.numel():
                continue
            info = LAYERWISE_INFO.get(kv)
            meta = info.restore_metadata[0].get("weight") if info is not None else None
            if meta is None:
                continue
            m = cls(mod, f"{names.get(id(kv), '?')}.weight")
            kv.weight = torch.nn.Parameter(torch.zeros(meta.shape, dtype=meta.dtype, device=m.empty.device),
                                           requires_grad=False)
            out.append(m)
        return out

    def restore(self) -> None:
        for attr, value in self.packs.items():
            setattr(self.attn.impl, attr, value)
        self.kv.weight = self.empty
