"""A local LLM provider that speaks the OpenAI and Anthropic wire formats.

It lets the demo, the tests and the benchmarks drive the real SDKs end to end with no network
and no API key. Routes: `POST /v1/chat/completions` and `POST /v1/responses` (OpenAI),
`POST /v1/messages` (Anthropic), each streamed (SSE) or not.

Timing comes from a `LatencyModel`, or per request from the `x-demo-script` header, a JSON
object whose keys (all optional, `SCRIPT_KEYS`) make every phase exact and bypass the model:
`server_wait` (s before the headers), `prefill` (s after the headers and the framing events,
before the first token), `tokens` (answer tokens, default 8), `reasoning_tokens` (sent before
the answer), `tool_call` (answer streamed as tool-call arguments when the request has tools),
`gap` (s between tokens), `stall_after` + `stall` (s added after that many tokens), `status`
(answer with this HTTP error), `disconnect_after` (abort the TCP connection after that many
tokens), `input_tokens`, `cached_tokens`, `engine` (`llama.cpp` or `vllm`: a chat completion
carries that engine's own timings, engines.py). Token events count reasoning and answer
together.
Failed attempts, which the SDKs retry (the attempt is the `x-stainless-retry-count` they send;
0 without it): `fail_attempts` says how each attempt in turn fails, an HTTP status (429, 503,
529, ...), `disconnect` (the connection dropped before any response) or `hang` (nothing sent
for 10 s, for a client's timeout to end), null for none; any other attempt fails with the
probability `fail_share`, answering `fail_status` (503). A failure comes `fail_wait` s after the
request. An error answer (these, and `status`) carries `retry-after-ms` when the script gives
`retry_after_ms`, and `retry-after` from `retry_after` (s; null: none), by default 1 s for a
429, 503 or 529.
A request's max_tokens (or max_completion_tokens, max_output_tokens) cuts any plan short, as a
real provider stops at it; the OpenAI formats report the time from the request's arrival to
the headers in `openai-processing-ms`.
Unscripted requests take the tenant from `x-demo-tenant` and the prompt size from
`x-demo-input-tokens` (default: prompt characters / 4).

`ProviderServer(far_region=True)` also serves the same state from a farther region (TLS, a
round trip away: far_region.py), where the route-change incident sends its calls; `Knobs`
(incidents.py) let the incidents change the provider while it serves.

How each API renders a response, usage included, is in `wire_formats`; this module parses the
requests, times the token events and serves them.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web

from ..expose import http_thread
from ..expose.connection_guard import Limits
from .far_region import FarRegion, start_far_region
from .incidents import Knobs
from .latency import LatencyModel, LatencySimulator, Plan, limited
from .answers import token_events
from .engines import ENGINES
from .wire_formats import Call, ChatCompletions, Messages, Responses, WireFormat

SCRIPT_HEADER = "x-demo-script"
#: Which attempt of a call a request is (0: the first), as the openai and anthropic SDKs say.
ATTEMPT_HEADER = "x-stainless-retry-count"
TENANT_HEADER = "x-demo-tenant"
INPUT_TOKENS_HEADER = "x-demo-input-tokens"
SCRIPT_KEYS = frozenset({
    "server_wait", "prefill", "tokens", "reasoning_tokens", "tool_call", "gap", "stall_after",
    "stall", "status", "disconnect_after", "input_tokens", "cached_tokens", "engine",
    "fail_attempts", "fail_share", "fail_status", "fail_wait", "retry_after", "retry_after_ms",
})
#: How an attempt can fail besides an HTTP status; how long a `hang` sends nothing.
DISCONNECT, HANG = "disconnect", "hang"
_HANG_SECONDS = 10.0

_TEXT_KEYS = frozenset({"messages", "input", "instructions", "system", "content", "text"})


def _prompt_chars(value: Any) -> int:
    """Characters of prompt text in a request body, whatever the API's message layout."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_prompt_chars(item) for item in value)
    if isinstance(value, dict):
        return sum(_prompt_chars(item) for key, item in value.items() if key in _TEXT_KEYS)
    return 0


def _prompt_prefix(body: dict[str, Any]) -> str:
    """The start of a request's prompt: what a provider's prefix cache is keyed by."""
    parts = [body.get(key) for key in ("instructions", "system", "messages", "input")]
    return json.dumps([p for p in parts if p], sort_keys=True)[:256]


