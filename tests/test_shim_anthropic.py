"""The anthropic patch against the demo provider (Messages SSE), with the real SDK."""

from __future__ import annotations

import asyncio
import gc

import anthropic
import httpx2
import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.record.timeline import derive
from tests import test_shim_support as support
from tests.support.timing import timing
from tests.test_shim_support import Recorded, assert_from_wire, assert_near, drops, script

# Shared fixtures of tests/test_shim_support.py.
server, recorded, instrumented = support.server, support.recorded, support.instrumented

MESSAGES = [{"role": "user", "content": "why is my first token slow?"}]
TOOLS = [{"name": "lookup", "description": "look it up",
          "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}]


def client(server, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0, **kw)


def aclient(server, **kw) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.base_url, api_key="test", max_retries=0,
                                    **kw)


def create(c, stream=True, **s):
    return c.messages.create(model="claude-test", max_tokens=100, messages=MESSAGES,
                             stream=stream, extra_headers=script(**s))


def twice(recorded: Recorded, fn):
    """The second run is measured (the first pays the SDK's first-use costs)."""
    fn()
    recorded.all()
    gc.collect()  # no gen-2 collector pass inside the measured run (see test_shim_openai.quiet)
    return fn()


@timing
def test_scripted_stream_phases_usage_and_thinking(server, recorded):
    c = client(server)

    def run():
        with exporter.labels(route="agent", tenant="acme"):
            return [e.type for e in create(c, server_wait=0.1, prefill=0.12, reasoning_tokens=3,
                                           tokens=4, gap=0.02, stall_after=5, stall=0.15,
                                           input_tokens=900, cached_tokens=600)]

    types = twice(recorded, run)
    assert types[:2] == ["message_start", "content_block_start"] and "ping" not in types
    t = recorded.one()
    d = derive(t)
    assert (t.model, t.provider, t.route, t.tenant, t.outcome) == \
        ("claude-test", "local", "agent", "acme", "ok")
    # input is the whole prompt: uncached 300 + cache reads 600 (Anthropic counts them apart)
    assert (t.input_tokens, t.cached_input_tokens, t.output_tokens) == (900, 600, 7)
    assert t.reasoning_events == 3 and len(t.token_times) == 7
    assert_near(d.phases["server"], 0.1, "server")
    assert_near(d.phases["prefill"], 0.12, "prefill")
    assert_from_wire(d.ttft, d, 0.22, "ttft (first thinking token)")
    assert_from_wire(d.first_answer, d, 0.28, "first answer token")
    assert_near(d.phases["reasoning"], 0.06, "reasoning")
    assert_near(d.stall, 0.17, "stall")
    assert_near(d.phases["decode"], 0.21, "decode")
    for gap, want in zip(d.gaps, (0.02, 0.02, 0.02, 0.02, 0.17, 0.02)):
        assert_near(gap, want, "gap")


@timing
def test_messages_stream_helper_sync_and_tool_use(server, recorded):
    c = client(server)

    def run():
        with c.messages.stream(model="claude-test", max_tokens=100, messages=MESSAGES,
                               tools=TOOLS, extra_headers=script(prefill=0.08, tool_call=True,
                                                                 tokens=4, gap=0.01)) as s:
            return s.get_final_message()

    message = twice(recorded, run)
    assert message.content[0].type == "tool_use" and message.content[0].input == {
        "text": "Time to first token"}
    t = recorded.one()
    assert t.outcome == names.OK and len(t.token_times) == 4 and t.reasoning_events == 0
    assert_from_wire(derive(t).first_answer, derive(t), 0.08, "first tool token")


def test_messages_stream_text_stream(server, recorded):
    c = client(server)
    with c.messages.stream(model="claude-test", max_tokens=100, messages=MESSAGES,
                           extra_headers=script(tokens=5)) as s:
        text = "".join(s.text_stream)
    assert text.startswith("Time to first")
    t = recorded.one()
    assert t.outcome == names.OK and len(t.token_times) == 5


@timing
def test_non_stream_message(server, recorded):
    c = client(server)
    message = twice(recorded, lambda: create(c, stream=False, server_wait=0.05, prefill=0.05,
                                             tokens=3, gap=0.01, input_tokens=40,
                                             cached_tokens=30))
    assert type(message) is anthropic.types.Message
    t = recorded.one()
    d = derive(t)
    assert (t.input_tokens, t.cached_input_tokens, t.output_tokens) == (40, 30, 3)
    assert_from_wire(d.ttft, d, 0.12, "ttft")
    assert "server" not in d.phases and t.token_times == []


def test_errors_are_the_sdks(server, recorded):
    c = client(server)
    with pytest.raises(anthropic.InternalServerError) as caught:
        create(c, status=500)
    assert type(caught.value) is anthropic.InternalServerError
    with pytest.raises(anthropic.RateLimitError):
        create(c, status=429)
    # a cut stream: anthropic before 2.17 lets the transport error through, 2.17 wraps it in
    # APIConnectionError (from it); either way the SDK's own error reaches the caller
    with pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)) as cut_error:
        for _ in create(c, tokens=8, gap=0.01, disconnect_after=2):
            pass
    assert isinstance(cut_error.value, httpx2.RemoteProtocolError) or \
        isinstance(cut_error.value.__cause__, httpx2.RemoteProtocolError)
    e500, e429, cut = recorded.all()
    assert (e500.outcome, e429.outcome, cut.outcome) == \
        (names.PROVIDER_ERROR, names.RATE_LIMITED, names.CONNECTION_ERROR)
    assert len(cut.token_times) == 2


