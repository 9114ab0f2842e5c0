"""The check of a spec's rollout layout against the engine's own ``load_weights``, probed once and cached.

Runs in an engine worker at init. The engine-specific part (:mod:`weightbridge.integrations.vllm.probing`,
:mod:`weightbridge.integrations.sglang.probing`) builds a second copy of the worker's model class in
host memory (never on the engine's device, whose memory the engine has taken), probes its
``load_weights`` with :func:`weightbridge.probe.probe_loader`, and keys the cache by everything the
result depends on; :func:`check_against_engine` here reads the cache or probes,
then requires the probed layout to equal the spec's for this rank and any fingerprint the spec
pins, raising :class:`~weightbridge.errors.EngineMismatch` naming the rank otherwise.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weightbridge.errors import EngineMismatch
from weightbridge.layout.ir import RankLayout
from weightbridge.layout.normalize import layout_fingerprint

log = logging.getLogger(__name__)

CACHE_ENV = "WEIGHTBRIDGE_CACHE_DIR"
PROBE_DEVICE = "cpu"  # where the probed copy of the model lives (host memory; docs/memory.md)


def default_cache_dir(engine_dir: str) -> Path:
    """``$WEIGHTBRIDGE_CACHE_DIR`` (default ``~/.cache/weightbridge``) / ``engine_dir``."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "weightbridge")
    return Path(root) / engine_dir


def check_against_engine(me: str, engine: str, resolved: Any, layout: RankLayout, *, key: str, cache: Path,
                         probe: Callable[[], Any],
                         served: Callable[[RankLayout], RankLayout] | None = None) -> RankLayout:
    """The layout the engine's loader gives this rank (``cache/key.json``, else ``probe()``'s
    :class:`~weightbridge.probe.ProbeResult`, then cached); ``EngineMismatch`` on ``me`` unless it
    equals ``layout`` (the spec's) and the spec's pinned fingerprint, if any. ``engine``: its name
    in messages (``"vLLM"``). ``served``: how the receive buffers differ from the loader probed
    (an engine that quantises online was probed unquantised; the sender's FP8 arrives instead)."""
    from weightbridge.probe import read_probe_json, write_probe_json
    from weightbridge.probe.diff import diff_layouts, format_diff

    path = cache / f"{key}.json"
    probed: RankLayout | None = None
    if path.is_file():
        try:
            probed = read_probe_json(path)
            log.info("weightbridge: %s: probe read from cache %s", me, path)
        except (ValueError, KeyError) as exc:
            log.warning("weightbridge: %s: ignoring unreadable probe cache %s (%s)", me, path, exc)
    if probed is None:
        res = probe()
        if not res.ok:
            raise EngineMismatch(me, f"probing {engine}'s load_weights gave no clean layout:\n{res.summary()}")
        cache.mkdir(parents=True, exist_ok=True)
        write_probe_json(res, path)
        probed = res.layout
        log.info("weightbridge: %s: probed %s's loader (%s), cached at %s", me, engine, res.summary(), path)
    if served is not None:
        probed = served(probed)
    diffs = diff_layouts(layout, probed)
    if diffs:
        raise EngineMismatch(
            me, f"the spec's rollout layout (A) differs from what {engine}'s load_weights does (B) in {len(diffs)} "
            f"tensor(s):\n{format_diff(diffs, limit=5)}\n(fix the spec's rollout rules; probe JSON: {path})",
        )
    pinned = resolved.spec.rollout.pins.get(layout.local_rank)
    if pinned is not None and layout_fingerprint(probed) != pinned:
        raise EngineMismatch(
            me, f"{engine}'s loader now gives layout {layout_fingerprint(probed)}, the spec pins {pinned} for rank "
            f"{layout.local_rank}: the engine changed; re-probe and re-pin (probe JSON: {path})",
        )
    return probed


def probe_model(canonical: Any, layout: RankLayout, load_weights: Callable[[Any], Any],
                named_parameters: Callable[[], dict[str, Any]]) -> Any:
    """:func:`~weightbridge.probe.probe_loader` of a model copy's ``load_weights`` for this rank."""
    from weightbridge.probe import probe_loader

    return probe_loader(
        canonical, load_weights, named_parameters, side="rollout", rank=layout.rank,
        instance=layout.instance, local_rank=layout.local_rank, coords=dict(layout.coords),
        restore=False,  # a fresh copy, dropped after: nothing to restore (a backup would be one more shard)
    )


def probe_key_of(parts: dict[str, Any]) -> str:
    """The cache key of a probe: a hash of everything its result depends on (``parts``)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps({"format": 1, **parts}, sort_keys=True, default=str).encode()).hexdigest()[:24]


def canonical_parts(canonical: Any) -> list[tuple[str, list[int], Any]]:
    """The canonical tensors as part of a probe key."""
    return [(t.name, list(t.shape), t.dtype) for t in canonical.tensors]
