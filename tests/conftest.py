"""Shared fixtures: every test gets a fresh process-wide exporter state (a fresh registry)."""

from __future__ import annotations

import pytest

from exporter import runtime


@pytest.fixture(autouse=True)
def fresh_state():
    runtime.configure(None)
    yield runtime.state()
    runtime.configure(None)