@timing
def test_timeout_and_abandon(server, recorded):
    c = client(server, timeout=0.25)
    with pytest.raises(anthropic.APITimeoutError):
        create(c, server_wait=1.0)
    t = recorded.one()
    assert t.outcome == names.TIMEOUT
    assert_near(derive(t).duration, 0.25, "timeout")
    with c.messages.stream(model="claude-test", max_tokens=100, messages=MESSAGES,
                           extra_headers=script(tokens=6, gap=0.01)):
        pass  # never iterated
    assert recorded.one().outcome == names.ABANDONED
    s = create(c, tokens=6, gap=0.01)
    for _ in s:
        break
    del s  # anthropic's stream has no reference cycle: dropped means closed
    assert recorded.one().outcome == names.ABANDONED
    assert all(v == 0 for v in runtime.state().recorder.rows[names.REQUESTS_IN_FLIGHT].values())


def test_transparency(server):
    c = client(server)

    def summary():
        return [(type(e), e.type, getattr(getattr(e, "delta", None), "text", None))
                for e in create(c, reasoning_tokens=2, tokens=4)]

    before = summary()
    exporter.instrument()
    try:
        patched = summary()
        s = create(c, tokens=1)
        assert type(s) is anthropic.Stream and "close" not in vars(s)
        s.close()
    finally:
        exporter.uninstrument()
    assert before == patched == summary()


@timing
async def test_async_stream_helper_cancel_and_concurrency(server, recorded):
    c = aclient(server)
    for _ in range(2):
        recorded.all()
        gc.collect()
        async with c.messages.stream(model="claude-test", max_tokens=100, messages=MESSAGES,
                                     extra_headers=script(server_wait=0.05, prefill=0.1,
                                                          tokens=4, gap=0.02)) as s:
            async for _ in s.text_stream:
                pass
    t = recorded.one()
    d = derive(t)
    assert t.outcome == names.OK and len(t.token_times) == 4
    assert_near(d.phases["server"], 0.05, "server")
    assert_from_wire(d.ttft, d, 0.15, "ttft")

    async def consume():
        s = await c.messages.create(model="claude-test", max_tokens=10, messages=MESSAGES,
                                    stream=True, extra_headers=script(tokens=4, gap=1.0))
        async for _ in s:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)  # the scenario: the caller gives up mid-stream
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorded.one().outcome == names.CANCELLED

    async def one(i):
        async with exporter.labels(tenant=f"t{i % 5}"):
            s = await c.messages.create(model="claude-test", max_tokens=10, messages=MESSAGES,
                                        stream=True, extra_headers=script(tokens=3, gap=0.01))
            return [e async for e in s]

    await asyncio.gather(*(one(i) for i in range(50)))
    timelines = recorded.all()
    assert len(timelines) == 50 and {t.outcome for t in timelines} == {names.OK}
    assert all(len(t.token_times) == 3 for t in timelines) and drops() == 0


def test_closing_at_message_stop_is_not_abandoning(server, recorded):
    c = client(server)
    s = create(c, tokens=3)
    for event in s:
        if event.type == "message_stop":
            break
    s.close()
    t = recorded.one()
    assert t.outcome == names.OK and len(t.token_times) == 3
