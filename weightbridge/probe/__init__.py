"""Layout extraction: probe a loader (:func:`probe_loader`), read DTensor placements
(:func:`weightbridge.probe.dtensor.layout_from_dtensors`; parameters transformers fuses from
per-expert checkpoint tensors: :mod:`weightbridge.probe.fused`), and compare IR sources
(:mod:`weightbridge.probe.diff`). Only ``probe`` needs torch at import."""

from weightbridge.probe.probe import (
    DEFAULT_MAX_PROBE_BYTES,
    ProbeError,
    ProbeResult,
    canonical_from_tensors,
    probe_loader,
    read_probe_json,
    write_probe_json,
)

__all__ = [
    "DEFAULT_MAX_PROBE_BYTES",
    "ProbeError",
    "ProbeResult",
    "canonical_from_tensors",
    "probe_loader",
    "read_probe_json",
    "write_probe_json",
]
