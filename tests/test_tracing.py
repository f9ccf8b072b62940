"""Tracing end to end: the real openai and anthropic SDKs under `instrument()` with an SDK
TracerProvider produce one span per call (GenAI attributes, phase events at their real times),
send `traceparent`, and the call's TTFT bucket carries its trace id as an exemplar that a real
Prometheus (`--enable-feature=exemplar-storage`) returns from `/api/v1/query_exemplars`."""

from __future__ import annotations

import re
import time
import urllib.request

import anthropic
import httpx2
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import exporter
from exporter._internal import names, runtime
from exporter._internal.shim import otel
from tests import test_shim_support as support
from tests.support.prometheus import PrometheusServer, require_prometheus
from tests.test_shim_support import ABS_TOL, script

# Shared fixtures of tests/test_shim_support.py.
server, instrumented = support.server, support.instrumented

MESSAGES = [{"role": "user", "content": "trace me"}]
OPENMETRICS = "application/openmetrics-text;version=1.0.0"



def test_openai_stream_makes_one_span_with_phases_and_sends_traceparent(
        server, instrumented, spans):
    sent_headers = []
    http = httpx2.Client(event_hooks={"request": [lambda r: sent_headers.append(r.headers)]})
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0,
                           http_client=http)
    with exporter.labels(route="support", tenant="acme"):
        stream = client.chat.completions.create(
            model="gpt-4.1", messages=MESSAGES, stream=True,
            extra_headers=script(server_wait=0.05, prefill=0.1, tokens=5, gap=0.01))
        chunks = list(stream)
    assert len(chunks) > 5
    [span] = spans.get_finished_spans()
    trace_id = format(span.context.trace_id, "032x")
    assert sent_headers[0]["traceparent"].split("-")[1] == trace_id
    a = span.attributes
    assert span.name == "chat gpt-4.1"
    # The demo provider on loopback: the API spoken is OpenAI's (the label stays "local").
    assert a[names.ATTR_PROVIDER] == "openai" and a[names.ATTR_SERVER_ADDRESS] == "127.0.0.1"
    assert a[names.ATTR_SERVER_PORT] == int(server.base_url.rsplit(":", 1)[1])
    assert a[names.ATTR_REQUEST_STREAM] is True
    assert a[names.ATTR_RESPONSE_ID].startswith("chatcmpl-")
    assert a[names.ATTR_FINISH_REASONS] == ("stop",)
    assert (a[names.ATTR_ROUTE], a[names.ATTR_TENANT]) == ("support", "acme")
    assert a[names.ATTR_TIME_TO_FIRST_CHUNK] >= 0.15
    assert a[names.ATTR_PHASE_PREFIX + "server"] >= 0.05
    assert a[names.ATTR_PHASE_PREFIX + "prefill"] >= 0.1 - ABS_TOL  # headers read a bit late
    events = [e.name for e in span.events]  # boundary events only (no per-chunk ones), in order
    assert events == [e for e in names.SPAN_EVENTS if e in events]
    assert {"sent", "headers", "first_token", "first_answer_token", "last_token"} <= set(events)
    stamp = {e.name: e.timestamp for e in span.events}
    # the scripted prefill, real times (the headers read a bit late, as above)
    assert stamp["first_token"] - stamp["headers"] >= (0.1 - ABS_TOL) * 1e9
    # the exemplar of the TTFT bucket is this call's trace
    body = runtime.state().renderer.render(openmetrics=True).decode()
    assert re.search(rf'{names.TTFT.name}_bucket\{{le="[^"]+",model="gpt-4.1".*\}} 1\.0 '
                     rf'# \{{trace_id="{trace_id}"\}}', body)


def test_anthropic_error_span(server, instrumented, spans):
    client = anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="claude", max_tokens=10, messages=MESSAGES, stream=True,
                               extra_headers=script(status=429))
    [span] = [s for s in spans.get_finished_spans() if s.name == "chat claude"]
    # anthropic's own span of the API call (the SDK traces itself) nests under ours
    [sdk_span] = [s for s in spans.get_finished_spans() if s is not span]
    assert sdk_span.parent.span_id == span.context.span_id
    assert span.status.status_code.name == "ERROR"
    assert span.attributes[names.ATTR_ERROR_TYPE] == "RateLimitError"
    assert span.attributes[names.ATTR_OUTCOME] == names.RATE_LIMITED
    assert span.attributes[names.ATTR_PROVIDER] == "anthropic"


def test_anthropic_span_has_the_message_id_stop_reason_and_no_ttfc_unstreamed(
        server, instrumented, spans):
    client = anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0)
    with client.messages.stream(model="claude", max_tokens=10, messages=MESSAGES,
                                extra_headers=script(tokens=3)) as stream:
        message = stream.get_final_message()
    client.messages.create(model="claude", max_tokens=10, messages=MESSAGES,
                           extra_headers=script(tokens=3))
    streamed, unstreamed = [s for s in spans.get_finished_spans() if s.name == "chat claude"]
    assert streamed.attributes[names.ATTR_RESPONSE_ID] == message.id
    assert streamed.attributes[names.ATTR_FINISH_REASONS] == ("end_turn",)
    assert streamed.attributes[names.ATTR_TIME_TO_FIRST_CHUNK] > 0
    assert unstreamed.attributes[names.ATTR_RESPONSE_ID].startswith("msg_")
    assert unstreamed.attributes[names.ATTR_FINISH_REASONS] == ("end_turn",)
    assert names.ATTR_TIME_TO_FIRST_CHUNK not in unstreamed.attributes


