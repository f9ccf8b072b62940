"""What the SDK patch adds: per streamed chunk, and per call (issue #3).

`python -m bench.shim_overhead [--quick]` prints a markdown section; `run(quick)` returns it for
`python -m bench`. Everything runs in one process, contenders interleaved run by run, medians
(min, max) over the runs:

* a real `openai.OpenAI` client consumes a 2,000-chunk chat-completion stream served from memory
  (an `httpx2.MockTransport`, so no server or network noise): unpatched, patched by
  `exporter.instrument()`, and patched by OpenLLMetry's `opentelemetry-instrumentation-openai`
  when it is installed (a bench-only dependency: `pip install opentelemetry-instrumentation-openai`);
* the wrapper alone over 2,000 pre-parsed chunks (its own cost, without the SDK's parsing);
* the recorder's share paid once at the end of the call for every token (gaps + ITL inserts);
* per-call fixed cost: a non-stream `chat.completions.create` and a one-token stream, patched vs
  unpatched (MockTransport: no trace events), and the cost of the httpx trace callbacks of one
  request (counted apart, as MockTransport emits none).
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import sys
import time
from typing import Any, Callable, Iterator

CHUNKS = 2000


def _sse(chunks: int, usage: bool = True) -> bytes:
    def data(delta: dict, finish: str | None = None, choices: bool = True, **extra: Any) -> bytes:
        body = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                "model": "bench-model", "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}] if choices else [], **extra}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    out = [data({"role": "assistant", "content": ""})]
    out += [data({"content": f" w{i}"}) for i in range(chunks)]
    out.append(data({}, finish="stop"))
    if usage:
        out.append(data({}, choices=False, usage={
            "prompt_tokens": 100, "completion_tokens": chunks, "total_tokens": chunks + 100,
            "prompt_tokens_details": {"cached_tokens": 0}}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


_COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench-model",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                 "message": {"role": "assistant", "content": "hello", "refusal": None}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
}).encode()


def _client(body: bytes) -> Any:
    import httpx2
    import openai

    def handler(request: httpx2.Request) -> httpx2.Response:
        stream = b'"stream":true' in request.content or b'"stream": true' in request.content
        if stream:
            return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                                   content=body)
        return httpx2.Response(200, headers={"content-type": "application/json"},
                               content=_COMPLETION)

    return openai.OpenAI(api_key="bench", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


_ABSENT = object()


def _openai_classes() -> list[type]:
    out = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "openai" or name.startswith("openai.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                out.append(value)
    return out


class _Mode:
    """Switches between unpatched, ours and OpenLLMetry's patch (never two at once)."""

    def __init__(self) -> None:
        import exporter

        self.exporter = exporter
        self.peer: Any = None
        try:
            from opentelemetry import metrics, trace
            from opentelemetry.instrumentation.openai import OpenAIInstrumentor
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.trace import TracerProvider

            # As deployed: SDK providers, so spans and metrics are really made (nothing is
            # exported, which is off the request path anyway).
            trace.set_tracer_provider(TracerProvider())
            metrics.set_meter_provider(MeterProvider())
            self.peer = OpenAIInstrumentor()
        except Exception:
            self.peer = None
        self.current = "unpatched"
        self._saved: list[tuple[type, dict]] = []

    def set(self, mode: str) -> None:
        if mode == self.current:
            return
        if self.current == "ours":
            self.exporter.uninstrument()
        elif self.current == "openllmetry":
            self.peer.uninstrument()
            # Its uninstrument() leaves some wrapt wrappers in place (openai 3.x), which would
            # then slow down the "unpatched" runs: put back every class attribute it changed.
            for cls, saved in self._saved:
                for name, value in list(vars(cls).items()):
                    if saved.get(name, _ABSENT) is not value:
                        if name in saved:
                            setattr(cls, name, saved[name])
                        else:
                            delattr(cls, name)
        if mode == "ours":
            self.exporter.instrument()
        elif mode == "openllmetry":
            self._saved = [(cls, dict(vars(cls))) for cls in _openai_classes()]
            self.peer.instrument()
        self.current = mode


