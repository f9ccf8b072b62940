"""OpenTelemetry spans and GenAI metrics from call timelines, with the SDK's in-memory parts."""

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from exporter._internal import names, otel
from exporter._internal.config import Config
from exporter._internal.timeline import CallTimeline, derive
from exporter.integrations import genai_views

MS = 1_000_000



def timeline():
    t = CallTimeline(start=10_000 * MS, model="gpt-4.1", provider="openai", route="search",
                     tenant="acme")
    t.dispatched, t.connected, t.sent, t.headers = (t.start + k * MS for k in (1, 11, 12, 112))
    t.token(t.start + 300 * MS, "reasoning")
    t.token(t.start + 900 * MS)
    t.token(t.start + 950 * MS)
    t.end = t.start + 1000 * MS
    t.input_tokens, t.output_tokens, t.cached_input_tokens = 1200, 3, 1024
    return t


def test_one_span_with_genai_attributes_and_phase_events(spans):
    t = timeline()
    span = otel.CallSpan(t)
    assert len(t.trace_id) == 32
    t.model = "gpt-4.1-2025-04-14"
    t.outcome = names.OK
    span.finish(t, derive(t), None, {names.ATTR_SERVER_ADDRESS: "api.openai.com"})
    [s] = spans.get_finished_spans()
    assert s.name == "chat gpt-4.1" and s.kind == trace.SpanKind.CLIENT
    assert format(s.context.trace_id, "032x") == t.trace_id
    a = s.attributes
    assert a[names.ATTR_REQUEST_MODEL] == "gpt-4.1"
    assert a[names.ATTR_RESPONSE_MODEL] == "gpt-4.1-2025-04-14"
    assert a[names.ATTR_PROVIDER] == "openai" and a[names.ATTR_SERVER_ADDRESS] == "api.openai.com"
    assert a[names.ATTR_TIME_TO_FIRST_CHUNK] == pytest.approx(0.3)
    assert a[names.ATTR_TIME_TO_FIRST_ANSWER] == pytest.approx(0.9)
    assert a[names.ATTR_INPUT_TOKENS] == 1200 and a[names.ATTR_CACHE_READ_TOKENS] == 1024
    assert (a[names.ATTR_ROUTE], a[names.ATTR_TENANT]) == ("search", "acme")
    assert a[names.ATTR_PHASE_PREFIX + "server"] == pytest.approx(0.1)
    assert a[names.ATTR_PHASE_PREFIX + "reasoning"] == pytest.approx(0.6)
    assert names.ATTR_ERROR_TYPE not in a
    events = {e.name: e.timestamp for e in s.events}
    assert list(events) == list(names.SPAN_EVENTS)
    # real times: each event sits at its stamp's offset from the span start
    assert events["headers"] - s.start_time == 112 * MS
    assert events["last_token"] - s.start_time == 950 * MS
    assert s.end_time - s.start_time == 1000 * MS


def test_errors_set_status_and_error_type(spans):
    t = timeline()
    span = otel.CallSpan(t)
    t.outcome = names.TIMEOUT
    span.finish(t, derive(t), TimeoutError("slow"))
    [s] = spans.get_finished_spans()
    assert s.status.status_code == trace.StatusCode.ERROR
    assert s.attributes[names.ATTR_ERROR_TYPE] == "TimeoutError"


def test_traceparent_is_injected(spans):
    t = timeline()
    span = otel.CallSpan(t)
    headers = {}
    span.inject(headers)
    assert headers["traceparent"].split("-")[1] == t.trace_id


def test_nothing_without_an_sdk_tracer_provider(monkeypatch):
    monkeypatch.setattr(otel.trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    t = timeline()
    span = otel.CallSpan(t)
    headers = {}
    span.inject(headers)
    span.finish(t, derive(t), None)
    assert span.span is None and t.trace_id is None and headers == {}


def test_genai_metrics_with_slo_aligned_buckets(monkeypatch):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader],
                             views=genai_views(Config().seconds_buckets()))
    monkeypatch.setattr(otel.metrics, "get_meter_provider", lambda: provider)
    t = timeline()
    t.outcome = names.OK
    otel.GenAIMetrics().record(t, derive(t))
    data = {m.name: m for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}
    assert set(data) == {names.OTEL_OPERATION_DURATION, names.OTEL_TIME_TO_FIRST_CHUNK,
                         names.OTEL_TIME_PER_OUTPUT_CHUNK, names.OTEL_TOKEN_USAGE}
    first = data[names.OTEL_TIME_TO_FIRST_CHUNK].data.data_points[0]
    assert 1.0 in first.explicit_bounds and 2.0 in first.explicit_bounds
    assert first.sum == pytest.approx(0.3)
    usage = {dict(p.attributes)[names.ATTR_TOKEN_TYPE]: p.sum
             for p in data[names.OTEL_TOKEN_USAGE].data.data_points}
    assert usage == {"input": 1200, "output": 3}


def test_no_metrics_without_an_sdk_meter_provider():
    assert type(metrics.get_meter_provider()).__name__ in otel._NO_METER_PROVIDER_NAMES
    genai = otel.GenAIMetrics()
    t = timeline()
    genai.record(t, derive(t))
    assert genai._ensure() == ()  # no instruments were created
