"""A ``vllm.LLM`` with weightbridge's backend on settings that run on a small CPU machine.

Used by the conformance unit (:mod:`weightbridge.integrations.vllm.conformance`), the selfchecks
and ``bench/vllm_update.py``: float32, eager, a 128-token context, at most 4 sequences, seed 0.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def make_llm(model_dir: str | Path, tp: int, *, in_process: bool = False, **kw: Any) -> Any:
    """A vLLM engine on the CPU settings that work here, with weightbridge's backend (its workers inherit
    the job secret: ``$WEIGHTBRIDGE_SECRET``, set to a fresh one here when unset).

    ``in_process``: vLLM's engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
    and, at TP 1, its one worker too (the ``uni`` executor); TP > 1 keeps vLLM's worker processes.
    Each process vLLM does not start saves a spawn and a vLLM import (~15-20 s on a small CPU
    machine); the weight-transfer protocol and ``collective_rpc`` are the same. (vLLM's own
    multiprocess engine core is exercised by ``vllm serve`` and ``AsyncLLM``.)
    """
    from weightbridge.localrun import ensure_env_secret

    ensure_env_secret()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if tp == 1:
            kw.setdefault("distributed_executor_backend", "uni")
    if tp == 2:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    from vllm import LLM
    from vllm.config import WeightTransferConfig

    from weightbridge.integrations.vllm import BACKEND, register

    register()  # an in-process worker: this process may have imported the package before vLLM

    kw.setdefault("dtype", "float32")  # FP8 engines pass bfloat16 (vLLM-CPU's FP8 kernels need it)
    return LLM(
        model=str(model_dir), tensor_parallel_size=tp, skip_tokenizer_init=True, enforce_eager=True,
        max_model_len=128, max_num_seqs=4, seed=0,
        weight_transfer_config=WeightTransferConfig(backend=BACKEND),
        worker_extension_cls="weightbridge.integrations.vllm.WorkerExtension", **kw,
    )
