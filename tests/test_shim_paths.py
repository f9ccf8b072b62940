"""Every SDK path records the whole call, the upstream included (issue 32, item 4).

One answer of the demo provider (scripted: reasoning, answer tokens, usage with cached tokens)
is asked for through every way the real SDKs offer, for each API (OpenAI Chat Completions,
OpenAI Responses, Anthropic Messages), streamed and not: the method itself, its
`with_raw_response` and `with_streaming_response` forms, the stream helpers (`.stream()`),
sync and async. Each path records into a fresh recorder; within a mode (streamed or not) every
path must record what the fullest one records (the same series of the same families with the
same labels and counts, the token values, every counter row), and every path the same
upstream row: the address the connection reached, the region header, the fingerprint (the
chat completion's `system_fingerprint`; `unknown` for Responses and Anthropic, which carry
none). Non-streamed calls are also asked of the far region (TLS, a relay one round trip away),
which closes each connection after its response: the address is then read when the connection
is made. A non-streamed `with_streaming_response` ends when its caller reads the body. Every
test runs with both trace extensions (the C one, and the call itself).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ssl
import time
from typing import Any, Callable

import anthropic
import openai
import pytest

from exporter._internal import names, runtime
from exporter._internal.demo.wire_formats import FINGERPRINT
from exporter._internal.record.timeline import derive
from tests import test_shim_support as support
from tests.test_shim_support import drops, script, what_was_recorded

instrumented, trace_extension = support.instrumented, support.trace_extension
pytestmark = pytest.mark.usefixtures("instrumented", "trace_extension")

ANSWER = script(reasoning_tokens=2, tokens=4, input_tokens=40, cached_tokens=8)
MESSAGES = [{"role": "user", "content": "why is my first token slow?"}]


provider = support.far_provider  # (a shared fixture)


# --- the requests, per API -----------------------------------------------------------------------
def _arguments(api: str, stream: bool) -> dict[str, Any]:
    """The same question in each API's words (an output limit set, usage asked for)."""
    if api == "chat":
        kw: dict[str, Any] = {"model": "gpt-paths", "messages": MESSAGES, "max_tokens": 100}
        if stream:
            kw["stream_options"] = {"include_usage": True}
    elif api == "responses":
        kw = {"model": "gpt-paths", "input": "why is my first token slow?",
              "max_output_tokens": 100}
    else:
        kw = {"model": "claude-paths", "messages": MESSAGES, "max_tokens": 100}
    return {**kw, "extra_headers": ANSWER}


def resource(client: Any, api: str) -> Any:
    """The SDK resource of `api` on `client`."""
    return {"chat": lambda: client.chat.completions, "responses": lambda: client.responses,
            "anthropic": lambda: client.messages}[api]()


@functools.lru_cache(maxsize=None)
def _default_tls() -> ssl.SSLContext:
    """One TLS context for every plain-HTTP client (each client would load the CA bundle)."""
    return ssl.create_default_context()


def _client(api: str, base_url: str, tls: Any, is_async: bool) -> Any:
    if api == "anthropic":
        cls, http = (anthropic.AsyncAnthropic, anthropic.DefaultAsyncHttpxClient) if is_async \
            else (anthropic.Anthropic, anthropic.DefaultHttpxClient)
        url = base_url
    else:
        cls, http = (openai.AsyncOpenAI, openai.DefaultAsyncHttpxClient) if is_async \
            else (openai.OpenAI, openai.DefaultHttpxClient)
        url = base_url + "/v1"
    return cls(base_url=url, api_key="test", max_retries=0,
               http_client=http(verify=tls or _default_tls()))


# --- the paths: each asks once and reads the whole answer ----------------------------------------
def _create(res: Any, kw: dict, stream: bool) -> None:
    answer = res.create(stream=stream, **kw)
    if stream:
        for _ in answer:
            pass


def _raw(res: Any, kw: dict, stream: bool) -> None:
    answer = res.with_raw_response.create(stream=stream, **kw).parse()
    if stream:
        for _ in answer:
            pass


def _streaming_response(res: Any, kw: dict, stream: bool) -> None:
    with res.with_streaming_response.create(stream=stream, **kw) as response:
        answer = response.parse()
        if stream:
            for _ in answer:
                pass


def _helper(res: Any, kw: dict, stream: bool) -> None:
    with res.stream(**kw) as events:
        for _ in events:
            pass


async def _acreate(res: Any, kw: dict, stream: bool) -> None:
    answer = await res.create(stream=stream, **kw)
    if stream:
        async for _ in answer:
            pass


async def _araw(res: Any, kw: dict, stream: bool) -> None:
    answer = (await res.with_raw_response.create(stream=stream, **kw)).parse()
    if inspect.isawaitable(answer):  # (anthropic's async raw response; openai's is sync)
        answer = await answer
    if stream:
        async for _ in answer:
            pass


async def _astreaming_response(res: Any, kw: dict, stream: bool) -> None:
    async with res.with_streaming_response.create(stream=stream, **kw) as response:
        answer = await response.parse()
        if stream:
            async for _ in answer:
                pass


async def _ahelper(res: Any, kw: dict, stream: bool) -> None:
    async with res.stream(**kw) as events:
        async for _ in events:
            pass


