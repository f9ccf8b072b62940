"""Every shortcut of the shim and the recorder records what the slow path records (issue 33).

Hypothesis draws answers of each wire format (OpenAI Chat Completions, OpenAI Responses,
Anthropic Messages: reasoning, answer or tool-call tokens, usage with cached tokens, a cut at
the output limit, any model name and system fingerprint, a region header or none; a chat
completion with llama.cpp's `timings`, vLLM's `metrics` or neither), rendered
by the demo provider's wire formats both streamed and not. A loopback server answers with
them, and the real SDKs ask for each through every path of tests/test_shim_paths.py (the
method, `with_raw_response`, `with_streaming_response`, the stream helpers; sync and async):
once with every shortcut taken, once with every shortcut turned off. Each path records into
a fresh recorder, and every one must record exactly what the slowest path records (all
shortcuts off; not streamed: the raw JSON body of `with_raw_response`; streamed: `create`):
the same series with the same labels and counts, the same token values, the same counter rows
(requests, usage, finish reasons, the upstream row: address, region, fingerprint). A streamed
answer and the same answer not streamed must agree on every counter row and token value.

The shortcuts (SHORTCUTS: adding one is one line, the switch that turns it off):

* the C chunk loop (`tokens.Stamper`, _hotloop.c) rather than `tokens.sync_tokens`;
* each wire format's hot loop after the first answer token (`HOT_CHAT`, `HOT_RESPONSES`,
  `HOT_ANTHROPIC`, in both chunk loops) rather than the full `classify` of every event;
* the SDK's objects read as objects (the first branch of `openai.chat_usage`; every usage
  reader given a parsed result or a stream's last event) rather than as their JSON;
* `sdk_call._http_response`'s read of a pydantic result's `__dict__` rather than `getattr`;
* the C trace extension of sync calls (`httpx_trace.Tracer`, _hottrace.c) rather than
  `SdkCall.__call__`;
* the SDK's label cache (`hooks.SDK.labels_of`) and the provider names known by client class
  and host (`providers.ClientProvider`'s cache) rather than naming the provider each call;
* the C `derive` (_hotrecord.c) rather than `timeline.derive_in_python`;
* the C per-value appends of `Recorder.record_call` (_hotrecord.c) rather than its Python
  loop.

The recorder's label caches (`Recorder._kept`, `_kept_calls`, `_call_series`) and its inline
common cases (of `observe`, `add_row`) are held to the guard and `Store.observe` by
tests/test_record_call.py; the C `derive` to its Python twin value by value, and
`new_timeline` to the dataclass, by tests/test_timeline.py.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any, Callable

import pytest
from aiohttp import web
from pydantic import BaseModel

from exporter._internal import names
from exporter._internal.demo.latency import Plan
from exporter._internal.demo.answers import token_events
from exporter._internal.demo.engines import ENGINES, LLAMA_CPP
from exporter._internal.demo.wire_formats import Call, ChatCompletions, Messages, Responses
from exporter._internal.expose import http_thread
from exporter._internal.record import recorder, timeline
from exporter._internal.shim import (anthropic as shim_anthropic, hooks, manual,
                                     openai as shim_openai, sdk_call, tokens)
from exporter._internal.shim.sdk_call import HOT_GENERIC, Endpoint
from tests import test_shim_support as support
from tests.test_shim_paths import PATHS, run_path

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

instrumented = support.instrumented
ENDPOINTS: tuple[Endpoint, ...] = (*shim_openai.ENDPOINTS.values(),
                                   *shim_anthropic.ENDPOINTS.values())


def _as_json(read: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """`read` given the JSON of an SDK object rather than the object."""
    def read_json(obj: Any, call: Any) -> None:
        if isinstance(obj, BaseModel):
            obj = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
        read(obj, call)
    return read_json


class _Forgetful(dict):
    """A cache that keeps nothing."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _on_every_endpoint(mp: pytest.MonkeyPatch, attribute: str,
                       slow: Callable[[Any], Any]) -> None:
    for endpoint in ENDPOINTS:
        mp.setattr(endpoint, attribute, slow(getattr(endpoint, attribute)))


#: Each shortcut, as the switch that turns it off.
SHORTCUTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "C chunk loop": lambda mp: mp.setattr(tokens, "Stamper", None),
    "hot loops": lambda mp: _on_every_endpoint(mp, "hot", lambda _: HOT_GENERIC),
    "SDK objects (stream)": lambda mp: _on_every_endpoint(mp, "final", _as_json),
    "SDK objects (body)": lambda mp: _on_every_endpoint(mp, "body_usage", _as_json),
    "pydantic __dict__": lambda mp: mp.setattr(sdk_call, "_BaseModel", None),
    "C trace extension": lambda mp: mp.setattr(sdk_call, "_Tracer", None),
    "label cache": lambda mp: mp.setattr(hooks, "_MAX_LABELS", 0),
    "provider names": lambda mp: [mp.setattr(sdk.provider, "_cache", _Forgetful())
                                  for sdk in (shim_openai, shim_anthropic)],
    "C derive": lambda mp: mp.setattr(manual, "derive", timeline.derive_in_python),
    "C appends": lambda mp: mp.setattr(recorder, "append_in_c", None),
}

#: The slowest path of each mode, the reference (streamed or not -> path).
REFERENCE = {False: "with_raw_response", True: "create"}
WIRES = {"chat": ChatCompletions, "responses": Responses, "anthropic": Messages}
REPLAY_HEADER = "x-replay"


