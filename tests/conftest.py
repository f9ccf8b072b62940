"""Shared fixtures: every test gets a fresh process-wide exporter state (a fresh registry)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporter._internal import runtime
from exporter._internal.shim import otel
from tests.support import timing

quiet_process = timing.quiet_process  # the `timing` mark's fixture


@pytest.fixture(autouse=True)
def fresh_state():
    runtime.configure(None)
    yield runtime.state()
    runtime.configure(None)


@pytest.fixture
def spans(monkeypatch) -> InMemorySpanExporter:
    """An SDK TracerProvider for this test only, recording finished spans in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(otel.trace, "get_tracer_provider", lambda: provider)
    return memory

