"""The pure core (spec, layout, plan) imports neither torch nor torch.distributed."""

from __future__ import annotations

import subprocess
import sys


def test_pure_core_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import weightbridge.spec.resolve, weightbridge.layout.expand, weightbridge.layout.coverage, weightbridge.plan\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_inline_spec_resolves_without_torch() -> None:
    code = (
        "import sys\n"
        "from weightbridge.spec.resolve import check_text\n"
        "text = '''version: 1\n"
        "model: {tensors: [{name: w, shape: [8, 4], dtype: bfloat16}]}\n"
        "trainer: {preset: hf, mesh: {dp: 2}}\n"
        "rollout: {preset: hf, instances: 3}\n'''\n"
        "r, problems = check_text(text)\n"
        "assert not problems, problems\n"
        "assert not any(m == 'torch' for m in sys.modules)\n"
        "print(r.rollout.world_size)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "3", proc.stdout + proc.stderr