# --- the answers -------------------------------------------------------------------------------
class Answer:
    """One drawn answer: its headers, its streamed body and its JSON body."""

    def __init__(self, api: str, call: Call, headers: dict[str, str]):
        self.headers = headers
        self.include_usage = call.include_usage
        #: Whether the stream carries the token counts: the usage, or llama.cpp's in its stead.
        self.counted = call.include_usage or call.engine == LLAMA_CPP
        events = token_events(call.plan)
        streamed = WIRES[api](replace(call, stream=True))
        self.stream = streamed.opening() + b"".join(
            streamed.token(kind, text) for kind, text in events) + streamed.closing()
        whole = WIRES[api](call)
        for kind, text in events:
            whole.record(kind, text)
        self.body = json.dumps(whole.body()).encode()


labels = st.text(max_size=12)
regions = st.from_regex(r"[a-z][a-z0-9-]{0,11}", fullmatch=True)


@st.composite
def answers(draw: Any, api: str) -> Answer:
    """An answer of `api` (a chat completion with an engine's own timings or none)."""
    input_tokens = draw(st.integers(0, 2_000_000))
    reasoning, answer = draw(st.integers(0, 3)), draw(st.integers(0, 5))
    plan = Plan(server_wait=0.0, prefill=0.0, input_tokens=input_tokens,
                cached_tokens=draw(st.integers(0, input_tokens)), reasoning_tokens=reasoning,
                answer_tokens=answer, gaps=(0.0,) * max(0, reasoning + answer - 1),
                tool_call=draw(st.booleans()), truncated=draw(st.booleans()))
    include_usage = api != "chat" or draw(st.booleans())
    engine = draw(st.sampled_from((None, *ENGINES))) if api == "chat" else None
    call = Call(model=draw(labels), stream=False, include_usage=include_usage,
                tool_name="lookup", plan=plan, fingerprint=draw(st.none() | labels),
                engine=engine)
    headers = {"content-type": "application/json"}
    for header in names.REGION_HEADERS:
        if draw(st.booleans()):
            headers[header] = draw(regions)
    return Answer(api, call, headers)


# --- the server that answers with them ---------------------------------------------------------
class Replay:
    """A loopback HTTP server answering each request with the answer stored under its
    `x-replay` header: streamed (server-sent events) when the request asks for a stream."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self._lock = threading.Lock()
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._http = http_thread.HttpThread(app, "127.0.0.1", 0, name="replay",
                                            shutdown_timeout=1.0)

    async def _handle(self, request: web.Request) -> web.Response:
        stream = bool((await request.json()).get("stream"))
        with self._lock:
            answer = self.answers[request.headers[REPLAY_HEADER]]
        if stream:
            headers = {**answer.headers, "content-type": "text/event-stream"}
            return web.Response(body=answer.stream, headers=headers)
        return web.Response(body=answer.body, headers=answer.headers)

    def __enter__(self) -> "Replay":
        self._http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.stop()

    @property
    def base_url(self) -> str:
        return self._http.base_url


@pytest.fixture(scope="module")
def replay():
    with Replay() as server:
        yield server


def _arguments(api: str, key: str, include_usage: bool) -> dict[str, Any]:
    """The request: the same whatever the answer (an output limit set)."""
    headers = {REPLAY_HEADER: key}
    if api == "chat":
        kw: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 64, "extra_headers": headers}
        return {**kw, "stream_options": {"include_usage": include_usage}}
    if api == "responses":
        return {"model": "m", "input": "hi", "max_output_tokens": 64, "extra_headers": headers}
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
            "extra_headers": headers}


def _every_path(api: str, replay: Replay, key: str, include_usage: bool) -> dict:
    """(path, streamed) -> what it recorded."""
    return {(path, stream): run_path(api, path, stream, replay.base_url,
                                     _arguments(api, key, include_usage))
            for path, (_, _, streamed_only) in PATHS.items()
            for stream in (True, False) if stream or not streamed_only}


def _counters_and_tokens(recorded: dict) -> dict:
    """What a streamed answer and the same answer not streamed both record: every counter row
    and the token families' values."""
    token_families = {fam.name for fam in names.HISTOGRAMS if fam.unit == "tokens"}
    return {name: value for name, value in recorded.items()
            if name in names.COUNTERS_BY_NAME or name in token_families}


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_every_shortcut_records_what_the_slow_path_records(api, replay, instrumented):
    drawn = iter(range(10**9))

    @settings(max_examples=20, deadline=None, derandomize=True)
    @given(answers(api))
    def check(answer: Answer) -> None:
        key = str(next(drawn))
        replay.answers[key] = answer
        with pytest.MonkeyPatch.context() as mp:
            for turn_off in SHORTCUTS.values():
                turn_off(mp)
            slow = _every_path(api, replay, key, answer.include_usage)
        fast = _every_path(api, replay, key, answer.include_usage)
        del replay.answers[key]
        reference = {stream: slow[(path, stream)] for stream, path in REFERENCE.items()}
        for taken, runs in (("every shortcut", fast), ("no shortcut", slow)):
            for (path, stream), recorded in runs.items():
                assert recorded == reference[stream], (taken, path, stream, recorded,
                                                       reference[stream])
        assert names.UPSTREAM_REQUESTS in reference[False]
        if answer.counted:
            assert _counters_and_tokens(reference[True]) == \
                _counters_and_tokens(reference[False])

    check()
