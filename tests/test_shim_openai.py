"""The openai patch against the demo provider, with the real SDK: timings, tokens, outcomes,
transparency. Every timing is scripted per request (`x-demo-script`) and checked to ±10 ms or
±5 % (tests/test_shim_support.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import traceback

import httpx2
import openai
import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.record.timeline import derive
from tests import test_shim_support as support
from tests.support.timing import timing
from tests.test_shim_support import Recorded, assert_from_wire, assert_near, drops, script

# Shared fixtures of tests/test_shim_support.py; every test runs with both trace extensions.
server, recorded, instrumented = support.server, support.recorded, support.instrumented
trace_extension = support.trace_extension
pytestmark = pytest.mark.usefixtures("trace_extension")

MESSAGES = [{"role": "user", "content": "why is my first token slow?"}]
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]
RESPONSE_TOOLS = [{"type": "function", "name": "lookup",
                   "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}]


def client(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0, **kw)


def aclient(server, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0,
                              **kw)


def warm(c: openai.OpenAI, recorded: Recorded) -> None:
    """One call first, so the measured one does not pay the SDK's first-use imports."""
    c.chat.completions.create(model="warm", messages=MESSAGES, extra_headers=script(tokens=1))
    c.responses.create(model="warm", input="hi", extra_headers=script(tokens=1))
    list(c.responses.create(model="warm", input="hi", stream=True, extra_headers=script(tokens=1)))
    recorded.all()


def quiet() -> None:
    """A full collection now, so that no gen-2 pass of the collector (100+ ms with two SDKs'
    worth of objects on a loaded machine) falls inside a measured window."""
    gc.collect()


def measured(recorded: Recorded, fn, *args, **kw):
    """Run `fn` twice and keep the second run's calls: the first pays the SDK's first-use costs
    (lazy imports, pydantic models built on first use), which are real but not scripted."""
    fn(*args, **kw)
    recorded.all()
    quiet()
    return fn(*args, **kw)


def chat_stream(c, **s):
    return c.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True,
                                     stream_options={"include_usage": True},
                                     extra_headers=script(**s))


@timing
def test_scripted_stream_every_phase_and_metric(server, recorded):
    c = client(server)
    warm(c, recorded)
    quiet()
    with exporter.labels(route="support-bot", tenant="acme"):
        for _ in chat_stream(c, server_wait=0.2, prefill=0.15, tokens=6, gap=0.03,
                             stall_after=3, stall=0.2, input_tokens=1200, cached_tokens=1000):
            pass
    t = recorded.one()
    d = derive(t)
    assert (t.model, t.provider, t.route, t.tenant, t.outcome) == \
        ("gpt-test", "local", "support-bot", "acme", "ok")
    assert (t.input_tokens, t.output_tokens, t.cached_input_tokens) == (1200, 6, 1000)
    client_side = d.phases["queue"] + d.phases["connect"] + d.phases["send"]
    assert client_side < 10_000, d.phases
    assert_near(d.phases["server"], 0.2, "server")
    assert_near(d.phases["prefill"], 0.15, "prefill")
    assert_near(d.ttft, 0.35, "ttft")
    assert_near(d.first_answer, 0.35, "first answer")
    assert len(d.gaps) == 5
    for gap, want in zip(d.gaps, (0.03, 0.03, 0.23, 0.03, 0.03)):
        assert_near(gap, want, "inter-token gap")
    assert_near(d.stall, 0.23, "stall")
    assert_near(d.phases["decode"], 0.35, "decode")
    assert_near(d.tpot, 0.07, "time per output token")
    assert_near(d.duration, 0.70, "duration")
    assert "reasoning" not in d.phases
    rec = runtime.state().recorder
    assert rec.rows[names.REQUESTS_TOTAL][("gpt-test", "ok", "local", "support-bot", "acme")] == 1
    assert rec.rows[names.REQUESTS_IN_FLIGHT][("gpt-test", "local", "support-bot")] == 0