def _read_script(raw: str | None, input_tokens: int, tools: bool) -> Plan | None:
    """The plan an `x-demo-script` header asks for; ValueError when the header is malformed."""
    if raw is None:
        return None
    script = json.loads(raw)
    if not isinstance(script, dict):
        raise ValueError(f"{SCRIPT_HEADER} must be a JSON object")
    unknown = set(script) - SCRIPT_KEYS
    if unknown:
        raise ValueError(f"unknown {SCRIPT_HEADER} keys: {sorted(unknown)}")
    tokens = int(script.get("tokens", 8))
    reasoning = int(script.get("reasoning_tokens", 0))
    gaps = [float(script.get("gap", 0.0))] * max(0, reasoning + tokens - 1)
    stall_after = int(script.get("stall_after", 0))
    if 0 < stall_after <= len(gaps):
        gaps[stall_after - 1] += float(script.get("stall", 0.0))
    input_tokens = int(script.get("input_tokens", input_tokens))
    status = script.get("status")
    disconnect_after = script.get("disconnect_after")
    return Plan(
        server_wait=float(script.get("server_wait", 0.0)),
        prefill=float(script.get("prefill", 0.0)),
        input_tokens=input_tokens,
        cached_tokens=min(input_tokens, int(script.get("cached_tokens", 0))),
        reasoning_tokens=reasoning,
        answer_tokens=tokens,
        gaps=tuple(gaps),
        tool_call=bool(script.get("tool_call", False)) and tools,
        status=None if status is None else int(status),
        disconnect_after=None if disconnect_after is None else int(disconnect_after),
    )


def _script_engine(raw: str | None) -> str | None:
    """The engine an `x-demo-script` header names, if any (ValueError: one it does not know)."""
    engine = None if raw is None else json.loads(raw).get("engine")
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"{SCRIPT_HEADER} engine must be one of {ENGINES}")
    return engine


@dataclass(frozen=True)
class Failure:
    """How one attempt fails, as its script says: an HTTP status, `disconnect` or `hang`, after
    `wait` seconds, an error answer carrying the retry headers `retry`."""

    what: int | str
    wait: float
    retry: dict[str, str]


def _retry_headers(script: dict[str, Any], status: int) -> dict[str, str]:
    """The retry headers of an error answer: `retry-after-ms`, `retry-after` as scripted."""
    headers = {}
    if script.get("retry_after_ms") is not None:
        headers["retry-after-ms"] = str(float(script["retry_after_ms"]))
    if "retry_after" in script:
        if script["retry_after"] is not None:
            headers["retry-after"] = str(float(script["retry_after"]))
    elif status in (429, 503, 529):
        headers["retry-after"] = "1"
    return headers


def _read_failure(raw: str | None, attempt: int) -> Failure | None:
    """How the script has this attempt fail, if it does (ValueError: a malformed failure)."""
    if raw is None:
        return None
    script = json.loads(raw)
    planned = script.get("fail_attempts") or []
    if not isinstance(planned, list):
        raise ValueError("fail_attempts must be a list")
    if attempt < len(planned):
        what = planned[attempt]
    elif random.random() < float(script.get("fail_share", 0.0)):
        what = script.get("fail_status", 503)
    else:
        return None
    if what is None:
        return None
    if what not in (DISCONNECT, HANG) and not (isinstance(what, int) and 400 <= what <= 599):
        raise ValueError(f"an attempt fails with an HTTP error status, {DISCONNECT!r} or "
                         f"{HANG!r}, not {what!r}")
    status = what if isinstance(what, int) else 0
    return Failure(what, float(script.get("fail_wait", 0.0)), _retry_headers(script, status))


async def _fail(request: web.Request, wire: type[WireFormat], failure: Failure
                ) -> web.StreamResponse:
    """Serve a failed attempt."""
    await asyncio.sleep(failure.wait + (_HANG_SECONDS if failure.what == HANG else 0.0))
    if not isinstance(failure.what, int):
        _abort(request)
    return _closing(_error_response(wire, failure.what, f"scripted HTTP {failure.what}",
                                    failure.retry), request.app[_CLOSE])


def _error_response(wire: type[WireFormat], status: int, message: str,
                    retry: dict[str, str] | None = None) -> web.Response:
    headers = _retry_headers({}, status) if retry is None else retry
    return web.json_response(wire.error_body(status, message), status=status, headers=headers)


def _abort(request: web.Request) -> NoReturn:
    """Drop the TCP connection mid-response, as a crashed upstream or a killed proxy does."""
    if request.transport is not None:
        request.transport.abort()
    # aiohttp ends a handler that raises this like one whose client went away: no response.
    raise asyncio.CancelledError


async def _sleep_until(due: float, paused_until: Callable[[], float]) -> float:
    """Sleep until `due`, or past it while the batch is paused; returns when it woke."""
    while True:
        due = max(due, paused_until())
        delay = due - time.monotonic()
        if delay <= 0:
            return due
        await asyncio.sleep(delay)


