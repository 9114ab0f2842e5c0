"""An ``sglang.Engine`` with weightbridge's custom loader on settings that run on a small CPU machine.

Used by the conformance unit (:mod:`weightbridge.integrations.sglang.conformance`), the selfcheck
and ``bench/sglang_update.py``: :data:`ENGINE_ARGS` (float32, torch-native attention, no CUDA
graphs, 512 tokens) and :func:`cpu_env` (SGLang's CPU engine, one core per TP worker, only the
model modules the tests' models need).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENGINE_ARGS: dict[str, Any] = dict(
    device="cpu", dtype="float32", attention_backend="torch_native", sampling_backend="pytorch",
    disable_cuda_graph=True, skip_tokenizer_init=True, max_total_tokens=512, mem_fraction_static=0.05,
    random_seed=0, log_level="warning",
)


# The model modules the selfcheck's models need (Qwen2ForCausalLM, Qwen3MoeForCausalLM).
KEEP_MODEL_MODULES = frozenset({"qwen2", "qwen3_moe"})


def cpu_env(tp: int) -> None:
    """The environment SGLang needs on this CPU-only machine (RECIPES.md); set before it starts.

    Also, for start-up time only: SGLang's model registry imports all ~250 model modules in every
    scheduler process (tens of seconds on a small CPU machine); ``SGLANG_DISABLED_MODEL_ARCHS``
    (SGLang's own switch) skips those the tests' models do not use."""
    import importlib.util

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    if tp == 2:
        os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.origin and "SGLANG_DISABLED_MODEL_ARCHS" not in os.environ:
        models = Path(spec.origin).parent / "srt" / "models"
        keep = KEEP_MODEL_MODULES | {"__init__", "registry"}
        skip = sorted(p.stem for p in models.glob("*.py") if p.stem not in keep)
        os.environ["SGLANG_DISABLED_MODEL_ARCHS"] = ",".join(skip)


def make_engine(model_dir: str | Path, tp: int, **kw: Any) -> Any:
    """An ``sglang.Engine`` on the CPU settings that work here, with weightbridge's custom loader (its
    workers inherit the job secret: ``$WEIGHTBRIDGE_SECRET``, set to a fresh one here when unset)."""
    from weightbridge.integrations.sglang import engine_kwargs
    from weightbridge.localrun import ensure_env_secret

    ensure_env_secret()
    cpu_env(tp)
    import sglang

    return sglang.Engine(model_path=str(model_dir), tp_size=tp, **{**ENGINE_ARGS, **engine_kwargs(), **kw})