@timing
def test_framing_first_stream_starts_ttft_at_the_first_token(server, recorded):
    """The role-only chunk arrives right after the headers; the first token after prefill."""
    c = client(server)
    warm(c, recorded)
    quiet()
    chunks = list(chat_stream(c, server_wait=0.05, prefill=0.2, tokens=3, gap=0.01))
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    t = recorded.one()
    d = derive(t)
    assert_from_wire((t.first_byte - t.start) // 1000, d, 0.05, "first byte (framing)")
    assert_from_wire(d.ttft, d, 0.25, "ttft")
    assert len(t.token_times) == 3  # role-only, finish and usage-only chunks are framing


@timing
def test_reasoning_stream(server, recorded):
    c = client(server)
    text = reasoning = ""
    for chunk in measured(recorded, lambda: list(chat_stream(c, prefill=0.1, reasoning_tokens=4,
                                                             tokens=3, gap=0.03))):
        if chunk.choices:
            delta = chunk.choices[0].delta
            text += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
    assert text and reasoning
    t = recorded.one()
    d = derive(t)
    assert t.reasoning_events == 4 and len(t.token_times) == 7 and t.output_tokens == 7
    assert_from_wire(d.ttft, d, 0.1, "ttft (first reasoning token)")
    assert_from_wire(d.first_answer, d, 0.22, "first answer token")
    assert_near(d.phases["reasoning"], 0.12, "reasoning phase")
    assert_near(d.phases["decode"], 0.06, "decode")


@timing
def test_tool_call_stream(server, recorded):
    c = client(server)

    def tool_stream():
        arguments = ""
        for chunk in c.chat.completions.create(model="gpt-test", messages=MESSAGES, tools=TOOLS,
                                               stream=True,
                                               extra_headers=script(tool_call=True, tokens=4,
                                                                    prefill=0.08, gap=0.02)):
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                arguments += call.function.arguments or ""
        return arguments

    arguments = measured(recorded, tool_stream)
    assert arguments.startswith('{"text"')
    t = recorded.one()
    d = derive(t)
    assert len(t.token_times) == 4 and t.reasoning_events == 0
    assert_from_wire(d.first_answer, d, 0.08, "first tool-argument token")
    assert_near(d.phases["decode"], 0.06, "decode")


@timing
def test_responses_stream_reasoning_summary_and_text(server, recorded):
    c = client(server)
    kinds = measured(recorded, lambda: [e.type for e in c.responses.create(
        model="gpt-test", input="hi", stream=True,
        extra_headers=script(server_wait=0.05, prefill=0.1, reasoning_tokens=2, tokens=3,
                             gap=0.02, input_tokens=50, cached_tokens=20))])
    assert kinds[:2] == ["response.created", "response.in_progress"]
    t = recorded.one()
    d = derive(t)
    assert t.reasoning_events == 2 and len(t.token_times) == 5
    assert (t.input_tokens, t.output_tokens, t.cached_input_tokens) == (50, 5, 20)
    assert_near(d.phases["server"], 0.05, "server")
    assert_from_wire(d.ttft, d, 0.15, "ttft")
    assert_from_wire(d.first_answer, d, 0.19, "first answer")


@timing
def test_responses_tool_call_stream(server, recorded):
    c = client(server)
    measured(recorded, lambda: list(c.responses.create(
        model="gpt-test", input="hi", tools=RESPONSE_TOOLS, stream=True,
        extra_headers=script(tool_call=True, tokens=3, prefill=0.05))))
    t = recorded.one()
    assert len(t.token_times) == 3 and t.first_answer_token == t.token_times[0]
    assert_from_wire(derive(t).ttft, derive(t), 0.05, "ttft")


@timing
def test_non_stream_calls_ttft_is_the_parsed_body(server, recorded):
    """Not streamed: the first token reaches the caller with the whole body; only the network
    phases exist apart (server and prefill are not recorded)."""
    c = client(server)
    warm(c, recorded)
    quiet()
    completion = c.chat.completions.create(
        model="gpt-test", messages=MESSAGES,
        extra_headers=script(server_wait=0.1, prefill=0.05, tokens=5, gap=0.01,
                             input_tokens=80, cached_tokens=64))
    assert completion.choices[0].message.content
    response = c.responses.create(model="gpt-test", input="hi",
                                  extra_headers=script(server_wait=0.05, tokens=2))
    assert response.output_text
    chat, resp = recorded.all()
    d = derive(chat)
    assert_from_wire(d.ttft, d, 0.19, "ttft")
    assert d.first_answer == d.ttft and d.duration == d.ttft
    assert set(d.phases) == {"queue", "connect", "send"} and d.phases["connect"] == 0  # reused
    assert (chat.input_tokens, chat.output_tokens, chat.cached_input_tokens) == (80, 5, 64)
    assert chat.token_times == [] and d.gaps == [] and d.stall is None
    assert_from_wire(derive(resp).ttft, derive(resp), 0.05, "responses ttft")
    assert resp.output_tokens == 2 and resp.outcome == names.OK


@timing
def test_stream_helpers(server, recorded):
    c = client(server)

    def helpers():
        with c.chat.completions.stream(model="gpt-test", messages=MESSAGES,
                                       extra_headers=script(prefill=0.05, tokens=4)) as s:
            text = "".join(e.delta for e in s if e.type == "content.delta")
        assert text
        with c.responses.stream(model="gpt-test", input="hi",
                                extra_headers=script(prefill=0.05, tokens=3)) as s:
            final = s.get_final_response()
        assert final.output_text

    measured(recorded, helpers)
    chat, resp = recorded.all()
    assert chat.outcome == resp.outcome == names.OK
    assert len(chat.token_times) == 4 and len(resp.token_times) == 3
    assert_from_wire(derive(chat).ttft, derive(chat), 0.05, "chat helper ttft")
    assert_from_wire(derive(resp).ttft, derive(resp), 0.05, "responses helper ttft")


def test_with_raw_response_keeps_working(server, recorded):
    c = client(server)
    raw = c.chat.completions.with_raw_response.create(
        model="gpt-test", messages=MESSAGES, extra_headers=script(tokens=3, input_tokens=9))
    assert raw.headers.get("x-request-id") and raw.parse().choices[0].message.content
    raw = c.chat.completions.with_raw_response.create(
        model="gpt-test", messages=MESSAGES, stream=True, extra_headers=script(tokens=3))
    s = raw.parse()
    assert isinstance(s, openai.Stream)
    assert len([chunk for chunk in s]) == 5
    with c.chat.completions.with_streaming_response.create(
            model="gpt-test", messages=MESSAGES, stream=True,
            extra_headers=script(tokens=2)) as response:
        lines = list(response.iter_lines())
    assert any("[DONE]" in line for line in lines)
    plain, streamed, lines_read = recorded.all()
    assert plain.outcome == names.OK and plain.input_tokens == 9 and plain.first_token
    assert streamed.outcome == names.OK and len(streamed.token_times) == 3
    assert lines_read.outcome == names.OK and lines_read.first_token is None  # not seen


def test_types_and_protocols_are_the_sdks(server, instrumented):
    c = client(server)
    s = chat_stream(c, tokens=2)
    assert type(s) is openai.Stream and isinstance(s, openai.Stream)
    assert "close" not in vars(s) and type(s.response) is httpx2.Response
    with s as entered:
        assert entered is s
        assert next(s).object == "chat.completion.chunk"
    assert s.response.is_closed
    assert isinstance(c.chat.completions.create(model="m", messages=MESSAGES),
                      openai.types.chat.ChatCompletion)


def _stream_summary(c):
    out = []
    for chunk in chat_stream(c, reasoning_tokens=2, tokens=5):
        delta = chunk.choices[0].delta if chunk.choices else None
        out.append((type(chunk), chunk.object, chunk.model,
                    delta and (delta.role, delta.content, delta.model_extra),
                    chunk.usage and chunk.usage.model_dump()))
    return out


def test_transparency_identical_chunks_with_and_without_the_patch(server):
    c = client(server)
    before = _stream_summary(c)
    exporter.instrument()
    try:
        patched = _stream_summary(c)
    finally:
        exporter.uninstrument()
    after = _stream_summary(c)
    assert before == patched == after
    assert before[1][3][1] is None and before[1][3][2] == {"reasoning_content": "The"}


def test_same_objects_pass_through(server, instrumented):
    """The wrapper yields the very objects the SDK's own generator produced."""
    from openai import _streaming

    produced = []
    original = openai.Stream.__stream__.__wrapped__

    def spy(self):
        for item in original(self):
            produced.append(item)
            yield item

    c = client(server)
    hook = openai.Stream.__dict__["__stream__"]
    from exporter._internal.shim.hooks import stream_hook
    _streaming.Stream.__stream__ = stream_hook(spy, is_async=False)
    try:
        got = list(chat_stream(c, tokens=4))
    finally:
        _streaming.Stream.__stream__ = hook
    assert len(got) == len(produced) == 7
    assert all(a is b for a, b in zip(got, produced))


@pytest.mark.parametrize("status,error,outcome", [
    (429, openai.RateLimitError, names.RATE_LIMITED),
    (500, openai.InternalServerError, names.PROVIDER_ERROR)])
@timing
def test_http_errors_are_reraised_untouched(server, recorded, status, error, outcome):
    c = client(server)
    with pytest.raises(error) as caught:
        chat_stream(c, status=status, server_wait=0.03)
    assert type(caught.value) is error and caught.value.status_code == status
    t = recorded.one()
    assert t.outcome == outcome and t.first_token is None
    assert_near(derive(t).phases["server"], 0.03, "server")


def test_retries_are_one_call(server, recorded):
    c = client(server).with_options(max_retries=1)
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(status=500))
    t = recorded.one()
    assert t.outcome == names.PROVIDER_ERROR
    # the retried attempt is counted by what ended it, and the SDK's backoff (no retry-after:
    # its own, 0.375 to 0.5 s) is the retry phase, not the queue
    assert t.retries == {names.RETRY_SERVER_ERROR: 1}
    phases = derive(t).phases
    assert phases["retry"] >= 375_000 and phases["queue"] < 100_000, phases