def _interleave(modes: _Mode, names: list[str], fn: Callable[[], int], runs: int
                ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up
        modes.set(name)
        fn()
    for _ in range(runs):
        for name in names:
            modes.set(name)
            gc.collect()
            out[name].append(fn())
    modes.set("unpatched")
    return out


def _stat(values: list[float], digits: int = 0) -> str:
    f = f"{{:.{digits}f}}"
    return f"{f.format(statistics.median(values))} ({f.format(min(values))}–" \
           f"{f.format(max(values))})"


def stream_consumption(modes: _Mode, runs: int, chunks: int) -> list[str]:
    client = _client(_sse(chunks))
    messages = [{"role": "user", "content": "hi"}]

    def consume() -> int:
        start = time.perf_counter_ns()
        for _ in client.chat.completions.create(model="bench-model", messages=messages,
                                                stream=True,
                                                stream_options={"include_usage": True}):
            pass
        return time.perf_counter_ns() - start

    names = ["unpatched", "ours"] + (["openllmetry"] if modes.peer is not None else [])
    res = _interleave(modes, names, consume, runs)
    base = res["unpatched"]
    lines = [f"A real `openai.OpenAI` client reads a {chunks:,}-chunk stream from memory "
             f"(`httpx2.MockTransport`); {runs} interleaved runs, median (min–max).", "",
             "| contender | µs per chunk, all work | added ns per chunk vs unpatched | "
             "time ratio vs unpatched |", "| --- | --- | --- | --- |"]
    for name in names:
        per_chunk = [v / chunks / 1000 for v in res[name]]
        added = [(v - b) / chunks for v, b in zip(res[name], base)]
        _FIGURES[f"{name}_added_ns"] = statistics.median(added)
        ratio = [v / b for v, b in zip(res[name], base)]
        label = {"unpatched": "openai SDK, unpatched",
                 "ours": "patched by `exporter.instrument()` (includes recording the call)",
                 "openllmetry": "patched by OpenLLMetry `opentelemetry-instrumentation-openai` "
                                f"{_version('opentelemetry-instrumentation-openai')}"}[name]
        lines.append(f"| {label} | {_stat(per_chunk, 1)} | "
                     f"{'—' if name == 'unpatched' else _stat(added)} | {_stat(ratio, 4)} |")
    if modes.peer is None:
        lines += ["", "OpenLLMetry is not installed here: `pip install "
                      "opentelemetry-instrumentation-openai` to add it to the table."]
    lines += ["", "OpenLIT is not in the table: openlit 1.44 requires `openai<3` and "
                  "`anthropic<1` (pip resolves openai 2.54 and anthropic 0.125), so it cannot run "
                  "beside the httpx2-based SDKs measured here."]
    return lines


def wrapper_alone(runs: int, chunks: int) -> list[str]:
    """The wrapper's own per-chunk work, over chunks the SDK already parsed."""
    from openai._models import construct_type
    from openai.types.chat import ChatCompletionChunk

    from exporter._internal.shim import openai as shim_openai
    from exporter._internal.shim import tokens
    from exporter._internal.shim.sdk_call import SdkCall

    parsed = [construct_type(type_=ChatCompletionChunk, value={
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None,
                     "logprobs": None}]}) for i in range(chunks)]

    class NoRecord(SdkCall):
        __slots__ = ()

        def finish_stream(self, last: Any) -> None:  # the recorder is measured apart
            pass

    def source() -> Any:
        yield from parsed

    def sdk_iter(it: Any) -> Any:  # what Stream.__iter__ does around its iterator
        for item in it:
            yield item

    def bare() -> int:
        start = time.perf_counter_ns()
        for _ in sdk_iter(source()):
            pass
        return time.perf_counter_ns() - start

    def wrapped() -> int:
        tr = NoRecord("m", "bench", shim_openai.ENDPOINTS["/chat/completions"], None)
        start = time.perf_counter_ns()
        for _ in sdk_iter(tokens.sync_tokens(source(), tr)):
            pass
        return time.perf_counter_ns() - start

    def finish() -> int:
        from exporter._internal import runtime
        from exporter._internal.timeline import CallTimeline

        t = CallTimeline(start=0, model="m", provider="bench", route="r", tenant="t")
        now = 1_000_000
        for i in range(chunks):
            now += 20_000_000 + (i * 7919) % 5_000_000
            t.token(now)
        t.end = now
        t.outcome = "ok"
        rec = runtime.state().recorder
        start = time.perf_counter_ns()
        rec.record_call(t)
        rec.take_changed()  # the fold into HDR that a scrape does
        return time.perf_counter_ns() - start

    def reads() -> int:
        start = time.perf_counter_ns()
        for chunk in parsed:
            chunk.choices[0].delta.content
        return time.perf_counter_ns() - start

    def loop() -> int:
        start = time.perf_counter_ns()
        for chunk in parsed:
            pass
        return time.perf_counter_ns() - start

    a: list[float] = []
    b: list[float] = []
    f: list[float] = []
    r: list[float] = []
    bare(), wrapped(), finish()
    for _ in range(runs):
        gc.collect()
        a.append(bare())
        b.append(wrapped())
        f.append(finish())
        r.append(reads() - loop())
    added = [(y - x) / chunks for x, y in zip(a, b)]
    _FIGURES["wrapper_ns"] = statistics.median(added)
    _FIGURES["read_ns"] = statistics.median([v / chunks for v in r])
    _FIGURES["record_ns"] = statistics.median([v / chunks for v in f])
    return [
        f"The stream wrapper alone over {chunks:,} pre-parsed chunks (the SDK's parsing "
        f"excluded): **{_stat(added)} ns added per chunk** (a `perf_counter_ns()`, the "
        f"`chunk.choices[0].delta.content` read, a list append, one generator resume). Of "
        f"that, the read alone costs {_stat([v / chunks for v in r])} ns in this process: "
        f"pydantic attribute reads go through CPython 3.11's type attribute cache, and which "
        f"other modules a process imported decides whether `Choice.delta` and "
        f"`ChoiceDelta.content` collide in it (≈ 80 ns for the read without a collision, "
        f"≈ 250 ns with one, as here once `prometheus_client` or `yaml` is imported).",
        "",
        f"Recording the call at its end, per token (inter-token gaps, ITL histogram inserts, "
        f"the fold a scrape does): {_stat([v / chunks for v in f])} ns per token, paid once "
        f"per call by the recorder, not in the chunk loop.",
    ]


