"""Helpers shared by the test suite (a real Prometheus server, the demo load, requirements)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def skip_or_fail(reason: str) -> None:
    """Skip locally; on CI (`CI=true`) fail, since CI must never silently skip a real part."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI=true: not skipping)")
    pytest.skip(reason)


def require_module(module: str) -> ModuleType:
    """Import a test dependency, or skip (fail on CI) when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        skip_or_fail(f"{module} is not installed (pip install -e '.[test]')")
        raise  # unreachable: skip_or_fail raises