def test_mid_stream_disconnect(server, recorded):
    c = client(server)
    got = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in chat_stream(c, tokens=8, gap=0.01, disconnect_after=3):
            got.append(chunk)
    t = recorded.one()
    assert t.outcome == names.CONNECTION_ERROR and len(t.token_times) == 3 and len(got) == 4


@timing
def test_client_timeout_before_and_during_the_stream(server, recorded):
    c = client(server, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        chat_stream(c, server_wait=1.0)
    with pytest.raises(openai.APITimeoutError):
        for _ in chat_stream(c, tokens=3, gap=1.0):
            pass
    before, during = recorded.all()
    assert before.outcome == during.outcome == names.TIMEOUT
    d = derive(before)  # the read timeout runs from the request on the wire
    assert_from_wire(d.duration, d, 0.3, "timeout duration")
    assert len(during.token_times) == 1


def test_abandoned_by_close_by_break_and_by_gc(server, recorded):
    c = client(server)
    s = chat_stream(c, tokens=6, gap=0.01)
    next(s), next(s)
    s.close()
    t = recorded.one()
    assert t.outcome == names.ABANDONED and len(t.token_times) == 1
    for _ in chat_stream(c, tokens=6, gap=0.01):
        break
    gc.collect()
    assert recorded.one().outcome == names.ABANDONED
    with c.chat.completions.stream(model="m", messages=MESSAGES,
                                   extra_headers=script(tokens=6, gap=0.01)) as helper:
        next(iter(helper))
    assert recorded.one().outcome == names.ABANDONED
    rec = runtime.state().recorder
    assert all(v == 0 for v in rec.rows[names.REQUESTS_IN_FLIGHT].values())


def test_exhausted_stream_is_ok_even_when_closed_after(server, recorded):
    c = client(server)
    with chat_stream(c, tokens=3) as s:
        for _ in s:
            pass
    assert recorded.one().outcome == names.OK


@timing
async def test_async_stream_timings_and_cancel(server, recorded):
    c = aclient(server)
    for _ in range(2):  # the first run pays first-use costs (see `measured`)
        recorded.all()
        quiet()
        s = await c.chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True,
            extra_headers=script(server_wait=0.1, prefill=0.1, tokens=4, gap=0.02))
        assert type(s) is openai.AsyncStream
        async for _ in s:
            pass
    t = recorded.one()
    d = derive(t)
    assert t.outcome == names.OK and len(t.token_times) == 4
    assert_near(d.phases["server"], 0.1, "server")
    assert_from_wire(d.ttft, d, 0.2, "ttft")
    assert_near(d.phases["decode"], 0.06, "decode")

    async def consume(**s):
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                 extra_headers=script(**s))
        async for _ in stream:
            pass

    for keys in ({"tokens": 4, "gap": 1.0}, {"server_wait": 1.0}):
        started = time.perf_counter()
        task = asyncio.create_task(consume(**keys))
        await asyncio.sleep(0.3)  # the scenario: the caller gives up mid-stream / mid-wait
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        elapsed = time.perf_counter() - started
        t = recorded.one()
        assert t.outcome == names.CANCELLED
        assert_near(derive(t).duration, elapsed, "cancelled duration")


