"""Shared fixtures: every canonical test uses a private, session-wide cache directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("wb-cache")
    old = os.environ.get("WEIGHTBRIDGE_CACHE_DIR")
    os.environ["WEIGHTBRIDGE_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("WEIGHTBRIDGE_CACHE_DIR", None)
    else:
        os.environ["WEIGHTBRIDGE_CACHE_DIR"] = old