def per_call(modes: _Mode, runs: int, calls: int) -> list[str]:
    client = _client(_sse(1))
    messages = [{"role": "user", "content": "hi"}]

    def non_stream() -> int:
        start = time.perf_counter_ns()
        for _ in range(calls):
            client.chat.completions.create(model="bench-model", messages=messages)
        return (time.perf_counter_ns() - start) // calls

    def one_token_stream() -> int:
        start = time.perf_counter_ns()
        for _ in range(calls):
            for _ in client.chat.completions.create(model="bench-model", messages=messages,
                                                    stream=True):
                pass
        return (time.perf_counter_ns() - start) // calls

    lines = ["| call | unpatched µs | patched µs | added µs per call |", "| --- | --- | --- | --- |"]
    for label, fn in (("non-stream `create`", non_stream),
                      ("stream of one token", one_token_stream)):
        res = _interleave(modes, ["unpatched", "ours"], fn, runs)
        added = [(p - u) / 1000 for p, u in zip(res["ours"], res["unpatched"])]
        lines.append(f"| {label} | {_stat([v / 1000 for v in res['unpatched']], 1)} | "
                     f"{_stat([v / 1000 for v in res['ours']], 1)} | {_stat(added, 1)} |")

    from exporter._internal.shim.openai import ENDPOINTS
    from exporter._internal.shim.sdk_call import SdkCall

    events = ["connection.connect_tcp.started", "connection.connect_tcp.complete",
              "http11.send_request_headers.started", "http11.send_request_headers.complete",
              "http11.send_request_body.started", "http11.send_request_body.complete",
              "http11.receive_response_headers.started",
              "http11.receive_response_headers.complete", "http11.receive_response_body.started",
              "http11.response_closed.started", "http11.response_closed.complete"]
    tr = SdkCall("m", "bench", ENDPOINTS["/chat/completions"], None)
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(calls):
            for name in events:
                tr(name, {})
        samples.append((time.perf_counter_ns() - start) / calls / 1000)
    tr.end(None)
    lines += ["", f"The httpx trace callbacks of one request over a new connection "
                  f"({len(events)} events; MockTransport emits none): {_stat(samples, 1)} µs "
                  f"per call, to add to the above."]
    return lines