async def _timed_tokens(plan: Plan,
                        paused_until: Callable[[], float]) -> AsyncIterator[tuple[str, str]]:
    """The token events at their planned times (an absolute schedule, so no drift)."""
    due = time.monotonic() + plan.prefill
    for index, event in enumerate(token_events(plan)):
        if index:
            due += plan.gaps[index - 1]
        due = await _sleep_until(due, paused_until)
        yield event


class _State:
    """Per-provider state: the latency simulator and one queue (semaphore) per model, shared by
    the near and the far region."""

    def __init__(self, model: LatencyModel, knobs: Knobs | None = None) -> None:
        self.simulator = LatencySimulator(model, knobs=knobs)
        self._slots: dict[str, asyncio.Semaphore] = {}

    def slots(self, model: str) -> asyncio.Semaphore:
        if model not in self._slots:
            self._slots[model] = asyncio.Semaphore(self.simulator.model.profile(model).slots)
        return self._slots[model]


_STATE = web.AppKey("demo_provider_state", _State)
#: The far region closes each connection after its response (a short LB idle timeout).
_CLOSE = web.AppKey("demo_provider_closes_connections", bool)
#: The region a response says answered it (`x-region`, as a gateway would name it).
_REGION = web.AppKey("demo_provider_region", str)
REGION_HEADER = "x-region"