async def test_async_abandon_and_responses(server, recorded):
    c = aclient(server)
    s = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                        extra_headers=script(tokens=5, gap=0.01))
    async for _ in s:
        break
    await s.close()
    assert recorded.one().outcome == names.ABANDONED
    async with c.responses.stream(model="m", input="hi",
                                  extra_headers=script(tokens=3, reasoning_tokens=1)) as s:
        await s.until_done()
    t = recorded.one()
    assert t.outcome == names.OK and t.reasoning_events == 1 and len(t.token_times) == 4


async def test_async_mid_stream_disconnect_keeps_the_sdk_error(server, recorded):
    """The async wrapper ends the call through the sync body's handlers and the caller gets the
    SDK's own error with its own traceback (no frame of the hand-over added)."""
    c = aclient(server)
    got = []
    with pytest.raises(openai.APIConnectionError) as info:
        s = await c.chat.completions.create(
            model="gpt-test", messages=MESSAGES, stream=True,
            extra_headers=script(tokens=8, gap=0.01, disconnect_after=3))
        async for chunk in s:
            got.append(chunk)
    t = recorded.one()
    assert t.outcome == names.CONNECTION_ERROR and len(t.token_times) == 3 and len(got) == 4
    frames = {frame.name for frame in traceback.extract_tb(info.value.__traceback__)}
    assert "async_tokens" in frames and not frames & {"sync_tokens", "_failed"}


