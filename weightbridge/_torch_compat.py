"""Every private torch (and vLLM) API weightbridge calls, in one place, checked at import.

Private names change between releases without notice. Each one the library uses is wrapped here
(callers never touch them directly) and listed in :data:`APIS` with what uses it and what happens
without it. At import the installed torch is checked against :data:`TESTED`: every listed torch API
that applies to this build must be present (an NCCL API only where torch was built with NCCL). A
missing one is reported once as a :class:`CompatWarning` naming it, the installed and the tested
version; calling a wrapper whose API is missing raises :class:`UnsupportedTorch` (an ``ImportError``)
saying the same, where a fallback does not exist. vLLM is checked when its API is first used (it
is heavy and optional).

``bench/gpu_readiness.py`` calls every wrapper on a real one-rank NCCL group on a GPU machine.
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# The versions these wrappers were written and tested against (major.minor).
TESTED = {"torch": "2.13", "vllm": "0.32"}


class CompatWarning(UserWarning):
    """The installed torch or vLLM lacks a private API weightbridge uses (see the message)."""


class UnsupportedTorch(ImportError):
    """A private API weightbridge needs is missing from the installed torch or vLLM."""


@dataclass(frozen=True)
class PrivateApi:
    name: str  # how the API is written ("ProcessGroupNCCL._start_coalescing")
    package: str  # "torch" | "vllm"
    used_by: str
    needs: str = ""  # "nccl": applies only to torch builds with NCCL
    fallback: str = ""  # what the wrapper does without it ("": raises UnsupportedTorch)


APIS = (
    PrivateApi("Backend._start_coalescing", "torch", "transport/comm.py: each NCCL wave as one coalesced P2P batch"),
    PrivateApi("Backend._end_coalescing", "torch", "transport/comm.py: the batch's Work, polled for completion"),
    PrivateApi("ProcessGroupGloo._Options", "torch", "transport/group.py: Gloo listening on 127.0.0.1 only",
               fallback="Gloo listens on the hostname's address"),
    PrivateApi("Backend.Options._timeout", "torch", "transport/group.py: the backends' own op timeout"),
    PrivateApi("ProcessGroupNCCL.Options.config.blocking", "torch",
               "transport/group.py: non-blocking communicator init, abortable at the deadline", needs="nccl"),
    PrivateApi("Tensor._version", "torch", "transport/executor.py: was a delta destination written by others",
               fallback="tensors without a counter compare by identity only"),
    PrivateApi("torch._foreach_copy_", "torch", "tensors.py: one batched copy for many small plan items",
               fallback="one copy_ per item"),
    PrivateApi("WeightTransferEngineFactory._registry", "vllm", "integrations/vllm: register the backend once",
               fallback="register_engine's own duplicate check"),
)


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def nccl_available() -> bool:
    return bool(getattr(dist, "is_nccl_available", lambda: False)()) and hasattr(dist, "ProcessGroupNCCL")


def _present(api: PrivateApi) -> bool | None:
    """Whether the installed torch has ``api`` (None: not applicable to this build, or not a torch API)."""
    if api.package != "torch":
        return None
    if api.needs == "nccl" and not nccl_available():
        return None
    backend = getattr(torch._C._distributed_c10d, "Backend", None)
    checks = {
        "Backend._start_coalescing": lambda: hasattr(backend, "_start_coalescing"),
        "Backend._end_coalescing": lambda: hasattr(backend, "_end_coalescing"),
        "ProcessGroupGloo._Options": lambda: hasattr(getattr(dist, "ProcessGroupGloo", None), "_Options"),
        "Backend.Options._timeout": lambda: hasattr(getattr(backend, "Options", None), "_timeout"),
        "ProcessGroupNCCL.Options.config.blocking": lambda: hasattr(dist.ProcessGroupNCCL.Options().config, "blocking"),
        "Tensor._version": lambda: hasattr(torch.Tensor, "_version"),
        "torch._foreach_copy_": lambda: hasattr(torch, "_foreach_copy_"),
    }
    try:
        return bool(checks[api.name]())
    except Exception:  # noqa: BLE001 - a probe that fails means the API is not usable as written
        return False


def check() -> dict[str, bool | None]:
    """``{api name: present (None: not applicable here)}`` for every torch API of :data:`APIS`; warns once
    (:class:`CompatWarning`) about the missing ones."""
    found = {api.name: _present(api) for api in APIS if api.package == "torch"}
    missing = [name for name, ok in found.items() if ok is False]
    if missing:
        warnings.warn(f"torch {torch.__version__} lacks {', '.join(missing)} (weightbridge was tested with torch "
                      f"{TESTED['torch']}); the parts that need them raise UnsupportedTorch", CompatWarning,
                      stacklevel=2)
    return found


PRESENT = check()
TORCH_TESTED = _minor(torch.__version__) == TESTED["torch"]  # the installed torch is the tested minor version


def _need(name: str) -> None:
    if PRESENT.get(name) is False:
        raise UnsupportedTorch(f"weightbridge needs {name}, which torch {torch.__version__} lacks (tested with "
                               f"torch {TESTED['torch']}): install torch {TESTED['torch']}")


# -- process groups ---------------------------------------------------------------------------------
def start_coalescing(pg: Any) -> None:
    """Open a coalesced batch on backend ``pg`` (its P2P ops then go as one NCCL group call)."""
    _need("Backend._start_coalescing")
    pg._start_coalescing()


def end_coalescing(pg: Any) -> Any:
    """Close the batch :func:`start_coalescing` opened; the batch's ``Work``."""
    _need("Backend._end_coalescing")
    return pg._end_coalescing()