def isolated_per_call(runs: int, calls: int) -> list[str]:
    """The work the hooks add to one call, without the SDK around it (stable to measure)."""
    from types import SimpleNamespace

    import httpx2
    from openai._models import construct_type
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    from exporter._internal.shim import hooks, tokens
    from exporter._internal.shim import openai as shim_openai

    options = SimpleNamespace(url="/chat/completions", method="post",
                              json_data={"model": "bench-model", "messages": []})
    fake_client = SimpleNamespace(base_url=SimpleNamespace(host="api.openai.com"))
    completion = construct_type(type_=ChatCompletion, value=json.loads(_COMPLETION))
    chunk = construct_type(type_=ChatCompletionChunk, value={
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    sdk = shim_openai.SDK_SPEC

    def non_stream() -> int:
        start = time.perf_counter_ns()
        for _ in range(calls):
            token = hooks._START.set([time.perf_counter_ns()])
            tr = hooks._begin(sdk, fake_client, options, False)
            tr.attach_build(request)
            tr.returned(completion, False)
            hooks._START.reset(token)
        return (time.perf_counter_ns() - start) // calls

    results = [SimpleNamespace(response=httpx2.Response(200, request=request))
               for _ in range(calls)]  # made outside the timed loop

    def streamed() -> int:
        start = time.perf_counter_ns()
        for result in results:
            token = hooks._START.set([time.perf_counter_ns()])
            tr = hooks._begin(sdk, fake_client, options, False)
            tr.attach_build(request)
            tr.returned(result, True)
            tr.claim()
            for _ in tokens.sync_tokens(iter((chunk,)), tr):
                pass
            hooks._START.reset(token)
        return (time.perf_counter_ns() - start) // calls

    out = []
    for label, fn in (("non-stream call", non_stream), ("streamed call (one chunk)", streamed)):
        fn()
        samples = []
        for _ in range(runs):
            gc.collect()
            samples.append(fn() / 1000)
        out.append(f"| {label} | {_stat(samples, 1)} |")
    off, on, bare = _tracing_off_and_on(streamed, runs, calls)
    added = [b - a for a, b in zip(off, on)]
    _FIGURES["call_us"] = statistics.median(off)
    _FIGURES["traced_call_us"] = statistics.median(on)
    _FIGURES["bare_span_us"] = statistics.median(bare)
    out.append(f"| streamed call, tracing on (SDK TracerProvider, batch processor) | "
               f"{_stat(on, 1)} (added by the span: {_stat(added, 1)}; goal ≤ 30 µs per call "
               f"in all: {'met' if statistics.median(on) <= 30 else 'missed'}) |")
    out.append(f"| for scale: one bare OTel SDK span (start, 3 attributes, end), same provider | "
               f"{_stat(bare, 1)} |")
    from exporter._internal import runtime
    from exporter._internal.timeline import CallTimeline

    t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="t", first_token=10,
                     first_answer_token=10, end=20, outcome="ok", dispatched=1, connected=1,
                     sent=2, input_tokens=3, output_tokens=4)
    rec = runtime.state().recorder
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(calls):
            rec.record_call(t)
        samples.append((time.perf_counter_ns() - start) / calls / 1000)
    return ["The hooks' own work per call, isolated (the call and its recording: `Call` "
            "creation, in-flight gauge, trace attach, usage, `record_call`):", "",
            "| call | µs per call |", "| --- | --- |", *out, "",
            f"Of which the recorder's `record_call` (derive + record every family): "
            f"{_stat(samples, 1)} µs."]


@contextlib.contextmanager
def _metrics_only() -> Iterator[None]:
    """Our hooks without spans: the peer's run installs a global SDK TracerProvider, which
    would otherwise give every measured call of ours a span too (measured apart, below)."""
    from exporter._internal import otel

    original = otel.trace.get_tracer_provider
    otel.trace.get_tracer_provider = otel.trace.NoOpTracerProvider
    try:
        yield
    finally:
        otel.trace.get_tracer_provider = original


def _tracing_off_and_on(fn: Callable[[], int], runs: int, calls: int
                        ) -> tuple[list[float], list[float], list[float]]:
    """µs per call of `fn` without and with an SDK TracerProvider, interleaved run by run,
    and of a bare span on that provider (what any tracing of the call would cost at least)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (BatchSpanProcessor, SpanExporter,
                                                SpanExportResult)

    from exporter._internal import otel

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    original = otel.trace.get_tracer_provider
    tracer = provider.get_tracer("bench")
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                  "gen_ai.provider.name": "p"}

    def bare_spans() -> int:
        start = time.perf_counter_ns()
        for _ in range(calls):
            tracer.start_span("chat m", attributes=attributes).end()
        return (time.perf_counter_ns() - start) // calls

    off: list[float] = []
    on: list[float] = []
    bare: list[float] = []
    try:
        for _ in range(runs):
            otel.trace.get_tracer_provider = otel.trace.NoOpTracerProvider
            gc.collect()
            off.append(fn() / 1000)
            otel.trace.get_tracer_provider = lambda: provider
            gc.collect()
            on.append(fn() / 1000)
            bare.append(bare_spans() / 1000)
    finally:
        otel.trace.get_tracer_provider = original
        provider.shutdown()
    return off, on, bare


#: Medians the sections above measured, for the goals table (filled as they run).
_FIGURES: dict[str, float] = {}


def goals() -> list[str]:
    """Each goal of issues #3 and #6 with its figure; for a missed one, why and what would
    close it (the reasons are measured above: the read, the recorder, the bare span)."""
    f = _FIGURES
    rows = ["| goal | measured | status |", "| --- | --- | --- |"]

    def row(goal: str, value: str, met: bool, why: str) -> None:
        rows.append(f"| {goal} | {value} | {'met' if met else 'missed: ' + why} |")

    row("≤ 200 ns added per streamed chunk (the wrapper, in isolation)",
        f"{f['wrapper_ns']:.0f} ns", f["wrapper_ns"] <= 200,
        f"{f['read_ns']:.0f} ns of it is the SDK object's own `choices[0].delta.content` read "
        "(slow when CPython 3.11's type attribute cache collides, which importing "
        "prometheus_client causes), the rest a stamp, an append and a generator resume. "
        "Closing it needs the chunk's fields read without pydantic's attribute path, e.g. in "
        "C (no faster pure-Python read was found, `__dict__` included)")
    if "openllmetry_added_ns" in f:
        ratio = f["openllmetry_added_ns"] / max(f["wrapper_ns"], 1)
        row("≥ 100× less per chunk than OpenLLMetry", f"{ratio:.0f}× (its "
            f"{f['openllmetry_added_ns'] / 1000:.1f} µs / our wrapper)", ratio >= 100,
            "follows from the wrapper's cost above")
    row("≤ 20 µs fixed cost per call", f"{f['call_us']:.1f} µs", f["call_us"] <= 20,
        "the recorder's `record_call` is ~half; see the recorder section")
    row("≤ 30 µs per call with tracing on", f"{f['traced_call_us']:.1f} µs",
        f["traced_call_us"] <= 30,
        f"the OpenTelemetry SDK's own work: a bare 3-attribute span costs "
        f"{f['bare_span_us']:.1f} µs on the same provider, and ours carries ~20 attributes "
        "(validated at ~1 µs each) and 7 boundary events (~6 µs each). Closing it: drop the "
        "phase attributes (the events carry the same times) or emit only the events that "
        "differ from the previous stamp")
    row("still ≤ 200 ns per chunk with tracing on", f"{f['wrapper_ns']:.0f} ns, as without "
        "tracing (the span is per call, never per chunk)", f["wrapper_ns"] <= 200,
        "the wrapper's cost, first row")
    return ["Goals:", "", *rows]


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "?"


def run(quick: bool) -> list[str]:
    runs = 3 if quick else 15
    chunks = 200 if quick else CHUNKS
    modes = _Mode()
    lines = [f"openai {_version('openai')}; goal: ≤ 200 ns added per chunk, "
             "≤ 20 µs per call.", ""]
    lines += stream_consumption(modes, runs, chunks) + [""]
    lines += wrapper_alone(runs * 3, chunks) + [""]
    with _metrics_only():
        lines += per_call(modes, runs, 20 if quick else 200) + [""]
        lines += isolated_per_call(runs, 100 if quick else 2000)
    return lines + [""] + goals()


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
