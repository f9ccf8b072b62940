"""The per-chunk loop after the first answer token (tokens.py): every shape the fast checks do
not recognise still reaches the full classifier, with the real SDKs parsing the events.

The SDK clients read exact SSE bodies from memory (`httpx2.MockTransport`), so each test states
the events and counts the tokens by hand: what the full classifier would say of each event.
"""

from __future__ import annotations

import asyncio
import gc
import json

import anthropic
import httpx2
import openai
import pytest

from exporter._internal import names
from exporter._internal.shim import tokens
from tests import test_shim_support as support
from tests.support.c_parts import built_in_c
from tests.test_shim_support import drops

recorded, instrumented = support.recorded, support.instrumented


@pytest.fixture(autouse=True, params=["c", "python"])
def loop(request, monkeypatch) -> str:
    """Every test twice: through the C loop (`_hotloop.Stamper`, which `make test` builds), and
    through `sync_tokens`, the Python loop a build without a compiler runs."""
    if request.param == "python":
        monkeypatch.setattr(tokens, "Stamper", None)
    elif not built_in_c("the C loop", tokens.Stamper is not None):
        pytest.skip("no C compiler here: the package runs the Python loop")
    return request.param

MESSAGES = [{"role": "user", "content": "hi"}]


def _sse(events: list[dict | str]) -> bytes:
    """`data:` lines (openai) or `event:` + `data:` (anthropic, dicts with a `type`)."""
    out = []
    for event in events:
        if isinstance(event, str):
            out.append(f"data: {event}\n\n")
        elif "object" in event or "response" in event.get("type", "") or "sequence_number" in \
                event:
            out.append(f"data: {json.dumps(event)}\n\n")
        else:
            out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
    return "".join(out).encode()


def _transport(body: bytes) -> httpx2.MockTransport:
    return httpx2.MockTransport(lambda request: httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body))


def _openai(body: bytes, is_async: bool = False):
    cls, http = (openai.AsyncOpenAI, httpx2.AsyncClient) if is_async else \
        (openai.OpenAI, httpx2.Client)
    return cls(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0,
               http_client=http(transport=_transport(body)))


def _anthropic(body: bytes):
    return anthropic.Anthropic(api_key="test", base_url="http://127.0.0.1:9", max_retries=0,
                               http_client=httpx2.Client(transport=_transport(body)))


def chunk(*choices: dict, **extra) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": list(choices), **extra}


def choice(index: int = 0, finish: str | None = None, **delta) -> dict:
    return {"index": index, "delta": delta, "finish_reason": finish}


def tool(arguments: str) -> dict:
    return {"tool_calls": [{"index": 0, "id": "t", "type": "function",
                            "function": {"name": "f", "arguments": arguments}}]}


#: After the first text token, every shape the full classifier knows: (event, token kind).
CHAT_MIXED = [
    (chunk(choice(role="assistant", content="")), None),
    (chunk(choice(content="Hel")), names.CONTENT),  # the first answer token: hot loop after it
    (chunk(choice(content="lo")), names.CONTENT),
    (chunk(choice(content="")), None),  # empty text: framing
    (chunk(choice(**tool('{"a'))), names.TOOL),  # a tool-call delta mid-stream
    (chunk(choice(**tool(""))), None),  # its name alone: framing
    (chunk(choice(reasoning_content="hm")), names.REASONING),  # an extra field on the delta
    (chunk(choice(refusal="no")), names.CONTENT),
    (chunk(choice(content=" again"), service_tier="x", unknown_field=1), names.CONTENT),
    (chunk({"index": 0, "delta": {"content": " extra"}, "finish_reason": None,
            "logprobs": None, "vendor_field": {"x": 1}}), names.CONTENT),  # an extra field
    (chunk({"index": 0, "finish_reason": None}), None),  # no delta: not in the `__dict__`
    (chunk(choice(index=1, content="other choice")), names.CONTENT),  # n > 1, choice 1 alone
    (chunk(choice(index=0, content="a"), choice(index=1, content="b")), names.CONTENT),  # n > 1
    (chunk(choice(index=1), choice(index=0, content="c")), names.CONTENT),  # text not first
    (chunk(choice(content=" end", finish="stop")), names.CONTENT),  # text and finish at once
    (chunk(usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}), None),
]


