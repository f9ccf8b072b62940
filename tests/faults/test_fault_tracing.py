"""Faults in the app's OpenTelemetry setup never reach the caller of `track()`."""

from __future__ import annotations

import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.shim import otel


class BrokenProvider:
    """A TracerProvider whose tracer cannot be had, or whose spans cannot start."""

    def __init__(self, where: str):
        self.where = where

    def get_tracer(self, *args, **kwargs):
        if self.where == "get_tracer":
            raise RuntimeError("tracer provider misconfigured")
        return self

    def start_span(self, *args, **kwargs):
        raise RuntimeError("span processor broken")


@pytest.mark.parametrize("where", ["get_tracer", "start_span"])
def test_a_broken_tracer_provider_does_not_raise_into_track(monkeypatch, where):
    otel._tracers.clear()
    monkeypatch.setattr(otel.trace, "get_tracer_provider", lambda: BrokenProvider(where))
    with exporter.track(model="m", route="r") as call:
        call.token()
    counters = runtime.state().recorder.counts()
    assert counters.rows[names.REQUESTS_TOTAL] == {
        ("m", names.OK, names.UNKNOWN, "r", names.UNKNOWN): 1}
    assert counters.value(names.DROPPED, names.DROP_INTERNAL) == 1  # counted, not raised
