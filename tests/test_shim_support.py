"""Shared fixtures of the SDK-patch tests (imported by tests/test_shim_*.py), and unit tests of
the pieces that need no server: provider names, token classification, trace stamps."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.demo.far_region import tls_available
from exporter._internal.demo.provider import SCRIPT_HEADER, ProviderServer
from exporter._internal.record.timeline import CallTimeline, derive
from exporter._internal.shim import (anthropic as shim_anthropic, hooks, httpx_trace,
                                     openai as shim_openai, providers)

#: Timing tolerance of the tests: ±10 ms or ±5 %, whichever is larger.
ABS_TOL, REL_TOL = 0.010, 0.05


def script(**keys: object) -> dict[str, str]:
    """extra_headers scripting the demo provider's timings for one request."""
    return {SCRIPT_HEADER: json.dumps(keys)}


def near(actual_us: int | None, expected_s: float) -> bool:
    """A derived value (µs) is within the tolerance of the scripted one (s)."""
    if actual_us is None:
        return False
    return abs(actual_us / 1e6 - expected_s) <= max(ABS_TOL, REL_TOL * expected_s)


def assert_near(actual_us: int | None, expected_s: float, what: str) -> None:
    assert near(actual_us, expected_s), f"{what}: {actual_us} us, scripted {expected_s} s"


def client_side(d) -> int:
    """queue + connect + send (µs): client-side time before the request is on the wire."""
    return sum(d.phases.get(p, 0) for p in ("queue", "connect", "send"))


def assert_from_wire(actual_us: int | None, d, expected_s: float, what: str) -> None:
    """A value measured from `start`, less the client-side phases (which the provider's script
    cannot set: SDK work, pool waits), is within the tolerance of the script."""
    assert actual_us is not None, what
    assert_near(actual_us - client_side(d), expected_s, what + " (after the client-side phases)")


class Recorded:
    """Every CallTimeline the recorder receives, in order (the recorder still records them)."""

    def __init__(self) -> None:
        self.timelines: list[CallTimeline] = []
        rec = runtime.state().recorder
        original = rec.record_call

        def record_call(t: CallTimeline, key=None, derived=None) -> None:
            self.timelines.append(t)
            original(t, key, derived)

        rec.record_call = record_call  # instance attribute: this test's recorder only

    def one(self) -> CallTimeline:
        assert len(self.timelines) == 1, self.timelines
        return self.timelines.pop()

    def all(self) -> list[CallTimeline]:
        out, self.timelines = self.timelines, []
        return out


@pytest.fixture(scope="module")
def server():
    with ProviderServer() as running:
        yield running


@pytest.fixture(scope="module")
def far_provider():
    """The demo provider with its far region (a TLS relay a region away) beside the near one."""
    if not tls_available():
        pytest.fail("neither cryptography nor openssl is available for the far region")
    with ProviderServer(far_region=True) as running:
        yield running


@pytest.fixture(params=["c", "python"])
def trace_extension(request, monkeypatch) -> str:
    """A test twice: with a sync call's C trace extension (`httpx_trace.Tracer`, which
    `make test` builds) and with the call itself as the extension, as without a compiler."""
    from exporter._internal.shim import sdk_call
    from tests.support.c_parts import built_in_c

    if request.param == "python":
        monkeypatch.setattr(sdk_call, "_Tracer", None)
    elif not built_in_c("_hottrace.Tracer", sdk_call._Tracer is not None):
        pytest.skip("no C compiler here: the call itself is the trace extension")
    return request.param


@pytest.fixture
def instrumented():
    exporter.instrument()
    yield
    exporter.uninstrument()


@pytest.fixture
def recorded(instrumented) -> Recorded:
    return Recorded()


#: Time families whose values the server reported (the same on every run of one answer).
SERVER_REPORTED = {names.SERVER_QUEUE.name, names.SERVER_PREFILL.name}


