"""The planner's one error type."""

from __future__ import annotations


class PlanError(ValueError):
    """A planner argument or a planner invariant is wrong (never raised for incomplete layouts).

    A ``ValueError`` so that callers catching bad arguments keep working. Problems of a plan
    against its layouts are not errors: :func:`weightbridge.plan.validate_plan` lists them.
    """


__all__ = ["PlanError"]
