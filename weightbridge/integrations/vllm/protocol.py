"""The values weightbridge puts into vLLM's weight-update protocol, shared by every driver.

vLLM's protocol is the same whatever holds the engine (``LLM``, ``AsyncLLM`` or ``vllm serve``'s
HTTP routes): ``init_weight_transfer_engine(init_info)`` once, then per update
``start_weight_update`` / ``update_weights(update_info)`` / ``finish_weight_update(weight_version)``.
This module builds those values (no I/O, no vLLM import; ``init_info`` is the sealed init command
every engine integration shares, :mod:`weightbridge.integrations._engine.init_command`);
:mod:`.driver` (``LLM``), :mod:`.async_driver` (``AsyncLLM``) and :mod:`.server` (HTTP) send them.

Version labels: the driver passes the version the workers applied (read back from the bridge,
never assumed) as ``weight_version``, ``str(v)``. vLLM stamps every engine step's outputs with the
label current at that step and reports, per finished completion, which output tokens were sampled
under which label (``CompletionOutput.weight_versions``: spans ``[start, end)``; the
``/inference/v1/generate`` route returns the same spans as JSON). The label changes in the engine
core only when ``finish_weight_update`` sets it, so it is exact only if no engine step runs between
the weights changing and the label changing: the online drivers therefore update inside vLLM's
``pause_generation`` / ``resume_generation`` (:data:`PAUSE_MODES`). :func:`version_spans` reads the
spans back as integer versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# vLLM's pause modes (``AsyncLLM.pause_generation(mode=...)``, ``POST /pause?mode=``): what happens
# to requests in flight when an update starts.
#   keep:  frozen where they are; they continue after the update (their later tokens come from the
#          new weights; with clear_cache their KV cache is dropped and recomputed by the new weights,
#          without it they keep attending to the KV the old weights computed)
#   wait:  the update waits until they finished (entirely on the old weights)
#   abort: they end at once (finish_reason "abort"), with the tokens they had
PAUSE_MODES = ("keep", "wait", "abort")
BACKEND = "weightbridge"  # vLLM's weight_transfer_config.backend that selects weightbridge's engine
INITIAL_LABEL = "default"  # vLLM's label before any finish_weight_update / update_weight_version


def update_info(version: int | None, timeout_s: float) -> dict[str, Any]:
    """``update_weights``' payload: apply ``version`` (None: the newest complete one, no wait)."""
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValueError(f"version must be a non-negative int or None, got {version!r}")
    return {"version": version, "timeout_s": float(timeout_s)}


def label(version: int | None) -> str | None:
    """The ``weight_version`` label of an applied version (None: leave vLLM's label as it is)."""
    return None if version is None else str(version)


def check_pause(mode: str) -> str:
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause must be one of {PAUSE_MODES}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class VersionSpan:
    """Output tokens ``[start, end)`` of one completion were sampled with weight version ``version``
    (None: the engine's weights before its first update, label ``"default"``; ``label``: vLLM's text)."""

    version: int | None
    start: int
    end: int
    label: str


def version_spans(completion: Any) -> list[VersionSpan]:
    """The weight versions that generated a finished completion, as spans over its output tokens.

    ``completion``: a ``vllm.CompletionOutput`` (from ``LLM``/``AsyncLLM``), or one choice of
    ``/inference/v1/generate``'s JSON (a dict with ``weight_versions``). Raises ``ValueError``
    when the completion carries no spans (not finished, or vLLM reported no label) or a label that
    is not a version this module wrote.
    """
    raw = completion.get("weight_versions") if isinstance(completion, dict) else getattr(completion, "weight_versions", None)
    if not raw or not isinstance(raw, (list, tuple)):
        raise ValueError("the completion has no weight_versions (not finished, or no label was reported)")
    spans: list[VersionSpan] = []
    for item in raw:
        try:
            text, start, end = (item["version"], item["start"], item["end"]) if isinstance(item, dict) else (
                item.version, item.start, item.end)
        except (KeyError, AttributeError, TypeError):
            raise ValueError(f"not a weight version span: {item!r}"[:200]) from None
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)) or not (
                (spans[-1].end if spans else 0) == start < end):
            raise ValueError(f"spans must tile the output tokens from 0: {item!r} after {spans[-1:]}"[:300])
        if text == INITIAL_LABEL:
            version = None
        elif isinstance(text, str) and text.isascii() and text.isdigit() and len(text) < 20:
            version = int(text)
        else:
            raise ValueError(f"weight version label {text!r} is neither {INITIAL_LABEL!r} nor a version"[:200])
        spans.append(VersionSpan(version, start, end, text))
    return spans