def test_per_chunk_and_token_metrics_through_the_sdk(server, instrumented, monkeypatch):
    """With otel.metrics the SDK call records one time-per-output-chunk value per chunk after
    the first, and its usage as `gen_ai.client.token.usage` by token type."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(otel.metrics, "get_meter_provider", lambda: provider)
    runtime.configure({"otel": {"metrics": True}})
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)
    list(client.chat.completions.create(
        model="r1", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        extra_headers=script(tokens=5, reasoning_tokens=4, gap=0.001)))
    data = {m.name: m for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}
    [per_chunk] = data[names.OTEL_TIME_PER_OUTPUT_CHUNK].data.data_points
    assert per_chunk.count == 4 + 5 - 1
    usage = {dict(p.attributes)["gen_ai.token.type"]: p
             for p in data["gen_ai.client.token.usage"].data.data_points}
    assert usage["output"].sum == 4 + 5  # reasoning tokens are output tokens
    assert dict(usage["output"].attributes)[names.ATTR_PROVIDER] == "openai"


def test_anthropic_span_has_exactly_the_current_genai_attributes_and_its_cache_write(
        server, instrumented, spans):
    """The cache write Anthropic reports (`cache_creation_input_tokens`) is the span's
    `gen_ai.usage.cache_write.input_tokens`; its input tokens include the cached ones."""
    client = anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0)
    with client.messages.stream(model="claude", max_tokens=10, messages=MESSAGES,
                                extra_headers=script(tokens=3, input_tokens=300,
                                                     cached_tokens=200)) as stream:
        stream.get_final_message()
    [span] = [s for s in spans.get_finished_spans() if s.name == "chat claude"]
    a = span.attributes
    assert {key for key in a if key.startswith("gen_ai.")} == {
        "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
        "gen_ai.response.model", "gen_ai.request.stream", "gen_ai.response.id",
        "gen_ai.response.finish_reasons", "gen_ai.response.time_to_first_chunk",
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_write.input_tokens"}
    assert a["gen_ai.usage.cache_write.input_tokens"] == 0  # what the demo provider reports
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.cache_read.input_tokens"]) == (
        300, 200)


def test_traceparent_can_be_turned_off(server, instrumented, spans):
    runtime.configure({"otel": {"propagate": False}})
    sent_headers = []
    http = httpx2.Client(event_hooks={"request": [lambda r: sent_headers.append(r.headers)]})
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0,
                           http_client=http)
    client.chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(tokens=2))
    assert "traceparent" not in sent_headers[0]
    assert len(spans.get_finished_spans()) == 1  # still traced, just not propagated


def test_manual_api_joins_the_apps_tracing(spans):
    tracer = otel.trace.get_tracer_provider().get_tracer("app")
    with tracer.start_as_current_span("handler") as handler:
        with exporter.track(model="llama", provider="vllm") as call:
            call.token()
    span, app_span = spans.get_finished_spans()
    assert app_span is not None and span.parent.span_id == handler.get_span_context().span_id
    assert call.timeline.trace_id == format(span.context.trace_id, "032x")
    assert [e.name for e in span.events] == ["first_token", "first_answer_token", "last_token"]


def test_prometheus_stores_the_exemplars(server, instrumented, spans):
    require_prometheus()
    srv = exporter.start_http_server(port=0)
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)
    try:
        config = ("global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: t\n"
                  f"    static_configs: [{{targets: ['127.0.0.1:{srv.port}']}}]\n")
        with PrometheusServer(config, extra_flags=["--enable-feature=exemplar-storage"]) as prom:
            trace_ids = set()
            for _ in range(3):
                list(client.chat.completions.create(
                    model="gpt-4.1", messages=MESSAGES, stream=True,
                    extra_headers=script(prefill=0.02, tokens=3)))
                trace_ids.add(format(spans.get_finished_spans()[-1].context.trace_id, "032x"))
            assert urllib.request.urlopen(urllib.request.Request(
                srv.url, headers={"Accept": OPENMETRICS})).read().count(b"trace_id=") >= 1
            deadline = time.monotonic() + 30
            found: set[str] = set()
            while time.monotonic() < deadline and not found:
                now = time.time()
                data = prom._get("/api/v1/query_exemplars", {
                    "query": f"{names.TTFT.name}_bucket", "start": str(now - 300),
                    "end": str(now + 5)})
                found = {e["labels"]["trace_id"] for series in data
                         for e in series["exemplars"]}
                time.sleep(0.5)
            assert found and found <= trace_ids, (found, trace_ids)
    finally:
        srv.stop()
