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


def test_public_load_spec_and_open_store_are_lazy() -> None:
    """``weightbridge.load_spec`` resolves without torch; ``open_store`` is exported, importing torch only when used."""
    code = (
        "import sys, weightbridge\n"
        "assert 'load_spec' in weightbridge.__all__ and 'open_store' in weightbridge.__all__\n"
        "r = weightbridge.load_spec('version: 1\\nmodel: {tensors: [{name: w, shape: [8, 4]}]}\\n'\n"
        "                           'trainer: {preset: hf}\\nrollout: {preset: hf, instances: 2}\\n')\n"
        "assert r.rollout.world_size == 2\n"
        "assert not any(m == 'torch' for m in sys.modules), 'load_spec imported torch'\n"
        "try:\n"
        "    weightbridge.load_spec('no-such-spec.yaml')\n"
        "except weightbridge.SpecErrors as exc:\n"
        "    assert 'cannot read spec' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('a missing file must be reported')\n"
        "from weightbridge.transport.store import open_store\n"
        "assert weightbridge.open_store is open_store and 'torch' in sys.modules\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
