"""The demo provider, driven by the real openai and anthropic SDKs.

Scripted requests (`x-demo-script`) pin the wire formats and the timings; small custom latency
models show queueing, the prompt cache and the noisy neighbour in well under a second each.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from exporter._internal.demo.latency import LatencyModel, LatencySimulator, ModelProfile
from exporter._internal.demo.provider import SCRIPT_HEADER, ProviderServer, run_provider
from tests.support.timing import timing

MESSAGES: list[Any] = [{"role": "user", "content": "Why was that call slow?"}]
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]
TOLERANCE = 0.02  # seconds; the brief's ±20 ms


def script(**keys: Any) -> dict[str, str]:
    return {SCRIPT_HEADER: json.dumps(keys)}


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


@pytest.fixture
def oai(server: ProviderServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url=server.base_url + "/v1", max_retries=0)


@pytest.fixture
def claude(server: ProviderServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=server.base_url, max_retries=0)


# --- OpenAI Chat Completions -------------------------------------------------------------------

def test_chat_stream_sends_role_first_then_one_token_per_chunk_then_usage(oai: openai.OpenAI):
    stream = oai.chat.completions.create(
        model="gpt-4.1", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        extra_headers=script(tokens=5, input_tokens=1200, cached_tokens=1024))
    chunks = list(stream)

    first = chunks[0].choices[0].delta
    assert (first.role, first.content, first.tool_calls) == ("assistant", "", None)
    contents = [c.choices[0].delta.content for c in chunks[1:]
                if c.choices and c.choices[0].delta.content]
    assert "".join(contents) == "Time to first token is"
    assert len(contents) == 5
    assert chunks[-2].choices[0].finish_reason == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1200, 5, 1205)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1024
    assert {c.model for c in chunks} == {"gpt-4.1"}


def test_chat_non_stream(oai: openai.OpenAI):
    completion = oai.chat.completions.create(model="llama-3-8b", messages=MESSAGES,
                                             extra_headers=script(tokens=3))
    assert completion.model == "llama-3-8b"
    assert completion.choices[0].message.content == "Time to first"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert completion.usage.prompt_tokens == len("Why was that call slow?") // 4


def test_chat_reasoning_deltas_come_before_content(oai: openai.OpenAI):
    stream = oai.chat.completions.create(
        model="deepseek-r1", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        extra_headers=script(reasoning_tokens=4, tokens=3))
    kinds = []
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            if (delta.model_extra or {}).get("reasoning_content"):
                kinds.append("reasoning")
            elif delta.content:
                kinds.append("content")
        else:
            usage = chunk.usage
    assert kinds == ["reasoning"] * 4 + ["content"] * 3
    assert usage is not None and usage.completion_tokens == 7
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 4


def test_chat_tool_call_arguments_stream_as_tool_call_deltas(oai: openai.OpenAI):
    stream = oai.chat.completions.create(model="gpt-4.1", messages=MESSAGES, tools=TOOLS,
                                         stream=True,
                                         extra_headers=script(tool_call=True, tokens=4))
    calls = [c.choices[0].delta.tool_calls[0] for c in stream
             if c.choices and c.choices[0].delta.tool_calls]
    assert len(calls) == 4
    assert calls[0].id is not None
    assert (calls[0].type, calls[0].function.name) == ("function", "lookup")
    assert all(call.index == 0 and call.id is None for call in calls[1:])
    arguments = "".join(call.function.arguments for call in calls)
    assert json.loads(arguments) == {"text": "Time to first token"}

    completion = oai.chat.completions.create(model="gpt-4.1", messages=MESSAGES, tools=TOOLS,
                                             extra_headers=script(tool_call=True, tokens=2))
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.choices[0].message.tool_calls[0].function.arguments == '{"text": "Time to"}'


def test_tool_call_without_tools_in_the_request_streams_content(oai: openai.OpenAI):
    completion = oai.chat.completions.create(model="gpt-4.1", messages=MESSAGES,
                                             extra_headers=script(tool_call=True, tokens=2))
    assert completion.choices[0].message.content == "Time to"


# --- OpenAI Responses --------------------------------------------------------------------------

def test_responses_stream_events_and_usage(oai: openai.OpenAI):
    stream = oai.responses.create(model="gpt-4.1", input="Why?", stream=True,
                                  extra_headers=script(tokens=3, input_tokens=2048,
                                                       cached_tokens=1024))
    events = list(stream)
    types = [event.type for event in events]
    assert types == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 3,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Time to first"
    completed = events[-1].response
    assert completed.output_text == "Time to first" and completed.model == "gpt-4.1"
    assert completed.usage is not None
    assert (completed.usage.input_tokens, completed.usage.output_tokens) == (2048, 3)
    assert completed.usage.input_tokens_details.cached_tokens == 1024


def test_responses_stream_helper_with_reasoning_summary(oai: openai.OpenAI):
    with oai.responses.stream(model="deepseek-r1", input="Why?",
                              extra_headers=script(reasoning_tokens=3, tokens=2)) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types.count("response.reasoning_summary_text.delta") == 3
    assert types.count("response.output_text.delta") == 2
    first_answer = types.index("response.output_text.delta")
    assert types.index("response.reasoning_summary_text.delta") < first_answer
    assert final.output_text == "Time to"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].summary[0].text == "The user asks"
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens == 3


def test_responses_tool_call_and_non_stream(oai: openai.OpenAI):
    tools: list[Any] = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    with oai.responses.stream(model="gpt-4.1", input="Why?", tools=tools,
                              extra_headers=script(tool_call=True, tokens=3)) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert len(deltas) == 3
    call = final.output[0]
    assert call.type == "function_call" and call.name == "lookup"
    assert json.loads(call.arguments) == {"text": "Time to first"}

    response = oai.responses.create(model="gpt-4.1", input="Why?", extra_headers=script(tokens=4))
    assert response.output_text == "Time to first token" and response.status == "completed"


# --- Anthropic Messages ------------------------------------------------------------------------

def test_anthropic_raw_stream_events(claude: anthropic.Anthropic):
    stream = claude.messages.create(model="claude-demo", max_tokens=100, messages=MESSAGES,
                                    stream=True,
                                    extra_headers=script(tokens=3, input_tokens=3000,
                                                         cached_tokens=2048))
    events = list(stream)
    assert [e.type for e in events] == [
        "message_start", "content_block_start", *["content_block_delta"] * 3,
        "content_block_stop", "message_delta", "message_stop"]
    usage = events[0].message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (3000 - 2048, 2048)
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == "Time to first"
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 3
    assert events[0].message.model == "claude-demo"


def test_anthropic_stream_helper_with_thinking(claude: anthropic.Anthropic):
    with claude.messages.stream(model="claude-demo", max_tokens=100, messages=MESSAGES,
                                extra_headers=script(reasoning_tokens=2, tokens=3)) as stream:
        thinking = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert thinking == ["The", " user"]
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[1].text == "Time to first"
    assert final.usage.output_tokens == 5


def test_anthropic_tool_use_and_non_stream(claude: anthropic.Anthropic):
    tools: list[Any] = [{"name": "lookup", "input_schema": {"type": "object"}}]
    with claude.messages.stream(model="claude-demo", max_tokens=100, messages=MESSAGES,
                                tools=tools,
                                extra_headers=script(tool_call=True, tokens=2)) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert (final.content[0].name, final.content[0].input) == ("lookup", {"text": "Time to"})

    message = claude.messages.create(model="claude-demo", max_tokens=100, messages=MESSAGES,
                                     extra_headers=script(tokens=2))
    assert message.content[0].text == "Time to" and message.usage.output_tokens == 2


# --- Errors and broken connections -------------------------------------------------------------

@pytest.mark.parametrize(("status", "error"),
                         [(429, "RateLimitError"), (500, "InternalServerError")])
def test_http_errors_raise_the_sdk_errors(oai: openai.OpenAI, claude: anthropic.Anthropic,
                                          status: int, error: str):
    with pytest.raises(getattr(openai, error)) as raised:
        oai.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                    extra_headers=script(status=status))
    assert set(raised.value.body) >= {"message", "type", "code"}
    with pytest.raises(getattr(anthropic, error)) as raised_anthropic:
        claude.messages.create(model="m", max_tokens=10, messages=MESSAGES,
                               extra_headers=script(status=status))
    assert raised_anthropic.value.body["type"] == "error"
    if status == 429:
        assert raised.value.response.headers["retry-after"] == "1"


def test_malformed_script_is_a_400(oai: openai.OpenAI):
    with pytest.raises(openai.BadRequestError, match="unknown"):
        oai.chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(tokenz=3))


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_after_makes_the_sdks_raise(oai: openai.OpenAI, claude: anthropic.Anthropic,
                                               stream: bool):
    headers = script(tokens=5, disconnect_after=2)
    received = []
    with pytest.raises(openai.APIConnectionError):
        result = oai.chat.completions.create(model="m", messages=MESSAGES, stream=stream,
                                             extra_headers=headers)
        if stream:
            received.extend(chunk.choices[0].delta.content for chunk in result)
    assert received == (["", "Time", " to"] if stream else [])
    # Anthropic's stream iterator lets the transport error through unwrapped.
    with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
        result = claude.messages.create(model="m", max_tokens=10, messages=MESSAGES,
                                        stream=stream, extra_headers=headers)
        if stream:
            list(result)


# --- Scripted timings --------------------------------------------------------------------------

@timing
def test_scripted_timings_hold_within_20ms(oai: openai.OpenAI):
    started = time.perf_counter()
    stream = oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True,
        extra_headers=script(server_wait=0.1, prefill=0.12, tokens=6, gap=0.03,
                             stall_after=3, stall=0.15))
    headers = time.perf_counter()
    arrivals = [(time.perf_counter(), chunk.choices[0].delta.content) for chunk in stream
                if chunk.choices and chunk.choices[0].delta.content is not None]
    framing, tokens = arrivals[0], [at for at, text in arrivals[1:] if text]

    assert headers - started == pytest.approx(0.1, abs=TOLERANCE)
    assert framing[1] == "" and framing[0] - headers < TOLERANCE
    assert tokens[0] - headers == pytest.approx(0.12, abs=TOLERANCE)
    gaps = [b - a for a, b in itertools.pairwise(tokens)]
    assert gaps == pytest.approx([0.03, 0.03, 0.18, 0.03, 0.03], abs=TOLERANCE)


def _first_event_times(api: str, client: Any) -> tuple[float, float]:
    """Seconds from the headers to the first framing event and to the first token event."""
    headers_kw = {"extra_headers": script(prefill=0.1, tokens=2)}
    if api == "chat":
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                **headers_kw)
        is_token = lambda e: bool(e.choices and e.choices[0].delta.content)  # noqa: E731
    elif api == "responses":
        stream = client.responses.create(model="m", input="Why?", stream=True, **headers_kw)
        is_token = lambda e: e.type == "response.output_text.delta"  # noqa: E731
    else:
        stream = client.messages.create(model="m", max_tokens=10, messages=MESSAGES, stream=True,
                                        **headers_kw)
        is_token = lambda e: e.type == "content_block_delta"  # noqa: E731
    headers = time.perf_counter()
    framing = token = None
    for event in stream:
        now = time.perf_counter() - headers
        if is_token(event):
            token = token if token is not None else now
        elif framing is None:
            framing = now
    assert framing is not None and token is not None
    return framing, token


@timing
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_framing_arrives_before_the_prefill(oai: openai.OpenAI, claude: anthropic.Anthropic,
                                            api: str):
    framing, token = _first_event_times(api, claude if api == "messages" else oai)
    assert framing < TOLERANCE
    assert token == pytest.approx(0.1, abs=TOLERANCE)


# --- The latency model -------------------------------------------------------------------------

def _model(**knobs: Any) -> LatencyModel:
    """One deterministic model "m" (no jitter, no overhead), with `knobs` overriding."""
    profile_knobs = {k: knobs.pop(k) for k in list(knobs) if k in ModelProfile.__dataclass_fields__}
    profile = ModelProfile(**{"name": "m", "slots": 8, "prefill_tokens_per_s": 1e9,
                              "decode_tokens_per_s": 100, "jitter": 0.0,
                              "output_tokens": (5, 5), "server_overhead_s": 0.0,
                              **profile_knobs})
    return dataclasses.replace(LatencyModel.default(), models=(profile,), **knobs)


def test_simulator_is_deterministic_for_a_seed():
    clock = lambda: 100.0  # noqa: E731
    def plans(seed: int) -> list[Any]:
        simulator = LatencySimulator(dataclasses.replace(LatencyModel.default(), seed=seed), clock)
        return [simulator.plan(name, "t", 500) for name in ("llama-3-8b", "gpt-4.1", "deepseek-r1")]
    assert plans(1) == plans(1) != plans(2)
    fast, medium, reasoning = plans(1)
    assert fast.reasoning_tokens == medium.reasoning_tokens == 0 < reasoning.reasoning_tokens
    assert len(reasoning.gaps) == reasoning.reasoning_tokens + reasoning.answer_tokens - 1
    assert fast.prefill < medium.prefill < reasoning.prefill


async def _stream_arrivals(client: openai.AsyncOpenAI, tenant: str, model: str = "m",
                           **headers: str) -> tuple[float, list[float], Any]:
    """(seconds to headers, token arrival times, usage) of one unscripted streamed call."""
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        extra_headers={"x-demo-tenant": tenant, **headers})
    headers_at = time.perf_counter() - started
    arrivals, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
        usage = chunk.usage or usage
    return headers_at, arrivals, usage


async def test_queue_wait_grows_with_concurrency():
    provider = await run_provider(model=_model(slots=2, output_tokens=(10, 10)))  # 0.1 s a call
    try:
        async with openai.AsyncOpenAI(api_key="test", base_url=provider.base_url + "/v1",
                                      max_retries=0) as client:
            results = await asyncio.gather(*(_stream_arrivals(client, "t") for _ in range(6)))
    finally:
        await provider.close()
    waits = sorted(headers_at for headers_at, _, _ in results)
    # Two slots: pairs of calls wait 0, 1 and 2 service times before their headers.
    assert waits[2] - waits[1] > 0.06 and waits[4] - waits[3] > 0.06
    assert waits[5] > 0.18


async def test_prompt_cache_is_per_tenant_and_goes_cold_when_idle():
    model = _model(prefill_tokens_per_s=10_000, cache_idle_seconds=0.15)
    provider = await run_provider(model=model)
    big_prompt = {"x-demo-input-tokens": "2000"}  # 0.2 s of prefill when cold

    async def call(tenant: str) -> tuple[int, float]:
        started = time.perf_counter()
        _, arrivals, usage = await _stream_arrivals(client, tenant, **big_prompt)
        return usage.prompt_tokens_details.cached_tokens, arrivals[0] - started

    try:
        async with openai.AsyncOpenAI(api_key="test", base_url=provider.base_url + "/v1",
                                      max_retries=0) as client:
            cold, warm, other_tenant = await call("a"), await call("a"), await call("b")
            await asyncio.sleep(0.2)
            idle = await call("a")
    finally:
        await provider.close()
    assert cold[0] == 0 and cold[1] > 0.2
    assert warm[0] == 2000 and warm[1] < cold[1] / 2
    assert other_tenant[0] == 0
    assert idle[0] == 0 and idle[1] > 0.2


async def test_noisy_neighbour_stalls_every_stream_of_its_model():
    # The noisy tenant's 40k-token prefill takes 0.4 s and pauses the batch of model "m".
    model = _model(prefill_tokens_per_s=100_000, decode_tokens_per_s=50, output_tokens=(30, 30),
                   noisy_probability=1.0, noisy_input_tokens=40_000, batch_block_tokens=32_000)
    provider = await run_provider(model=model)
    try:
        async with openai.AsyncOpenAI(api_key="test", base_url=provider.base_url + "/v1",
                                      max_retries=0) as client:
            victim = asyncio.create_task(_stream_arrivals(client, "tenant-a"))
            bystander = asyncio.create_task(_stream_arrivals(client, "tenant-a", model="other"))
            await asyncio.sleep(0.1)  # both streams are decoding
            noisy = await _stream_arrivals(client, "tenant-noisy")
            _, victim_arrivals, _ = await victim
            _, bystander_arrivals, _ = await bystander
    finally:
        await provider.close()

    def gaps(arrivals: list[float]) -> list[float]:
        return [b - a for a, b in itertools.pairwise(arrivals)]

    assert statistics.median(gaps(victim_arrivals)) < 0.05
    assert max(gaps(victim_arrivals)) > 0.3
    assert max(gaps(bystander_arrivals)) < 0.2  # another model's batch is not blocked
    assert noisy[2].prompt_tokens == 40_000 and noisy[2].prompt_tokens_details.cached_tokens == 0


async def test_run_provider_refuses_non_loopback_addresses():
    with pytest.raises(ValueError, match="loopback"):
        await run_provider(host="0.0.0.0")