async def test_100_concurrent_async_streams(server, recorded):
    c = aclient(server)

    async def one(i):
        async with exporter.labels(route="chat", tenant=f"t{i % 10}"):
            s = await c.chat.completions.create(
                model="gpt-test", messages=MESSAGES, stream=True,
                extra_headers=script(prefill=0.05, tokens=5, gap=0.01))
            return [chunk async for chunk in s]

    results = await asyncio.gather(*(one(i) for i in range(100)))
    assert all(len(r) == 7 for r in results)
    timelines = recorded.all()
    assert len(timelines) == 100 and {t.outcome for t in timelines} == {names.OK}
    assert all(len(t.token_times) == 5 for t in timelines)
    assert sorted({t.tenant for t in timelines}) == [f"t{i}" for i in range(10)]
    assert all(derive(t).ttft >= 50_000 for t in timelines)
    rec = runtime.state().recorder
    assert sum(n for k, n in rec.rows[names.REQUESTS_TOTAL].items() if k[0] == "gpt-test") == 100
    assert rec.rows[names.REQUESTS_IN_FLIGHT][("gpt-test", "local", "chat")] == 0
    assert drops() == 0


def test_8_threads_share_one_client(server, recorded):
    c = client(server)
    errors = []

    def work(i):
        try:
            with exporter.labels(route="threads", tenant=f"th{i}"):
                for _ in range(5):
                    for _ in chat_stream(c, tokens=4, gap=0.005):
                        pass
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    timelines = recorded.all()
    assert len(timelines) == 40 and {t.outcome for t in timelines} == {names.OK}
    assert {t.tenant for t in timelines} == {f"th{i}" for i in range(8)}
    assert all(len(t.token_times) == 4 for t in timelines)
    assert drops() == 0


def test_closing_after_the_finish_reason_is_not_abandoning(server, recorded):
    """A common loop stops at `finish_reason` and never reads the usage chunk or [DONE]."""
    c = client(server)
    with chat_stream(c, tokens=3) as s:
        for chunk in s:
            if chunk.choices and chunk.choices[0].finish_reason:
                break
    t = recorded.one()
    assert t.outcome == names.OK and len(t.token_times) == 3
    with c.responses.create(model="m", input="hi", stream=True,
                            extra_headers=script(tokens=2)) as s:
        for event in s:
            if event.type == "response.completed":
                break
    assert recorded.one().outcome == names.OK
