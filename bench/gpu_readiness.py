#!/usr/bin/env python
"""GPU readiness of weightbridge on a single-GPU machine: one command, at most 8 minutes, JSON + log.

    python bench/gpu_readiness.py --out DIR        # a GPU machine
    python bench/gpu_readiness.py --dry-run        # CPU: validates the script itself (CI runs it)

The stages live in the package (``weightbridge/testing/_internal/gpu_readiness.py``, ``python -m
weightbridge.testing._internal.gpu_readiness`` from an installed wheel); what each checks, and how to carry it
to a machine without internet: ``docs/gpu_readiness.md``.
"""

import sys

from weightbridge.testing._internal.gpu_readiness import main

if __name__ == "__main__":
    sys.exit(main())
