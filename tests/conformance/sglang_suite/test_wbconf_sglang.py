"""Self-application: the shipped SGLang engine suite (examples/engine_suites/sglang) passes, run as a
wheel user runs it: copied out by ``weightbridge examples engine_suites --copy`` into an empty
directory, no checkpoint anywhere (SGLang builds the bundled model with dummy weights).

Rollout: one real ``sglang.Engine`` (CPU, TP 1) per scenario; trainer: 2 FSDP2 ranks of the same tiny
Qwen2. The late joiner needs two instances: a declared known gap (xfailed). Without SGLang the module
skips, unless ``WEIGHTBRIDGE_REQUIRE_SGLANG=1`` (CI's SGLang phase sets it) makes that a failure.
"""

import pytest

from weightbridge.testing._internal.optional import require

require("sglang", extra="sglang", reason="the SGLang conformance self-application needs SGLang (.ci/sglang_venv.sh)")

from weightbridge.testing import REQUIREMENTS  # noqa: E402 - after the skip above
from weightbridge.testing._internal.engine_suites import run_shipped_suite  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

GAP = "membership.late-joiner.receives"


def test_the_shipped_sglang_suite_passes_every_requirement_but_its_declared_gap(tmp_path):
    run = run_shipped_suite("sglang_suite", tmp_path / "empty", timeout_s=2400, env={"SGLANG_USE_CPU_ENGINE": "1"})
    run.check({r: "xfailed" if r == GAP else "passed" for r in REQUIREMENTS})
    assert not list((tmp_path / "empty").rglob("*.safetensors"))  # no checkpoint was written