#: name -> (is_async, the path, streamed only).
PATHS: dict[str, tuple[bool, Callable, bool]] = {
    "create": (False, _create, False),
    "with_raw_response": (False, _raw, False),
    "with_streaming_response": (False, _streaming_response, False),
    "stream helper": (False, _helper, True),
    "async create": (True, _acreate, False),
    "async with_raw_response": (True, _araw, False),
    "async with_streaming_response": (True, _astreaming_response, False),
    "async stream helper": (True, _ahelper, True),
}


def run_path(api: str, path: str, stream: bool, base_url: str, kw: dict[str, Any],
             tls: Any = None) -> dict:
    """One call (`kw`: its arguments, `stream` aside) through `path` into a fresh recorder;
    what it recorded (tests/test_shim_support.what_was_recorded)."""
    runtime.configure(None)
    is_async, fn, _ = PATHS[path]
    if is_async:
        async def main() -> None:
            client = _client(api, base_url, tls, True)
            await fn(resource(client, api), kw, stream)
            await client.close()
        asyncio.run(main())
    else:
        client = _client(api, base_url, tls, False)
        fn(resource(client, api), kw, stream)
        client.close()
    return what_was_recorded(runtime.state().recorder)


def _upstream(recorded: dict) -> list[tuple[str, ...]]:
    return sorted(recorded.get(names.UPSTREAM_REQUESTS, {}))


def _expected_upstream(api: str, base_url: str, region: str) -> tuple[str, ...]:
    host_port = base_url.split("://", 1)[1]
    model = "claude-paths" if api == "anthropic" else "gpt-paths"
    fingerprint = FINGERPRINT if api == "chat" else names.UNKNOWN
    # (address, fingerprint, model, provider, region, route): names.UPSTREAM_LABELS' order
    return (host_port, fingerprint, model, "local", region, names.UNKNOWN)


def assert_every_path_records_the_fullest(api: str, by_path: dict[str, dict]) -> None:
    fullest = max(by_path.values(), key=lambda rec: sum(len(v) for v in rec.values()))
    for path, recorded in by_path.items():
        missing = {name: sorted(set(fullest.get(name, {})) - set(series))
                   for name, series in recorded.items()}
        assert recorded == fullest, (api, path, missing, recorded, fullest)


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_every_path_records_the_whole_call_and_its_upstream(api, provider):
    near = provider.base_url
    expected = _expected_upstream(api, near, "near")
    for stream in (True, False):
        by_path = {path: run_path(api, path, stream, near, _arguments(api, stream))
                   for path, (_, _, streamed_only) in PATHS.items()
                   if stream or not streamed_only}
        for path, recorded in by_path.items():
            assert _upstream(recorded) == [expected], (api, stream, path, recorded)
            assert recorded[names.REQUESTS_TOTAL] == {
                (expected[2], names.OK, "local", names.UNKNOWN, names.UNKNOWN): 1}, path
            assert names.USAGE_CACHED_INPUT_TOKENS in recorded, (path, recorded)
        assert_every_path_records_the_fullest(api, by_path)
        if stream:
            assert names.ITL.name in by_path["create"]  # the fullest is a streamed call's


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_a_connection_closed_after_its_response_still_names_its_address(api, provider):
    """The far region closes each connection once its response is sent: a non-streamed
    body is parsed after the close, when the socket no longer says where it led."""
    far = provider.far
    tls = far.tls_client_context()
    expected = _expected_upstream(api, far.base_url, "far")
    by_path = {path: run_path(api, path, False, far.base_url, _arguments(api, False), tls)
               for path, (_, _, streamed_only) in PATHS.items() if not streamed_only}
    for path, recorded in by_path.items():
        assert _upstream(recorded) == [expected], (api, path, recorded)
    assert_every_path_records_the_fullest(api, by_path)


def test_a_non_stream_streaming_response_ends_when_its_body_is_read(provider):
    """`with_streaming_response` without `stream`: the body is the caller's to read, after
    `request()` returned. Read through the SDK (`parse()`, `json()`, `text()`): the call ends
    then, with its usage and fingerprint; read as bytes: it ends at the body's end, its
    usage unread; closed unread: abandoned."""
    c = _client("chat", provider.base_url, None, False)
    recorded = support.Recorded()
    answer = script(server_wait=0.05, tokens=3, input_tokens=12, cached_tokens=4)
    for ended, read in enumerate((
            lambda r: r.parse().usage.prompt_tokens, lambda r: r.json()["usage"],
            lambda r: r.text(), lambda r: b"".join(r.iter_bytes()), lambda r: None)):
        with c.chat.completions.with_streaming_response.create(
                model="gpt-test", messages=MESSAGES, extra_headers=answer) as response:
            time.sleep(0.05)  # the caller's own time before it reads
            assert len(recorded.timelines) == ended  # not ended before its body is read
            read(response)
    *through_sdk, as_bytes, unread = recorded.all()
    for t in through_sdk:
        d = derive(t)
        assert t.outcome == names.OK and (t.input_tokens, t.cached_input_tokens) == (12, 4)
        assert t.fingerprint == FINGERPRINT and t.upstream_address.startswith("127.0.0.1:")
        assert d.ttft == d.duration and d.ttft >= 100_000  # the body, read after 50 ms more
    assert as_bytes.outcome == names.OK and as_bytes.input_tokens is None
    assert derive(as_bytes).ttft >= 100_000
    assert unread.outcome == names.ABANDONED and unread.first_token is None
    assert drops() == 0
