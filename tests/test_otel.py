"""OpenTelemetry spans and GenAI metrics from call timelines, with the SDK's in-memory parts:
one test per attribute and per metric of the GenAI conventions this exporter emits."""

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.record.timeline import CallTimeline, derive
from exporter._internal.shim import otel
from exporter.integrations import genai_views

MS = 1_000_000


@pytest.fixture
def opted_in(monkeypatch):
    """OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai/dup, read as the API loads."""
    monkeypatch.setenv(otel.OPT_IN_ENV, "http/dup, gen_ai/dup")
    monkeypatch.setattr(otel, "_loaded", False)
    otel._load()
    yield
    monkeypatch.delenv(otel.OPT_IN_ENV)
    otel._load()
    assert not otel._dup


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
    span.finish(t, derive(t), None, {names.ATTR_SERVER_ADDRESS: "api.openai.com",
                                     names.ATTR_SERVER_PORT: 443})
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


def test_genai_views_give_the_time_histograms_slo_aligned_buckets(monkeypatch):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader],
                             views=genai_views(Config().seconds_buckets()))
    monkeypatch.setattr(otel.metrics, "get_meter_provider", lambda: provider)
    t = timeline()
    t.outcome = names.OK
    otel.GenAIMetrics().record(t, derive(t), "openai", "gpt-4.1", {})
    data = {m.name: m for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}
    first = data[names.OTEL_TIME_TO_FIRST_CHUNK].data.data_points[0]
    assert 1.0 in first.explicit_bounds and 2.0 in first.explicit_bounds
    assert first.sum == pytest.approx(0.3)


def test_no_metrics_without_an_sdk_meter_provider():
    assert type(metrics.get_meter_provider()).__name__ in otel._NO_METER_PROVIDER_NAMES
    genai = otel.GenAIMetrics()
    t = timeline()
    genai.record(t, derive(t), "openai", "gpt-4.1", {})
    assert genai._ensure() == ()  # no instruments were created


def finished(spans, t, attributes=None, provider=None):
    span = otel.CallSpan(t, provider=provider)
    t.outcome = t.outcome or names.OK
    span.finish(t, derive(t), None, attributes or {})
    [s] = spans.get_finished_spans()
    return s.attributes


def test_provider_name_is_the_one_given_at_span_creation(spans):
    t = timeline()
    t.provider = "local"  # the label; the span names the API the SDK spoke
    span = otel.CallSpan(t, provider="openai")
    assert span.span.attributes[names.ATTR_PROVIDER] == "openai"  # at creation time
    span.finish(t, derive(t), None, {})
    assert spans.get_finished_spans()[0].attributes[names.ATTR_PROVIDER] == "openai"


def test_server_port_goes_with_server_address(spans):
    a = finished(spans, timeline(), {names.ATTR_SERVER_ADDRESS: "h", names.ATTR_SERVER_PORT: 8443})
    assert (a[names.ATTR_SERVER_ADDRESS], a[names.ATTR_SERVER_PORT]) == ("h", 8443)


def test_response_id_and_finish_reasons(spans):
    a = finished(spans, timeline(), {names.ATTR_RESPONSE_ID: "chatcmpl-1",
                                     names.ATTR_FINISH_REASONS: ["stop", "length"]})
    assert a[names.ATTR_RESPONSE_ID] == "chatcmpl-1"
    assert a[names.ATTR_FINISH_REASONS] == ("stop", "length")


def test_reasoning_output_tokens(spans):
    t = timeline()
    t.reasoning_output_tokens = 1
    assert finished(spans, t)[names.ATTR_REASONING_TOKENS] == 1


def test_time_to_first_chunk_only_for_streamed_calls(spans):
    t = CallTimeline(start=0, model="m", provider="openai", route="r")
    t.first_token = t.first_answer_token = t.end = 500 * MS  # a non-streamed body
    a = finished(spans, t, {names.ATTR_REQUEST_STREAM: False})
    assert names.ATTR_TIME_TO_FIRST_CHUNK not in a
    assert a[names.ATTR_TIME_TO_FIRST_ANSWER] == pytest.approx(0.5)  # ours: when it arrived