def _chat_body(events) -> bytes:
    return _sse([event for event, _ in events] + ["[DONE]"])


def _expect(timeline, events) -> None:
    kinds = [kind for _, kind in events]
    assert len(timeline.token_times) == sum(kind is not None for kind in kinds)
    assert timeline.reasoning_events == kinds.count(names.REASONING)
    assert timeline.token_times == sorted(timeline.token_times)


def test_chat_every_shape_after_the_first_token_is_classified(recorded):
    c = _openai(_chat_body(CHAT_MIXED))
    got = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [g.to_dict() for g in got] == [e for e, _ in CHAT_MIXED]  # passed through unchanged
    t = recorded.one()
    _expect(t, CHAT_MIXED)
    assert t.outcome == names.OK and t.finish_reason == "stop" and t.output_tokens == 9
    assert drops() == 0


def test_chat_async_stream_takes_the_same_loop(recorded):
    c = _openai(_chat_body(CHAT_MIXED), is_async=True)

    async def read():
        return [e async for e in await c.chat.completions.create(
            model="m", messages=MESSAGES, stream=True)]

    assert len(asyncio.run(read())) == len(CHAT_MIXED)
    t = recorded.one()
    _expect(t, CHAT_MIXED)
    assert t.outcome == names.OK and t.finish_reason == "stop"