def what_was_recorded(recorder) -> dict:
    """Everything a recorder holds, as a comparable value: per histogram family, each series'
    labels with its count of values, and the sum of its values where the family is not a
    time the client measured (those differ from one run of a call to the next; token counts,
    the server's own times and labels do not); every counter row with its count. Two paths
    recording the same call must agree on it."""
    out: dict = {}
    for name, state in recorder.families.items():
        timed = state.family.unit == "seconds" and name not in SERVER_REPORTED
        series = {s.values: (h.count, None if timed else h.total)
                  for s, h in recorder.folded_copies(state)}
        if series:
            out[name] = series
    for name, rows in recorder.counts().rows.items():
        rows = {row: n for row, n in rows.items() if n}
        if rows:
            out[name] = rows
    return out


def requests_total() -> dict:
    return dict(runtime.state().recorder.rows[names.REQUESTS_TOTAL])


def drops() -> int:
    return runtime.state().recorder.counts().value(names.DROPPED, names.DROP_INTERNAL)


# --- unit tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("host,default,want", [
    ("api.openai.com", "openai", "openai"),
    ("api.anthropic.com", "anthropic", "anthropic"),
    ("my-resource.openai.azure.com", "openai", "azure.ai.openai"),
    ("my-hub.services.ai.azure.com", "anthropic", "azure.ai.inference"),
    ("bedrock-runtime.us-east-1.amazonaws.com", "anthropic", "aws.bedrock"),
    ("us-east5-aiplatform.googleapis.com", "anthropic", "gcp.vertex_ai"),
    ("generativelanguage.googleapis.com", "openai", "gcp.gemini"),
    ("api.mistral.ai", "openai", "mistral_ai"),
    ("api.x.ai", "openai", "x_ai"),
    ("vllm-llama.ml.svc.cluster.local", "openai", "vllm"),
    ("gateway.ml.svc.cluster.local", "openai", "gateway"),
    ("api.deepseek.com", "openai", "deepseek"),
    ("llm.example.co.uk", "openai", "example"),
    ("llm.example.com", "openai", "example"),
    ("127.0.0.1", "openai", "local"),
    ("::1", "openai", "local"),
    ("localhost", "anthropic", "local"),
    ("10.1.2.3", "openai", "ip"),
    ("inference", "openai", "inference"),
    ("", "openai", "openai"),
    (None, "anthropic", "anthropic"),
])
def test_provider_names_are_short(host, default, want):
    assert providers.provider_name(host, default) == want


@pytest.mark.parametrize("label, api, want", [
    ("aws.bedrock", "anthropic", "aws.bedrock"), ("azure.ai.openai", "openai", "azure.ai.openai"),
    ("deepseek", "openai", "deepseek"), ("openrouter", "openai", "openrouter"),
    ("vllm", "openai", "vllm"), ("local", "openai", "openai"), ("ip", "anthropic", "anthropic"),
    ("example", "openai", "openai"), ("gateway", "openai", "openai"),
])
def test_genai_provider_name_is_a_well_known_value_or_the_sdks_api(label, api, want):
    """The conventions' well-known values where they apply; never `local` or a host name."""
    assert providers.genai_provider(label, api) == want


def test_provider_from_client_class():
    class AzureOpenAI:
        base_url = SimpleNamespace(host="x.example.com")

    class AnthropicBedrock:
        base_url = SimpleNamespace(host="bedrock-runtime.us-east-1.amazonaws.com")

    assert shim_openai.provider(AzureOpenAI()) == "azure.ai.openai"
    assert shim_anthropic.provider(AnthropicBedrock()) == "aws.bedrock"


def _chunk(delta=None, choices=True, usage=None):
    from openai._models import construct_type
    from openai.types.chat import ChatCompletionChunk

    value = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta or {}, "finish_reason": None}]
             if choices else [], "usage": usage}
    return construct_type(type_=ChatCompletionChunk, value=value)


def test_chat_classification_follows_design_section_4():
    classify = shim_openai.chat_classify
    assert classify(_chunk({"role": "assistant", "content": ""}), None) is None
    assert classify(_chunk({}), None) is None
    assert classify(_chunk(choices=False, usage={"prompt_tokens": 3}), None) is None
    assert classify(_chunk({"content": "hi"}), None) == names.CONTENT
    assert classify(_chunk({"refusal": "no"}), None) == names.CONTENT
    assert classify(_chunk({"reasoning_content": "hm"}), None) == names.REASONING
    assert classify(_chunk({"reasoning": "hm"}), None) == names.REASONING
    assert classify(_chunk({"reasoning_content": ""}), None) is None
    tool = {"tool_calls": [{"index": 0, "id": "t", "type": "function",
                            "function": {"name": "f", "arguments": ""}}]}
    assert classify(_chunk(tool), None) is None  # the name alone is framing
    tool["tool_calls"][0]["function"]["arguments"] = '{"a'
    assert classify(_chunk(tool), None) == names.TOOL