#: The span's GenAI attributes of the conventions' current text (docs/tracing.md names it), for
#: a streamed call that reported its usage, its cache read and write, and reasoning tokens.
CURRENT_SPAN_ATTRIBUTES = {
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
    "gen_ai.response.model", "gen_ai.request.stream", "gen_ai.response.id",
    "gen_ai.response.finish_reasons", "gen_ai.response.time_to_first_chunk",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_write.input_tokens",
    "gen_ai.usage.reasoning.output_tokens"}
#: What the shims hand the span beside the timeline (anthropic's cache write among them).
CLIENT_ATTRIBUTES = {"gen_ai.request.stream": True, "gen_ai.response.id": "msg_1",
                     "gen_ai.response.finish_reasons": ["end_turn"],
                     "gen_ai.usage.cache_write.input_tokens": 25}


def test_the_span_carries_exactly_the_current_texts_genai_attributes(spans):
    t = timeline()
    t.reasoning_output_tokens = 1
    a = finished(spans, t, CLIENT_ATTRIBUTES)
    assert {key for key in a if key.startswith("gen_ai.")} == CURRENT_SPAN_ATTRIBUTES
    assert names.ATTR_CACHE_WRITE_TOKENS == "gen_ai.usage.cache_write.input_tokens"


def test_opted_in_the_span_also_carries_the_cache_writes_earlier_name(opted_in, spans):
    t = timeline()
    t.reasoning_output_tokens = 1
    a = finished(spans, t, CLIENT_ATTRIBUTES)
    assert {key for key in a if key.startswith("gen_ai.")} == CURRENT_SPAN_ATTRIBUTES | {
        "gen_ai.usage.cache_creation.input_tokens"}
    assert a["gen_ai.usage.cache_creation.input_tokens"] == 25