async def _handle(request: web.Request, wire: type[WireFormat]) -> web.StreamResponse:
    received = time.monotonic()
    try:
        body = await request.json()
        model = body["model"]
        if not isinstance(model, str):
            raise ValueError("model must be a string")
        tool_name = wire.tool_name(body)
        input_header = request.headers.get(INPUT_TOKENS_HEADER)
        input_tokens = (int(input_header) if input_header is not None
                        else max(1, _prompt_chars(body) // 4))
        scripted = _read_script(request.headers.get(SCRIPT_HEADER), input_tokens,
                                tools=tool_name is not None)
        engine = _script_engine(request.headers.get(SCRIPT_HEADER))
        failure = _read_failure(request.headers.get(SCRIPT_HEADER),
                                int(request.headers.get(ATTEMPT_HEADER, 0)))
        retry = None if scripted is None else \
            _retry_headers(json.loads(request.headers[SCRIPT_HEADER]), scripted.status or 0)
        max_tokens = wire.max_tokens(body)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return _error_response(wire, 400, f"bad request: {exc!r}")
    if failure is not None:
        return await _fail(request, wire, failure)

    def call(plan: Plan) -> Call:
        return Call(model=model, stream=bool(body.get("stream")),
                    include_usage=wire.include_usage(body), tool_name=tool_name,
                    plan=limited(plan, max_tokens), received=received, engine=engine)

    if scripted is not None:
        return await _respond(request, wire, call(scripted), paused_until=lambda: 0.0,
                              retry=retry)
    state = request.app[_STATE]
    async with state.slots(model):  # the queue: waiting here is server time before headers
        plan = state.simulator.plan(model, request.headers.get(TENANT_HEADER, "default"),
                                    input_tokens, _prompt_prefix(body))
        return await _respond(request, wire, call(plan),
                              paused_until=lambda: state.simulator.paused_until(model))


async def _respond(request: web.Request, wire_type: type[WireFormat], call: Call,
                   paused_until: Callable[[], float], retry: dict[str, str] | None = None
                   ) -> web.StreamResponse:
    """Serve one planned response (`retry`: an error answer's retry headers, when scripted);
    a client that hangs up mid-stream just ends it, quietly."""
    try:
        return await _serve_plan(request, wire_type, call, paused_until, retry)
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError derives from it
        raise asyncio.CancelledError from None  # aiohttp ends a cancelled handler silently


async def _serve_plan(request: web.Request, wire_type: type[WireFormat], call: Call,
                      paused_until: Callable[[], float], retry: dict[str, str] | None
                      ) -> web.StreamResponse:
    plan = call.plan
    close = request.app[_CLOSE]
    await asyncio.sleep(plan.server_wait)
    if plan.status is not None:
        return _closing(_error_response(wire_type, plan.status, f"scripted HTTP {plan.status}",
                                        retry), close)
    wire = wire_type(call)
    headers = {wire.request_id_header: f"req_{wire.id}", REGION_HEADER: request.app[_REGION]}
    if wire.processing_header:
        spent = time.monotonic() - call.received
        headers[wire.processing_header] = str(round(spent * 1000))
    response: web.StreamResponse | None = None
    if call.stream:
        response = _closing(web.StreamResponse(headers={
            **headers, "content-type": "text/event-stream", "cache-control": "no-cache"}), close)
        await response.prepare(request)
        await response.write(wire.opening())
    sent = 0
    if plan.disconnect_after != 0:
        async for kind, text in _timed_tokens(plan, paused_until):
            if response is None:
                wire.record(kind, text)
            else:
                await response.write(wire.token(kind, text))
            sent += 1
            if sent == plan.disconnect_after:
                break
    if sent == plan.disconnect_after:
        _abort(request)
    if response is None:
        return _closing(web.json_response(wire.body(), headers=headers), close)
    await response.write(wire.closing())
    await response.write_eof()
    return response


def _closing(response: web.StreamResponse, close: bool) -> web.StreamResponse:
    if close:
        response.force_close()
    return response


def create_app(model: LatencyModel | None = None, knobs: Knobs | None = None, *,
               state: _State | None = None, close_connections: bool = False,
               region: str = "near") -> web.Application:
    """The provider as an aiohttp application; `model` defaults to `LatencyModel.default()`.

    `state` shares another app's queues and simulator (the far region's app)."""
    app = web.Application()
    app[_STATE] = state or _State(model or LatencyModel.default(), knobs)
    app[_CLOSE] = close_connections
    app[_REGION] = region
    for path, wire in (("/v1/chat/completions", ChatCompletions), ("/v1/responses", Responses),
                       ("/v1/messages", Messages)):
        app.router.add_post(path, functools.partial(_handle, wire=wire))
    return app


#: How long a stop waits for the streams in flight before cancelling them.
_SHUTDOWN_TIMEOUT = 1.0


def _loopback_address(host: str) -> str:
    """`host` as a loopback IP address; anything else is refused (the demo has no auth)."""
    address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    if not address.is_loopback:
        raise ValueError(f"the demo provider binds loopback addresses only, not {host!r}")
    return str(address)


@dataclass
class RunningProvider:
    """A provider serving inside the caller's event loop."""

    base_url: str
    _runner: web.AppRunner

    async def close(self) -> None:
        await self._runner.cleanup()


#: A provider serves many concurrent streams to one client (the demo's load, a test's 100
#: concurrent SDK calls): the exporter's per-client cap, made against floods of its own
#: endpoints, would shed them.
_PROVIDER_LIMITS = Limits(max_connections=4096, max_connections_per_client=4096)


async def run_provider(host: str = "127.0.0.1", port: int = 0,
                       model: LatencyModel | None = None) -> RunningProvider:
    """Serve the provider on the running loop; port 0 picks a free port (see `base_url`)."""
    address = _loopback_address(host)
    runner, bound_port = await http_thread.serve(create_app(model), address, port,
                                                 shutdown_timeout=_SHUTDOWN_TIMEOUT,
                                                 limits=_PROVIDER_LIMITS)
    return RunningProvider(base_url=http_thread.base_url(address, bound_port), _runner=runner)


class ProviderServer:
    """The provider on its own event loop in a daemon thread, for synchronous callers.

    `with ProviderServer() as server: OpenAI(base_url=server.base_url + "/v1", ...)`.
    With `far_region=True` it also serves `far` (far_region.py), sharing queues and knobs.
    """

    def __init__(self, model: LatencyModel | None = None, host: str = "127.0.0.1",
                 port: int = 0, knobs: Knobs | None = None, far_region: bool = False) -> None:
        self._model = model
        self._host = host
        self._port = port
        self.knobs = knobs if knobs is not None else Knobs()
        self._far_wanted = far_region
        self._http: http_thread.HttpThread | None = None
        #: The far region, while serving (None unless asked for).
        self.far: FarRegion | None = None

    @property
    def base_url(self) -> str:
        if self._http is None:
            raise RuntimeError("ProviderServer is not started")
        return self._http.base_url

    def start(self) -> ProviderServer:
        app = create_app(self._model, self.knobs)
        server = http_thread.HttpThread(
            app, _loopback_address(self._host), self._port,
            name="demo-provider", shutdown_timeout=_SHUTDOWN_TIMEOUT, limits=_PROVIDER_LIMITS)
        self._http = server.start()
        if self._far_wanted:
            far_app = create_app(state=app[_STATE], close_connections=True, region="far")
            try:
                self.far = server.call(start_far_region(far_app,
                                                        shutdown_timeout=_SHUTDOWN_TIMEOUT))
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        if self._http is None:
            return
        if self.far is not None:
            self._http.call(self.far.close())
            self.far = None
        self._http.stop()
        self._http = None

    def __enter__(self) -> ProviderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
