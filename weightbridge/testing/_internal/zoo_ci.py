"""Which zoo cases a CI run executes: every architecture in every week of submissions, within CI's time.

All cases (every :data:`~weightbridge.testing._internal.zoo_models.ARCHS` entry at each TP it runs,
plus the forced-AMX DeepSeek-V3 cases on hosts without AMX tiles) take about 25-30 minutes of engine
time on a 2-core machine (below); CI has a few minutes for them. So:

* :data:`ALWAYS` runs in every CI run: DeepSeek-V3 (MLA + MoE) at TP 1 and TP 2 (the issue's
  "in CI"), on the host's own MLA backend, and at TP 1 on ``AMX_MLA`` forced when the host has
  no AMX (the reload workaround of ``integrations/vllm/reload.py`` needs that backend);
* the other cases (42) are dealt round-robin, in a fixed order, into :data:`SLICES` slices of three;
  a run takes slice ``key % SLICES`` where ``key`` is the number of commits of the checkout
  (``git rev-list --count HEAD``). Each commit moves the key by one, so every case runs in any
  :data:`SLICES` CI runs of consecutive commits, and in a week's submissions as long as they hold
  14 commits and CI runs on each merge (main got 140 commits in the week to 2026-12-05); a merge of
  several commits skips slices, which the next ones take. Without git the key is the UTC day number.
  A nightly ``WEIGHTBRIDGE_ZOO=all`` run (about half an hour here) checks every case at once.

Cost per CI run (measured 2026-12-05 on the 2-core development machine, one engine at a time, other
tests running beside): a case takes 17-32 s at TP 1 and 27-63 s at TP 2 (DeepSeek-V3: 26 s TP 1,
63 s TP 2, 32 s forced AMX), so the three every-run cases about 2 minutes and the three rotating
ones at most 3 more, on one xdist worker each file: about 3-4 minutes of phase 2's wall time.

``WEIGHTBRIDGE_ZOO`` overrides: ``all`` (every case), ``slice:K``, ``none``, or a comma list of
``ARCH:TP`` / ``ARCH`` (all its TPs) / ``ARCH:TP:amx``.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

from weightbridge.testing._internal.zoo_models import ARCHS

SLICES = 14
ENV = "WEIGHTBRIDGE_ZOO"


class Case(NamedTuple):
    arch: str
    tp: int
    amx: bool = False  # force vLLM-CPU's AMX_MLA backend (zoo_check.force_amx_mla)

    @property
    def id(self) -> str:
        return f"{self.arch}-tp{self.tp}" + ("-amx" if self.amx else "")


def all_cases(host_has_amx: bool) -> list[Case]:
    cases = [Case(a.name, tp) for a in ARCHS.values() for tp in a.tps]
    if not host_has_amx:  # on an AMX host the plain MLA cases already run the AMX backend
        cases += [Case("deepseek-v3", 1, True), Case("deepseek-v3", 2, True)]
    return cases


def always(host_has_amx: bool) -> list[Case]:
    out = [Case("deepseek-v3", 1), Case("deepseek-v3", 2)]
    if not host_has_amx:
        out.append(Case("deepseek-v3", 1, True))
    return out


def rotation_key(root: str | Path) -> int:
    try:
        out = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return int(out.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return datetime.datetime.now(datetime.timezone.utc).date().toordinal()


def slice_of(cases: list[Case], host_has_amx: bool, k: int) -> list[Case]:
    """Slice ``k`` (of :data:`SLICES`) of the cases not in :func:`always`, dealt round-robin."""
    pool = [c for c in cases if c not in always(host_has_amx)]
    return [c for i, c in enumerate(pool) if i % SLICES == k % SLICES]


def selected(root: str | Path, host_has_amx: bool, env: str | None = None) -> list[Case]:
    """The cases this run executes (see the module doc): :func:`always` first."""
    cases = all_cases(host_has_amx)
    env = os.environ.get(ENV, "") if env is None else env
    if env == "all":
        return cases
    if env == "none":
        return []
    if env.startswith("slice:"):
        return always(host_has_amx) + slice_of(cases, host_has_amx, int(env.split(":", 1)[1]))
    if env:
        wanted = []
        for item in env.split(","):
            name, _, rest = item.strip().partition(":")
            tp, _, amx = rest.partition(":")
            if name not in ARCHS:
                raise ValueError(f"{ENV}: unknown architecture {name!r} (known: {', '.join(ARCHS)})")
            tps = [int(tp)] if tp else list(ARCHS[name].tps)
            wanted += [Case(name, t, amx == "amx") for t in tps]
        return wanted
    return always(host_has_amx) + slice_of(cases, host_has_amx, rotation_key(root))