def metric_points(reader):
    return {m.name: m for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def reader(monkeypatch):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(otel.metrics, "get_meter_provider", lambda: provider)
    return reader


def record(t, attributes=None, provider="openai"):
    t.outcome = t.outcome or names.OK
    otel.GenAIMetrics().record(t, derive(t), provider, "gpt-4.1",
                               attributes or {names.ATTR_SERVER_ADDRESS: "api.openai.com",
                                              names.ATTR_SERVER_PORT: 443})


#: The GenAI client metrics of the conventions' current text (docs/tracing.md names it).
CURRENT_METRICS = {"gen_ai.client.operation.duration",
                   "gen_ai.client.operation.time_to_first_chunk",
                   "gen_ai.client.operation.time_per_output_chunk",
                   "gen_ai.client.token.usage"}
#: The token metrics emitted before, kept beside them on opt-in (`gen_ai/dup`).
LEGACY_METRICS = {"gen_ai.client.inference.usage.input_tokens",
                  "gen_ai.client.inference.usage.output_tokens",
                  "gen_ai.client.inference.usage.cache_read.input_tokens",
                  "gen_ai.client.inference.usage.reasoning.output_tokens",
                  "gen_ai.client.inference.operation.input_tokens",
                  "gen_ai.client.inference.operation.output_tokens"}


def test_the_metrics_are_exactly_the_current_texts_with_their_units_and_attributes(reader):
    t = timeline()
    t.model = "gpt-4.1-2025-04-14"
    t.reasoning_output_tokens = 1
    record(t)
    data = metric_points(reader)
    assert set(data) == CURRENT_METRICS
    for name, metric in data.items():
        assert metric.unit == ("{token}" if name.endswith("usage") else "s")
        for point in metric.data.data_points:
            a = dict(point.attributes)
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
            assert a["gen_ai.request.model"] == "gpt-4.1"
            assert a["gen_ai.response.model"] == "gpt-4.1-2025-04-14"
            assert (a["server.address"], a["server.port"]) == ("api.openai.com", 443)


def test_the_opt_in_reads_opentelemetrys_comma_separated_list():
    opted = otel.legacy_names_opted_in
    assert opted({"OTEL_SEMCONV_STABILITY_OPT_IN": "http, gen_ai/dup"})
    assert not opted({"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"})
    assert not opted({"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai"}) and not opted({})


def test_opted_in_the_earlier_token_metrics_are_recorded_beside_the_current_ones(opted_in,
                                                                                 reader):
    t = timeline()
    t.reasoning_output_tokens = 2
    record(t)
    data = metric_points(reader)
    assert set(data) == CURRENT_METRICS | LEGACY_METRICS

    def only(name):
        [point] = data[name].data.data_points
        return point

    for name, value in (("gen_ai.client.inference.usage.input_tokens", 1200),
                        ("gen_ai.client.inference.usage.output_tokens", 3),
                        ("gen_ai.client.inference.usage.cache_read.input_tokens", 1024),
                        ("gen_ai.client.inference.usage.reasoning.output_tokens", 2)):
        point = only(name)
        assert point.value == value and data[name].data.is_monotonic, name
        assert dict(point.attributes)["gen_ai.token.modality"] == "unknown"
    assert only("gen_ai.client.inference.operation.input_tokens").sum == 1200
    assert only("gen_ai.client.inference.operation.output_tokens").sum == 3


def test_token_usage_is_one_histogram_by_token_type(reader):
    record(timeline())
    [usage] = [metric_points(reader)["gen_ai.client.token.usage"]]
    by_type = {dict(p.attributes)["gen_ai.token.type"]: p for p in usage.data.data_points}
    assert set(by_type) == {"input", "output"}
    assert (by_type["input"].sum, by_type["output"].sum) == (1200, 3)  # input counts cached
    assert all(p.count == 1 for p in by_type.values())
    assert tuple(by_type["input"].explicit_bounds) == otel.TOKEN_BOUNDARIES


def test_time_per_output_chunk_records_each_chunk_after_the_first(reader):
    t = CallTimeline(start=0, model="m", provider="openai", route="r")
    for k in range(97):
        t.token(100 * MS + k * 10 * MS)
    t.end = 2000 * MS
    record(t)
    [point] = metric_points(reader)[names.OTEL_TIME_PER_OUTPUT_CHUNK].data.data_points
    assert point.count == 96 and point.sum == pytest.approx(0.96)


def test_time_to_first_chunk_is_not_recorded_for_non_streamed_calls(reader):
    t = CallTimeline(start=0, model="m", provider="openai", route="r")
    t.first_token = t.first_answer_token = t.end = 500 * MS
    t.input_tokens, t.output_tokens = 10, 5
    record(t, {names.ATTR_REQUEST_STREAM: False})
    data = metric_points(reader)
    assert names.OTEL_TIME_TO_FIRST_CHUNK not in data
    assert names.OTEL_TIME_PER_OUTPUT_CHUNK not in data
    assert data[names.OTEL_OPERATION_DURATION].data.data_points[0].sum == pytest.approx(0.5)


def test_histograms_advise_the_conventions_bucket_boundaries(reader):
    record(timeline())
    data = metric_points(reader)
    for name in (names.OTEL_OPERATION_DURATION, names.OTEL_TIME_TO_FIRST_CHUNK,
                 names.OTEL_TIME_PER_OUTPUT_CHUNK):
        point = data[name].data.data_points[0]
        assert tuple(point.explicit_bounds) == otel.SECONDS_BOUNDARIES, name
    point = data[names.OTEL_TOKEN_USAGE].data.data_points[0]
    assert tuple(point.explicit_bounds) == (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536,
                                            262144, 1048576, 4194304, 16777216, 67108864)


def test_a_failed_call_without_usage_records_no_tokens_and_its_error_type(reader):
    """The conventions: no usage metric where the count is not available."""
    t = CallTimeline(start=0, model="m", provider="openai", route="r")
    t.end, t.outcome = 100 * MS, names.TIMEOUT
    record(t)
    data = metric_points(reader)
    assert names.OTEL_TOKEN_USAGE not in data
    [duration] = data[names.OTEL_OPERATION_DURATION].data.data_points
    assert dict(duration.attributes)[names.ATTR_ERROR_TYPE] == "timeout"
