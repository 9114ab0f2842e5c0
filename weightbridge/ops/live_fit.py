"""Fit a drafted spec to what live processes hold: the preset params that reproduce probed layouts.

:func:`fit_side` takes a spec text and, for one side, the layouts observed on live ranks (a
``weightbridge probe -o`` JSON per rank, or a trainer's introspected IR), tries the framework
facts a preset cannot know (:data:`VARIANTS`: Megatron's layer spec, expert MLP and ``etp``,
transformers 5's fused experts under FSDP2, SGLang's CPU padding), and returns the spec whose
expansion equals every observed rank, with those ranks' fingerprints pinned: it passes
``weightbridge probe --check`` against the same processes by construction, and ``validate``
no longer warns that the side was never checked. No variant reproducing the observation is a
:class:`FitError` naming the nearest candidate's differences. Pure: no torch (layouts are values).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from weightbridge.layout.ir import RankLayout
from weightbridge.layout.normalize import layout_fingerprint

#: preset -> the facts a live system decides: (where in the side, key, candidate values); the
#: first value is the preset's default (None: the key absent, so the preset's own derivation).
VARIANTS: dict[str, tuple[tuple[str, str, tuple[Any, ...]], ...]] = {
    "megatron": (("params", "local_spec", (False, True)), ("params", "moe_grouped_gemm", (True, False)),
                 ("mesh", "etp", (None, 1))),
    "fsdp2": (("params", "fused_experts", (False, True)),),
    "sglang": (("params", "cpu_pad", (False, True)),),
}


class FitError(ValueError):
    """No variant of the side's preset reproduces the observed layouts (the message says how close
    the nearest came)."""


@dataclass(frozen=True)
class Fit:
    text: str  # the spec, fitted and pinned
    chosen: dict[str, Any]  # "params.local_spec" -> value, for every fact the fit decided
    notes: list[str]  # one line per decided fact and per pin


def fit_side(text: str, side: str, observed: Mapping[int, RankLayout], *, base_dir: str | None = None) -> Fit:
    """``text`` with ``side``'s preset facts chosen to reproduce ``observed`` (rank -> layout; rollout:
    local rank within an instance) and those ranks pinned. Tries every combination of the preset's
    :data:`VARIANTS`, the preset's defaults first."""
    from weightbridge.spec.resolve import check_text

    if side not in ("trainer", "rollout") or not observed:
        raise ValueError("fit_side: side is trainer or rollout, with at least one observed rank")
    data = yaml.safe_load(text)
    preset = data[side].get("preset")
    knobs = VARIANTS.get(preset, ())
    nearest: tuple[int, str] | None = None
    for values in itertools.product(*(choices for _, _, choices in knobs)):
        trial = copy.deepcopy(data)
        chosen = {}
        for (where, key, _), value in zip(knobs, values):
            section = trial[side].setdefault(where, {})
            if value is None:
                section.pop(key, None)
            else:
                section[key] = value
            chosen[f"{where}.{key}"] = value
        resolved, problems = check_text(yaml.safe_dump(trial, sort_keys=False), "<fit>", base_dir=base_dir)
        if problems or resolved is None:
            continue
        layouts = resolved.side(side).ranks
        bad = [r for r, lay in observed.items()
               if r >= len(layouts) or layout_fingerprint(layouts[r]) != layout_fingerprint(lay)]
        if not bad:
            trial[side]["pins"] = {r: layout_fingerprint(observed[r]) for r in sorted(observed)}
            for (where, _, _) in knobs:
                if not trial[side].get(where):
                    trial[side].pop(where, None)
            notes = [f"{side}.{k}: {'derived (absent)' if v is None else v} (reproduces the observed ranks "
                     f"{sorted(observed)})" for k, v in chosen.items()]
            notes.append(f"{side}.pins: the observed fingerprints of ranks {sorted(observed)}")
            return Fit(_header(text) + yaml.safe_dump(trial, sort_keys=False, default_flow_style=None), chosen, notes)
        if nearest is None or len(bad) < nearest[0]:
            nearest = (len(bad), _difference(layouts, observed, bad[0], chosen))
    why = nearest[1] if nearest else "no variant of the spec resolves"
    raise FitError(f"{side}: no variant of the {preset} preset ({', '.join(f'{w}.{k}' for w, k, _ in knobs) or 'none'}) "
                   f"reproduces the observed layouts; nearest: {why} (write rules for what differs)")


def _difference(layouts: Any, observed: Mapping[int, RankLayout], rank: int, chosen: dict[str, Any]) -> str:
    from weightbridge.probe.diff import diff_layouts, format_diff

    if rank >= len(layouts):
        return f"{chosen}: no rank {rank} in the spec"
    text = format_diff(diff_layouts(observed[rank], layouts[rank]))
    return f"{chosen}, rank {rank}: " + " | ".join(text.splitlines()[:4])


def _header(text: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        lines.append(line)
    return "".join(lines) + "# Fitted to live ranks (weightbridge.ops.live_fit): see pins.\n"