def test_closing_after_a_text_chunk_that_carries_the_finish_reason_is_not_abandoning(recorded):
    """Some OpenAI-compatible servers send the last text and `finish_reason` in one chunk; a
    loop that stops there has read the whole answer."""
    events = [(chunk(choice(content="a")), names.CONTENT), (chunk(choice(content="b")),
              names.CONTENT), (chunk(choice(content="c", finish="length")), names.CONTENT)]
    c = _openai(_sse([e for e, _ in events] + [chunk(usage={
        "prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}), "[DONE]"]))
    with c.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
        for part in stream:
            if part.choices[0].finish_reason:
                break
    del stream, part
    gc.collect()  # the in-memory transport reports no close: the stream ends when collected
    t = recorded.one()
    assert t.outcome == names.OK and t.finish_reason == "length"
    _expect(t, events)


def test_chunks_the_sdk_could_not_build_are_framing(recorded):
    """The SDK builds chunks without validation: a missing `choices` reads None, and a choice
    that is not an object stays what the JSON held (no `__dict__` to read: the fast read
    raises inside the loop and the full classifier decides). Framing, no drop."""
    events = [(chunk(choice(content="a")), names.CONTENT),
              ({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}, None),
              (chunk(None), None), (chunk("x"), None), (chunk(choice(content="b")), names.CONTENT),
              (chunk(choice(content="c")), names.CONTENT)]
    c = _openai(_chat_body(events))
    got = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [g.to_dict(warnings=False) for g in got] == [e for e, _ in events]
    t = recorded.one()
    _expect(t, events)
    assert t.outcome == names.OK and drops() == 0


def test_an_internal_failure_is_a_counted_drop_and_the_rest_passes_through(recorded,
                                                                          monkeypatch):
    """The full classifier failing after the first token (here: made to raise) counts one
    drop; the remaining chunks reach the caller unchanged and unmeasured."""
    from exporter._internal.shim import openai as shim_openai

    events = [chunk(choice(content="a")), chunk(choice(content="b")), chunk(choice()),
              chunk(choice(content="c")), "[DONE]"]

    def fails(chunk, call):
        if call.timeline.first_answer_token is not None:
            raise RuntimeError("classifier bug")
        return names.CONTENT

    endpoint = shim_openai.ENDPOINTS["/chat/completions"]
    monkeypatch.setattr(endpoint, "classify", fails)
    c = _openai(_sse(events))
    before = drops()
    got = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [g.to_dict() for g in got] == events[:-1]
    t = recorded.one()
    assert len(t.token_times) == 2 and t.outcome == names.OK
    assert drops() == before + 1


def _event(kind: str, **data) -> dict:
    return {"type": kind, **data}


def _block_delta(**delta) -> dict:
    return _event("content_block_delta", index=0, delta=delta)


_MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 0}}


@pytest.mark.parametrize("first", ["text", "tool"])
def test_anthropic_every_shape_after_the_first_token(recorded, first):
    """The text delta's classes are learnt from the stream: from the first answer token, or,
    when that was a tool's arguments, from the first text delta after it."""
    opening = (_block_delta(type="text_delta", text="Hi") if first == "text" else
               _block_delta(type="input_json_delta", partial_json='{"a'))
    events = [
        (_event("message_start", message=_MESSAGE), None),
        (_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
         None),
        (opening, names.CONTENT if first == "text" else names.TOOL),
        (_block_delta(type="text_delta", text=" there"), names.CONTENT),
        (_block_delta(type="text_delta", text=""), None),
        (_block_delta(type="thinking_delta", thinking="hm"), names.REASONING),
        (_block_delta(type="signature_delta", signature="s"), None),
        (_block_delta(type="input_json_delta", partial_json='"}'), names.TOOL),
        (_block_delta(type="citations_delta", citation={
            "type": "char_location", "cited_text": "x", "document_index": 0,
            "document_title": None, "start_char_index": 0, "end_char_index": 1}), None),
        (_block_delta(type="text_delta", text="!"), names.CONTENT),
        # unknown types, built by the SDK as its first class: `TextDelta`, `message_start`'s
        (_block_delta(type="future_delta", text="x"), None),
        (_event("future_event", index=0, delta={"type": "text_delta", "text": "x"}), None),
        (_event("content_block_stop", index=0), None),
        (_event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
                usage={"output_tokens": 7}), None),
        (_event("message_stop"), None),
    ]
    c = _anthropic(_sse([e for e, _ in events]))
    got = list(c.messages.create(model="claude-x", max_tokens=10, messages=MESSAGES,
                                 stream=True))
    assert [g.to_dict(warnings=False) for g in got] == [e for e, _ in events]
    t = recorded.one()
    _expect(t, events)
    assert t.outcome == names.OK and t.output_tokens == 7 and t.finish_reason == "end_turn"
    assert drops() == 0


def _response_event(kind: str, n: int, **data) -> dict:
    return {"type": kind, "sequence_number": n, **data}


def _text(n: int, delta: str) -> dict:
    return _response_event("response.output_text.delta", n, item_id="i", output_index=0,
                           content_index=0, delta=delta, logprobs=[])


def test_responses_every_shape_after_the_first_token(recorded):
    response = {"id": "r", "object": "response", "created_at": 1, "model": "m", "output": [],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "status": "completed",
                "usage": {"input_tokens": 2, "output_tokens": 6, "total_tokens": 8,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 1}}}
    events = [
        (_response_event("response.created", 0, response={**response,
                                                          "status": "in_progress"}), None),
        (_text(1, "Hi"), names.CONTENT),
        (_text(2, " there"), names.CONTENT),
        (_text(3, ""), None),
        (_response_event("response.function_call_arguments.delta", 4, item_id="f",
                         output_index=1, delta='{"a'), names.TOOL),
        (_response_event("response.reasoning_summary_text.delta", 5, item_id="r",
                         output_index=2, summary_index=0, delta="hm"), names.REASONING),
        (_text(6, "!"), names.CONTENT),
        (_response_event("response.future.delta", 6, delta="x"), None),  # an unknown type
        (_response_event("response.output_text.done", 7, item_id="i", output_index=0,
                         content_index=0, text="Hi there!", logprobs=[]), None),
        (_response_event("response.completed", 8, response=response), None),
    ]
    c = _openai(_sse([e for e, _ in events]))
    got = list(c.responses.create(model="m", input="hi", stream=True))
    assert len(got) == len(events)
    t = recorded.one()
    _expect(t, events)
    assert t.outcome == names.OK and t.output_tokens == 6
    assert drops() == 0


def test_fields_reader_is_the_instance_dict():
    """`_fields` returns the model's own `__dict__` (the same object, no copy), and raises on
    an object that is not a pydantic model (the loop then asks the full classifier)."""
    from openai._models import construct_type
    from openai.types.chat import ChatCompletionChunk

    parsed = construct_type(type_=ChatCompletionChunk, value=chunk(choice(content="x")))
    first = parsed.choices[0]
    assert tokens._fields(first) is first.__dict__
    assert tokens._fields(first)["delta"] is first.delta
    with pytest.raises(TypeError):
        tokens._fields(object())


def test_the_sdk_iterates_the_loop_chosen(recorded, loop):
    """The object the SDK's `Stream` iterates: the C iterator, or our Python generator."""
    c = _openai(_chat_body(CHAT_MIXED))
    stream = c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert type(stream._iterator) is (tokens.Stamper if loop == "c" else type(
        tokens.sync_tokens(iter(()), None)))
    assert not stream._iterator.gi_running
    list(stream)
    _expect(recorded.one(), CHAT_MIXED)


def _loops_agree(events: list, sdk: str, path: str) -> None:
    """Both loops over the same events decide each event alike: after each event they return
    (the same object), the call holds as many stamps, as many reasoning events and the same
    finish reason; at the end, the same outcome."""
    from exporter._internal.shim import anthropic as shim_anthropic, openai as shim_openai
    from exporter._internal.shim.sdk_call import SdkCall

    endpoint = {"openai": shim_openai.ENDPOINTS,
                "anthropic": shim_anthropic.ENDPOINTS}[sdk][path]
    seen = []
    for loop in (tokens.stamped, tokens.sync_tokens):
        call = SdkCall("m", sdk, endpoint, None)
        t = call.timeline
        after = []
        stream = loop(iter(events), call)
        for event in events:
            assert next(stream) is event
            after.append((len(t.token_times), t.reasoning_events, t.finish_reason))
        assert next(stream, None) is None  # the end: the call's outcome
        seen.append((after, t.outcome))
    assert seen[0] == seen[1], (seen, events)


def test_the_c_loop_and_the_python_loop_agree_on_random_streams(recorded, loop):
    """Random chat, Responses and Anthropic streams, built by the SDKs' own (unvalidated)
    constructors, with every field the fast checks read present, absent, empty, null or of
    another type: the C loop decides every event as the Python loop does."""
    if loop == "python":
        pytest.skip("compares the two loops: runs once, under the C parameter")
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st
    from anthropic._models import construct_type as anthropic_construct
    from anthropic.types import RawMessageStreamEvent
    from openai._models import construct_type
    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent

    odd = st.sampled_from([None, "", 0, 7, [], ["x"], {"k": "v"}, True])
    text = st.one_of(st.sampled_from(["x", " y", "ab"]), odd, st.text(max_size=3))
    delta = st.fixed_dictionaries({}, optional={
        "content": text, "role": st.sampled_from(["assistant", None]), "refusal": odd,
        "reasoning_content": text, "tool_calls": st.sampled_from([None, [], [{
            "index": 0, "function": {"arguments": '{"a'}}]])})
    a_choice = st.fixed_dictionaries({"index": st.just(0), "delta": st.one_of(delta, odd)},
                                     optional={"finish_reason": st.sampled_from(
                                         [None, "stop", "length", "", 3])})
    chat = st.fixed_dictionaries({"id": st.just("c"), "object": st.just(
        "chat.completion.chunk"), "created": st.just(1), "model": st.just("m")}, optional={
        "choices": st.one_of(st.lists(a_choice, min_size=1, max_size=2),
                             st.lists(st.one_of(a_choice, odd), max_size=2), odd),
        "usage": st.sampled_from([
            None, {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}])})
    responses = st.one_of(
        st.fixed_dictionaries({"type": st.just("response.output_text.delta"), "item_id": st.just(
            "i"), "output_index": st.just(0), "content_index": st.just(0),
            "sequence_number": st.just(1)}, optional={"delta": text}),
        st.fixed_dictionaries({"type": st.sampled_from([
            "response.reasoning_summary_text.delta", "response.output_text.done",
            "response.function_call_arguments.delta", "response.unknown"])},
            optional={"delta": text, "sequence_number": st.just(1)}))
    anthropic_event = st.one_of(
        st.fixed_dictionaries({"type": st.just("content_block_delta"), "index": st.just(0)},
                              optional={"delta": st.one_of(odd, st.fixed_dictionaries({
                                  "type": st.sampled_from(["text_delta", "thinking_delta",
                                                           "input_json_delta", "x", 5])},
                                  optional={"text": text, "thinking": text,
                                            "partial_json": text}))}),
        st.fixed_dictionaries({"type": st.sampled_from(["message_delta", "content_block_stop",
                                                       "ping", "unknown"])}))

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(st.lists(chat, min_size=1, max_size=12), st.lists(responses, min_size=1, max_size=12),
           st.lists(anthropic_event, min_size=1, max_size=12))
    def agree(chats: list, responses_events: list, anthropic_events: list) -> None:
        # each stream opens with an answer token: the rest goes through the hot loops
        start = chunk(choice(content="a"))
        _loops_agree([construct_type(type_=ChatCompletionChunk, value=e)
                      for e in [start, *chats]], "openai", "/chat/completions")
        first = {"type": "response.output_text.delta", "item_id": "i", "output_index": 0,
                 "content_index": 0, "delta": "a", "sequence_number": 0}
        _loops_agree([construct_type(type_=ResponseStreamEvent, value=e)
                      for e in [first, *responses_events]], "openai", "/responses")
        opening = _block_delta(type="text_delta", text="a")
        _loops_agree([anthropic_construct(type_=RawMessageStreamEvent, value=e)
                      for e in [opening, *anthropic_events]], "anthropic", "/v1/messages")

    assert hypothesis is not None
    agree()


@pytest.mark.parametrize("when", ["cold", "hot"])
def test_a_keyboard_interrupt_in_the_classifier_reaches_the_caller(recorded, monkeypatch, loop,
                                                                   when):
    """Ctrl-C (a KeyboardInterrupt raised inside our classifier, where a signal can land) is
    never swallowed: the caller gets it, and the call ends with it, from either loop."""
    from exporter._internal.shim import openai as shim_openai

    endpoint = shim_openai.ENDPOINTS["/chat/completions"]
    classify = endpoint.classify

    def interrupted(chunk, call):
        hot = call.timeline.first_answer_token is not None
        if (when == "hot") == hot and chunk.choices and chunk.choices[0].delta.tool_calls:
            raise KeyboardInterrupt
        return classify(chunk, call)

    monkeypatch.setattr(endpoint, "classify", interrupted)
    events = [chunk(choice(**tool('{"a'))), chunk(choice(content="a")),
              chunk(choice(**tool('"b'))), chunk(choice(content="c")), "[DONE]"]
    if when == "hot":
        events = events[1:]
    c = _openai(_sse(events))
    got = []
    with pytest.raises(KeyboardInterrupt):
        for part in c.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            got.append(part)
    assert len(got) == (1 if when == "hot" else 0)  # the interrupted event is not returned
    t = recorded.one()
    assert t.outcome != names.OK and len(t.token_times) == len(got)
