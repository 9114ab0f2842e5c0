"""Deadlines in the spec are finite and bounded (issue 13, item 8): ``timeout_s: .inf`` or ``1e300``
validated, then ``from_spec`` raised ``OverflowError``; now the spec check reports them."""

from __future__ import annotations

import pytest

from weightbridge.spec.resolve import check_text

BASE = """\
version: 1
model: {bundled: tiny-qwen2}
trainer: {preset: fsdp2, mesh: {dp: 2}}
rollout: {preset: vllm, instances: 1, mesh: {tp: 2}}
sync:
  mode: async
  FIELD: VALUE
"""


@pytest.mark.parametrize("field,value,needle", [
    ("timeout_s", ".inf", "inf is above the maximum of 86400"),
    ("timeout_s", "1.0e+300", "1e+300 is above the maximum of 86400"),
    ("timeout_s", "86401", "86401 is above the maximum of 86400"),
    ("timeout_s", ".nan", "finite number"),
    ("heartbeat_s", ".inf", "inf is above the maximum of 3600"),
])
def test_an_infinite_or_huge_deadline_is_a_spec_error_with_line_path_and_hint(field, value, needle):
    resolved, problems = check_text(BASE.replace("FIELD", field).replace("VALUE", value), "s.yaml")
    assert resolved is None
    [p] = problems
    assert (p.file, p.line, p.path) == ("s.yaml", 7, f"$.sync.{field}"), str(p)
    assert needle in p.message, str(p)
    if "maximum" in needle:
        assert p.hint.startswith("use a finite number of at most"), str(p)
        assert str(p).startswith(f"s.yaml:7: $.sync.{field}: ") and str(p).endswith(f"({p.hint})")


def test_a_day_is_accepted_and_builds_deadlines():
    resolved, problems = check_text(BASE.replace("FIELD", "timeout_s").replace("VALUE", "86400"), "s.yaml")
    assert problems == [] and resolved is not None and resolved.sync.timeout_s == 86400
    import time

    time.monotonic() + resolved.sync.timeout_s  # what every deadline does: no OverflowError