def gloo_options(timeout: datetime.timedelta, hostname: str) -> Any:
    """``ProcessGroupGloo`` options listening on ``hostname`` only, or None without ``_Options`` (the
    caller then uses the public constructor, which listens on the hostname's address)."""
    if not PRESENT.get("ProcessGroupGloo._Options"):
        return None
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
    return opts


def nccl_class() -> Any:
    """``ProcessGroupNCCL``; ``ValueError`` on a torch built without NCCL."""
    if not nccl_available():
        raise ValueError("this torch build has no NCCL backend")
    return dist.ProcessGroupNCCL


def nccl_options(timeout: datetime.timedelta, *, nonblocking: bool = True, name: str = "weightbridge") -> Any:
    """``ProcessGroupNCCL.Options``: the watchdog's ``timeout``, and ``nonblocking`` communicator init (NCCL's
    ``blocking = 0``: torch keeps a communicator being initialised where ``abort()`` reaches it)."""
    opts = nccl_class().Options()
    opts._timeout = timeout
    if nonblocking:
        _need("ProcessGroupNCCL.Options.config.blocking")
        opts.config.blocking = 0
    try:
        opts.group_name = name
    except (AttributeError, TypeError):  # builds without it
        pass
    return opts


# -- tensors -----------------------------------------------------------------------------------------
def version_counter(t: torch.Tensor) -> int | None:
    """Torch's in-place version counter of ``t``; None for tensors without one (inference mode)."""
    if not PRESENT.get("Tensor._version"):
        return None
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter."
        return None


def foreach_copy(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """``dsts[i].copy_(srcs[i])`` for every ``i``, as one batched call (one kernel for many small tensors
    on CUDA where they qualify for torch's fast path; one C++ loop otherwise)."""
    if not dsts:
        return
    if PRESENT.get("torch._foreach_copy_"):
        torch._foreach_copy_(list(dsts), list(srcs))
        return
    for d, s in zip(dsts, srcs):
        d.copy_(s)


# -- vLLM -----------------------------------------------------------------------------------------------
def vllm_engine_registered(factory: Any, name: str) -> bool:
    """Whether vLLM's ``WeightTransferEngineFactory`` has an engine ``name`` (its ``_registry``). Without
    the registry: False (``register_engine`` then refuses a duplicate itself, which the caller handles)."""
    registry = getattr(factory, "_registry", None)
    if not isinstance(registry, dict):
        import vllm

        warnings.warn(f"vLLM {getattr(vllm, '__version__', '?')} has no WeightTransferEngineFactory._registry "
                      f"(weightbridge was tested with vLLM {TESTED['vllm']})", CompatWarning, stacklevel=2)
        return False
    return name in registry


__all__ = ["APIS", "PRESENT", "TESTED", "TORCH_TESTED", "CompatWarning", "PrivateApi", "UnsupportedTorch", "check", "end_coalescing",
           "foreach_copy", "gloo_options", "nccl_available", "nccl_class", "nccl_options", "start_coalescing",
           "version_counter", "vllm_engine_registered"]