def test_responses_and_anthropic_classification():
    ev = SimpleNamespace
    r = shim_openai.responses_classify
    assert r(ev(type="response.created"), None) is None
    assert r(ev(type="response.in_progress"), None) is None
    assert r(ev(type="response.output_text.delta", delta="x"), None) == names.CONTENT
    assert r(ev(type="response.output_text.delta", delta=""), None) is None
    assert r(ev(type="response.reasoning_summary_text.delta", delta="x"), None) == \
        names.REASONING
    assert r(ev(type="response.function_call_arguments.delta", delta="{"), None) == names.TOOL
    a = shim_anthropic.classify
    noted: list[dict] = []
    tr = SimpleNamespace(usage_seen=None, response=lambda **kw: noted.append(kw))
    message = ev(usage=ev(input_tokens=5, cache_read_input_tokens=7,
                          cache_creation_input_tokens=0, output_tokens=1), model="claude-x",
                 id="msg_1")
    assert a(ev(type="message_start", message=message), tr) is None
    assert noted == [{"id": "msg_1"}]
    assert tr.usage_seen == {"input_tokens": 5, "cache_read_input_tokens": 7,
                        "cache_creation_input_tokens": 0, "output_tokens": 1,
                        "model": "claude-x"}
    assert a(ev(type="content_block_start"), tr) is None
    assert a(ev(type="ping"), tr) is None

    def delta(**d):
        return ev(type="content_block_delta", delta=ev(**d))

    assert a(delta(type="text_delta", text="x"), tr) == names.CONTENT
    assert a(delta(type="text_delta", text=""), tr) is None
    assert a(delta(type="thinking_delta", thinking="x"), tr) == names.REASONING
    assert a(delta(type="input_json_delta", partial_json="{"), tr) == names.TOOL
    assert a(delta(type="signature_delta", signature="s"), tr) is None


def test_trace_stamps_new_and_reused_connections():
    t = CallTimeline(start=0)
    for name in ("connection.connect_tcp.started", "connection.connect_tcp.complete",
                 "connection.start_tls.started", "connection.start_tls.complete",
                 "http11.send_request_headers.started", "http11.send_request_body.complete",
                 "http11.receive_response_headers.complete"):
        assert httpx_trace.stamp(t, name) is False
    assert t.dispatched < t.connected < t.sent < t.headers
    assert httpx_trace.stamp(t, "http11.response_closed.started") is True
    reused = CallTimeline(start=0)
    httpx_trace.stamp(reused, "http2.send_request_headers.started")
    assert reused.connected == reused.dispatched is not None  # connect = 0 on reuse
    assert httpx_trace.stamp(reused, "some.unknown.event") is False
    assert derive(reused).phases["connect"] == 0


@pytest.fixture
def network_streams():
    """httpcore's own network stream over a loopback connection, open and closed."""
    import socket

    from httpcore2._backends.sync import SyncStream

    with socket.create_server(("127.0.0.1", 0)) as listener:
        opened = socket.create_connection(listener.getsockname())
        closed = socket.create_connection(listener.getsockname())
        closed.close()
        yield SyncStream(opened), SyncStream(closed), "127.0.0.1:%d" % listener.getsockname()[1]
        opened.close()


def test_a_new_connection_names_its_address_while_it_is_open(network_streams):
    opened, closed, address = network_streams
    t = CallTimeline(start=0)
    httpx_trace.stamp(t, "connection.connect_tcp.complete", {"return_value": opened})
    assert t.upstream_address == address
    httpx_trace.stamp(t, "connection.start_tls.complete", {"return_value": closed})
    assert t.upstream_address == address  # the first seen stays
    gone = CallTimeline(start=0)
    httpx_trace.stamp(gone, "connection.connect_tcp.complete", {"return_value": closed})
    assert gone.upstream_address is None and gone.connected is not None  # no address: None


def test_c_trace_extension_steps_as_the_python_one(monkeypatch, network_streams):
    # any sequence of httpcore's events (known, failed, unknown), with or without response
    # headers (a processing time, a bad one, a region, none), a connection's stream (open,
    # closed), a header or connect callback that fails, a stream open or ended: the C
    # extension (`Tracer`) stamps the same fields in the same order, notes the same address and
    # region, reports the close and counts the drops as `SdkCall.__call__` does
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    from exporter._internal.shim.sdk_call import SdkCall
    from tests.support.c_parts import built_in_c

    if not built_in_c("_hottrace.Tracer", httpx_trace.Tracer is not None):
        pytest.skip("no C compiler here: the call itself is the trace extension")
    opened, closed, _ = network_streams
    headers = [(b"content-type", b"text/event-stream"), (b"Openai-Processing-Ms", b"12"),
               (b"X-Region", b"eu"), (b"x-ms-region", b"West Europe")]
    info = st.sampled_from([None, {}, {"return_value": (b"HTTP/1.1", 200, b"OK", headers)},
                            {"return_value": (b"HTTP/1.1", 200, b"OK", [(b"openai-processing-ms",
                                                                         b"x")])},
                            {"return_value": (b"HTTP/1.1", 200, b"OK", headers[2:3])},
                            {"return_value": None}, {"return_value": opened},
                            {"return_value": closed}, {"boom": True}])
    event = st.sampled_from([*httpx_trace.EVENTS, "connection.connect_tcp.failed",
                             "http11.receive_response_body.started", "unknown"])
    real_note_headers = httpx_trace.note_headers

    def note_headers(t, now, info):
        if "boom" in info:
            raise RuntimeError("a bug in the headers callback")
        real_note_headers(t, now, info)

    real_note_connected = httpx_trace.note_connected

    def note_connected(t, info):
        if "boom" in info:
            raise RuntimeError("a bug in the connect callback")
        real_note_connected(t, info)

    monkeypatch.setattr(httpx_trace, "note_headers", note_headers)
    monkeypatch.setattr(httpx_trace, "note_connected", note_connected)

    def run(c_extension, events, streaming, finished):
        t = CallTimeline(start=0)
        log = []
        call = SimpleNamespace(timeline=t, streaming=streaming, _finished=finished,
                               _closed=lambda: log.append("closed"),
                               count_drop=lambda: log.append("drop"))
        tracer = httpx_trace.Tracer(call, t, httpx_trace.EVENTS, note_headers, note_connected) \
            if c_extension else lambda name, info: SdkCall.__call__(call, name, info)
        for name, details in events:
            assert tracer(name, details) is None
        stamps = (t.dispatched, t.connected, t.sent, t.headers)
        return ([s is None for s in stamps], t.connected is not None and
                t.connected == t.dispatched, sorted(range(4), key=lambda k: (
                    stamps[k] is None, stamps[k] or 0, k)), t.round_trip is None, log,
                t.upstream_address, t.upstream_region)

    @settings(max_examples=500, deadline=None, derandomize=True)
    @given(st.lists(st.tuples(event, info), max_size=14), st.booleans(), st.booleans())
    def check(events, streaming, finished):
        assert run(True, events, streaming, finished) == run(False, events, streaming, finished)

    check()


def test_a_request_nested_in_an_llm_call_is_not_part_of_it(instrumented):
    """e.g. a token exchange made through the SDK while an LLM request is being sent."""
    seen = []

    def original(self, cast_to, options, **kwargs):
        if options.url == "/chat/completions":
            return hook(self, cast_to, SimpleNamespace(url="/oauth/token", method="post"))
        seen.append(hooks._CURRENT.get())
        return "token"

    hook = hooks.request_hook(original, shim_openai.SDK_SPEC, is_async=False)
    client = SimpleNamespace(base_url=SimpleNamespace(host="api.openai.com"))
    options = SimpleNamespace(url="/chat/completions", method="post", json_data={"model": "m"})
    rec = Recorded()
    assert hook(client, object, options) == "token"
    assert seen == [None]
    t = rec.one()
    assert (t.model, t.provider, t.outcome) == ("m", "openai", names.OK)
