"""One SDK call from entry to end: the per-call state, the stream wrappers, the SDK hooks.

The SDK patches (openai.py, anthropic.py) are thin: they say which endpoints are LLM calls, how
to classify a stream event and where the usage is. Everything else lives here, once:

* `start_hook` wraps a resource method (`chat.completions.create`, `messages.create`, ...) and
  only stamps `start` (SDK method entered) into a ContextVar cell.
* `request_hook` wraps the SDK client's `request()`, the one method every API call of the SDK
  goes through (stream helpers, `with_raw_response`, `with_streaming_response` included). For an
  LLM endpoint it creates a `manual.Call` (so there is one recording path) held by a `Tracked`,
  and makes that `Tracked` current while the SDK builds and sends the request.
* `build_request_hook` wraps the SDK's `_build_request()`: the request of a current `Tracked`
  gets the `Tracked` itself as its httpx `trace` extension (httpx_trace.py), which stamps
  dispatched / connected / sent / headers and sees the response being closed. The user's
  `http_client` is never replaced.
* `stream_hook` wraps `Stream.__stream__` / `AsyncStream.__stream__`: the generator the SDK's
  stream object iterates is wrapped by `sync_tokens` / `async_tokens`, which stamp each event
  and pass the very same object on. The stream object keeps its type, its `with` protocol and
  its methods; only its private iterator is ours.

A call ends exactly once (`Tracked.end`): when its stream is exhausted (ok), raises (the
exception is re-raised untouched; it only sets the outcome), is closed before its end or
garbage-collected (abandoned), or when `request()` raises or returns a non-stream result. Nothing
here raises into the caller: an internal failure is a counted drop
(`ttft_exporter_dropped_total{reason="internal_error"}`).
"""

from __future__ import annotations

import functools
import ipaddress
import re
import weakref
from collections import deque
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, Callable, Sequence

from .. import names, runtime
from . import httpx_trace
from .manual import Call

CONTENT, REASONING, TOOL = names.CONTENT, names.REASONING, names.TOOL

#: Stamp of the resource method's entry, consumed by the `request()` it leads to.
_START: ContextVar[list | None] = ContextVar("ttft_exporter_start", default=None)
#: The call whose request the SDK is building and sending right now.
_CURRENT: ContextVar["Tracked | None"] = ContextVar("ttft_exporter_current", default=None)
#: Set by `uninstrument()`: hooks still installed (e.g. under a later patch) pass through.
enabled = [False]

#: httpx response classes (httpx2 for current SDKs, httpx for older ones), where importable.
_RESPONSE_TYPES: tuple[type, ...] = ()
for _module in ("httpx2", "httpx"):
    try:
        _RESPONSE_TYPES += (__import__(_module).Response,)
    except Exception:  # pragma: no cover - depends on what is installed
        pass

_TRACED = httpx_trace.EVENTS

# Call states.
_REQUESTING, _STREAMING, _DONE = 0, 1, 2


def count_drop() -> None:
    """One internal failure: counted, never raised."""
    try:
        runtime.state().recorder.drops[names.DROP_INTERNAL] += 1
    except Exception:  # pragma: no cover - the recorder itself is broken
        pass


# --- finishing, safely ----------------------------------------------------------------------------
# A call may end inside a garbage-collector finaliser (an abandoned stream), which can run on
# any thread at any allocation, including one made while this thread holds the recorder's
# (non-reentrant) lock. Recording then would deadlock, so such a call is queued and recorded
# by the next call that starts or ends.
_deferred: deque[tuple[Call, BaseException | None, int]] = deque()


def _finish(call: Call, exc: BaseException | None, end: int) -> None:
    try:
        lock = getattr(call._state.recorder, "_lock", None)
        if lock is not None and lock.locked():
            _deferred.append((call, exc, end))
            return
        call.finish(exc, end=end)
        if _deferred:
            drain()
    except Exception:
        count_drop()


def drain() -> None:
    """Record the calls that ended where recording was not safe."""
    while _deferred:
        try:
            call, exc, end = _deferred.popleft()
        except IndexError:
            return
        try:
            call.finish(exc, end=end)
        except Exception:
            count_drop()


# --- the per-call state ------------------------------------------------------------------------
class Endpoint:
    """What an SDK patch says about one LLM endpoint (one URL path)."""

    __slots__ = ("classify", "final", "body_usage", "hot")

    def __init__(self, classify: Callable[[Any, "Tracked"], str | None],
                 final: Callable[[Any, "Tracked"], None],
                 body_usage: Callable[[Any, "Tracked"], None], hot: int = 0):
        #: classify(event, tracked) -> token kind or None (framing); may note usage/model.
        self.classify = classify
        #: final(last_event, tracked): usage and model from the stream's last event.
        self.final = final
        #: body_usage(parsed_or_json_body, tracked): usage and model of a non-stream response.
        self.body_usage = body_usage
        #: Which specialised loop follows the first answer token (HOT_*).
        self.hot = hot


class Tracked:
    """One measured SDK call. Also the httpx `trace` extension of its requests (sync flavour)."""

    __slots__ = ("call", "timeline", "endpoint", "state", "claimed", "gen", "finalizer",
                 "usage", "complete", "__weakref__")

    def __init__(self, call: Call, endpoint: Endpoint):
        self.call = call
        self.timeline = call.timeline
        self.endpoint = endpoint
        self.state = _REQUESTING
        self.claimed = False
        self.gen: weakref.ref | None = None  # our stream wrapper, to tell if it is running
        self.finalizer: weakref.finalize | None = None
        self.usage: dict[str, Any] | None = None  # scratch for SDKs that spread usage
        #: The response's own end was seen (finish_reason, response.completed, message_stop):
        #: closing the stream after it, without reading the trailing framing, is not abandoning.
        self.complete = False

    # httpx trace extension (httpcore / httpcore2 call it with each connection event).
    def __call__(self, name: str, info: dict) -> None:
        if name in _TRACED:  # about half of the events stamp nothing
            self.on_trace(name)

    def on_trace(self, name: str) -> None:
        try:
            if httpx_trace.stamp(self.timeline, name) and self.state == _STREAMING:
                self._closed()
        except Exception:
            count_drop()

    def _closed(self) -> None:
        """The response was closed. Mid-iteration it is the SDK ending its own stream (the
        wrapper ends the call); otherwise the caller closed it before its end."""
        ref = self.gen
        gen = ref() if ref is not None else None
        if gen is not None and (getattr(gen, "gi_running", False)
                                or getattr(gen, "ag_running", False)):
            return
        if not self.claimed and self.finalizer is not None:
            # No SDK stream read it. A caller reading the body itself
            # (`with_streaming_response` + `iter_lines()`) ends the call, tokens unseen.
            held = self.finalizer.peek()
            if held is not None and getattr(held[0], "is_stream_consumed", False):
                self.end(None)
                return
        self.end(None, abandoned=True)

    # lifecycle
    def attach_build(self, request: Any) -> None:
        """A request (first attempt or a retry) of this call was built."""
        t = self.timeline
        t.dispatched = t.connected = t.sent = t.headers = None
        httpx_trace.attach(request, self)
        self.call.inject(request.headers)
        self.call.span_attributes[names.ATTR_SERVER_ADDRESS] = request.url.host

    def claim(self) -> bool:
        """True once: the first stream iterator built over this call's response is ours."""
        if self.claimed or self.state == _DONE:
            return False
        self.claimed = True
        return True

    def failed(self, exc: BaseException) -> None:
        """`request()` raised (HTTP status, connection error, timeout, cancellation)."""
        self.end(exc)

    def returned(self, result: Any, stream: bool) -> None:
        """`request()` returned `result`: a stream to follow, or a complete response."""
        try:
            now = perf_counter_ns()
            if self.state == _DONE:
                return
            t = self.timeline
            if stream:
                if t.headers is None:
                    # No trace events (a transport that is not httpcore): the headers were read
                    # by the time a stream is handed back.
                    t.headers = now
                self.state = _STREAMING
                anchor = getattr(result, "response", None)
                if not isinstance(anchor, _RESPONSE_TYPES):
                    anchor = getattr(result, "http_response", None)
                if anchor is not None:
                    fin = self.finalizer = weakref.finalize(anchor, _collected, self)
                    fin.atexit = False  # nothing to record while the interpreter exits
                return
            # Not streamed. The first token reaches the caller when the body is parsed, which
            # is now; the server and prefill phases do not exist apart (DESIGN §4 phases need a
            # stream), so the headers stamp is dropped and only the network phases remain.
            t.headers = None
            raw = getattr(result, "http_response", None)
            if raw is None:
                self.endpoint.body_usage(result, self)
                t.first_token = t.first_answer_token = now
            elif raw.is_closed:  # with_raw_response: the body is read, not yet parsed
                try:
                    self.endpoint.body_usage(raw.json(), self)
                except Exception:
                    pass
                t.first_token = t.first_answer_token = now
            # else with_streaming_response: the body is read later by the caller; no TTFT.
            self.end(None, at=now)
        except Exception:
            count_drop()
            self.end(None)

    def end(self, exc: BaseException | None, abandoned: bool = False,
            at: int | None = None) -> None:
        """End the call once, however it ended. Never raises."""
        if self.state == _DONE:
            return
        self.state = _DONE
        now = perf_counter_ns() if at is None else at
        try:
            if abandoned and not self.complete:
                self.call.abandon()
            fin = self.finalizer
            if fin is not None:
                self.finalizer = None
                fin.detach()
        except Exception:
            count_drop()
        _finish(self.call, exc, now)

    def finish_stream(self, last: Any) -> None:
        """The stream was read to its end."""
        try:
            if last is not None:
                self.endpoint.final(last, self)
        except Exception:
            count_drop()
        self.end(None)

    def wrap(self, inner: Any, is_async: bool) -> Any:
        gen = async_tokens(inner, self) if is_async else sync_tokens(inner, self)
        self.gen = weakref.ref(gen)
        return gen


class AsyncTracked(Tracked):
    """The async flavour: httpcore awaits what the trace extension returns."""

    __slots__ = ()

    async def __call__(self, name: str, info: dict) -> None:  # type: ignore[override]
        if name in _TRACED:
            self.on_trace(name)


def _collected(tracked: Tracked) -> None:
    """The response was garbage-collected before the call ended (never read, never closed)."""
    tracked.finalizer = None
    tracked.end(None, abandoned=True)


# --- the stream wrappers (the per-chunk path) ---------------------------------------------------
# Each wrapper has two loops. Until the first answer token, every event goes through the
# endpoint's full `classify` (framing, reasoning, first tokens). After it, a loop specialised
# per wire format checks the common case inline (a non-empty text delta: no function call) and
# falls back to `classify` for anything else; per event that is a `perf_counter_ns()`, a few
# attribute reads, a list append and our generator's resume. Any internal failure is a counted
# drop and the rest of the stream passes through unmeasured.
HOT_GENERIC, HOT_CHAT, HOT_RESPONSES, HOT_ANTHROPIC = range(4)


def sync_tokens(inner: Any, tr: Tracked) -> Any:
    """Yield every event of `inner` unchanged; stamp token events (DESIGN §4)."""
    t = tr.timeline
    append = t.token_times.append
    classify = tr.endpoint.classify
    perf = perf_counter_ns
    last = None
    try:
        it = iter(inner)
        broken = False
        for chunk in it:  # cold: until the first answer token
            now = perf()
            try:
                if last is None:
                    t.first_byte = now
                last = chunk
                kind = classify(chunk, tr)
                if kind is not None:
                    append(now)
                    if t.first_token is None:
                        t.first_token = now
                    if kind is REASONING:
                        t.reasoning_events += 1
                    else:
                        t.first_answer_token = now
            except Exception:
                count_drop()
                broken = True
            yield chunk
            if broken or t.first_answer_token is not None:
                break
        hot = HOT_GENERIC if broken else tr.endpoint.hot
        if hot == HOT_CHAT:
            for chunk in it:
                now = perf()
                try:
                    choices = chunk.choices
                    if choices and choices[0].delta.content:
                        append(now)
                    elif not _other(chunk, tr, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_RESPONSES:
            for chunk in it:
                now = perf()
                try:
                    if chunk.type == "response.output_text.delta" and chunk.delta:
                        append(now)
                    elif not _other(chunk, tr, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_ANTHROPIC:
            for chunk in it:
                now = perf()
                try:
                    if chunk.type == "content_block_delta" and chunk.delta.type == "text_delta" \
                            and chunk.delta.text:
                        append(now)
                    elif not _other(chunk, tr, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif not broken:
            for chunk in it:
                now = perf()
                broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        for chunk in it:  # only after an internal failure: pass the rest through
            last = chunk
            yield chunk
    except GeneratorExit:  # closed or garbage-collected before its end
        tr.end(None, abandoned=True)
        raise
    except BaseException as exc:
        tr.end(exc)
        raise
    tr.finish_stream(last)


def _other(chunk: Any, tr: Tracked, now: int) -> bool:
    """Classify an event after the first answer token; False after an internal failure."""
    try:
        kind = tr.endpoint.classify(chunk, tr)
        if kind is not None:
            tr.timeline.token_times.append(now)
            if kind is REASONING:
                tr.timeline.reasoning_events += 1
        return True
    except Exception:
        count_drop()
        return False


async def async_tokens(inner: Any, tr: Tracked) -> Any:
    """The async twin of `sync_tokens` (keep the two in step)."""
    t = tr.timeline
    append = t.token_times.append
    classify = tr.endpoint.classify
    perf = perf_counter_ns
    last = None
    try:
        it = inner.__aiter__()
        broken = False
        async for chunk in it:
            now = perf()
            try:
                if last is None:
                    t.first_byte = now
                last = chunk
                kind = classify(chunk, tr)
                if kind is not None:
                    append(now)
                    if t.first_token is None:
                        t.first_token = now
                    if kind is REASONING:
                        t.reasoning_events += 1
                    else:
                        t.first_answer_token = now
            except Exception:
                count_drop()
                broken = True
            yield chunk
            if broken or t.first_answer_token is not None:
                break
        hot = HOT_GENERIC if broken else tr.endpoint.hot
        if hot == HOT_CHAT:
            async for chunk in it:
                now = perf()
                try:
                    choices = chunk.choices
                    if choices and choices[0].delta.content:
                        append(now)
                    elif not _other(chunk, tr, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_RESPONSES:
            async for chunk in it:
                now = perf()
                try:
                    if chunk.type == "response.output_text.delta" and chunk.delta:
                        append(now)
                    elif not _other(chunk, tr, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_ANTHROPIC:
            async for chunk in it:
                now = perf()
                try:
                    if chunk.type == "content_block_delta" and chunk.delta.type == "text_delta" \
                            and chunk.delta.text:
                        append(now)
                    elif not _other(chunk, tr, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif not broken:
            async for chunk in it:
                now = perf()
                broken = not _other(chunk, tr, now)
                last = chunk
                yield chunk
                if broken:
                    break
        async for chunk in it:
            last = chunk
            yield chunk
    except GeneratorExit:
        tr.end(None, abandoned=True)
        raise
    except BaseException as exc:
        tr.end(exc)
        raise
    tr.finish_stream(last)


# --- the SDK hooks --------------------------------------------------------------------------------
class SDK:
    """What an SDK patch provides to the generic hooks."""

    def __init__(self, name: str, endpoints: dict[str, Endpoint],
                 provider: Callable[[Any], str]):
        self.name = name
        self.endpoints = endpoints
        self.provider = provider


def _begin(sdk: SDK, client: Any, options: Any, is_async: bool) -> Tracked | None:
    if _deferred:
        drain()
    endpoint = sdk.endpoints.get(getattr(options, "url", None))
    if endpoint is None or str(getattr(options, "method", "")).lower() != "post":
        return None
    body = getattr(options, "json_data", None)
    model = body.get("model") if isinstance(body, dict) else None
    cell = _START.get()
    start = None
    if cell is not None and cell[0] is not None:
        start, cell[0] = cell[0], None  # one method entry, one call
    call = Call(model if isinstance(model, str) and model else names.UNKNOWN,
                sdk.provider(client), None, None, start=start)
    call.span_attributes[names.ATTR_REQUEST_STREAM] = bool(
        isinstance(body, dict) and body.get("stream"))
    return (AsyncTracked if is_async else Tracked)(call, endpoint)


def request_hook(original: Callable, sdk: SDK, is_async: bool) -> Callable:
    """Wrap `SyncAPIClient.request` / `AsyncAPIClient.request`."""
    if is_async:
        @functools.wraps(original)
        async def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any
                          ) -> Any:
            tracked = None
            if enabled[0]:
                try:
                    tracked = _begin(sdk, self, options, True)
                except Exception:
                    count_drop()
            if tracked is None:
                if _CURRENT.get() is None:
                    return await original(self, cast_to, options, *args, **kwargs)
                token = _CURRENT.set(None)  # a request made while an LLM call is being sent
                try:
                    return await original(self, cast_to, options, *args, **kwargs)
                finally:
                    _CURRENT.reset(token)
            token = _CURRENT.set(tracked)
            span_token = tracked.call.activate()
            try:
                result = await original(self, cast_to, options, *args, **kwargs)
            except BaseException as exc:
                tracked.failed(exc)
                raise
            finally:
                _CURRENT.reset(token)
                tracked.call.deactivate(span_token)
            tracked.returned(result, bool(kwargs.get("stream")))
            return result
        return request

    @functools.wraps(original)
    def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        tracked = None
        if enabled[0]:
            try:
                tracked = _begin(sdk, self, options, False)
            except Exception:
                count_drop()
        if tracked is None:
            if _CURRENT.get() is None:
                return original(self, cast_to, options, *args, **kwargs)
            token = _CURRENT.set(None)  # a request made while an LLM call is being sent
            try:
                return original(self, cast_to, options, *args, **kwargs)
            finally:
                _CURRENT.reset(token)
        token = _CURRENT.set(tracked)
        span_token = tracked.call.activate()
        try:
            result = original(self, cast_to, options, *args, **kwargs)
        except BaseException as exc:
            tracked.failed(exc)
            raise
        finally:
            _CURRENT.reset(token)
            tracked.call.deactivate(span_token)
        tracked.returned(result, bool(kwargs.get("stream")))
        return result
    return request


def client_hooks(base_client: Any, streaming: Any, sdk: SDK) -> list[tuple[type, str, Any]]:
    """The hooks every SDK built on Stainless' base client needs (openai, anthropic)."""
    return [
        (base_client.SyncAPIClient, "request", lambda f: request_hook(f, sdk, is_async=False)),
        (base_client.AsyncAPIClient, "request", lambda f: request_hook(f, sdk, is_async=True)),
        (base_client.BaseClient, "_build_request", build_request_hook),
        (streaming.Stream, "__stream__", lambda f: stream_hook(f, is_async=False)),
        (streaming.AsyncStream, "__stream__", lambda f: stream_hook(f, is_async=True)),
    ]


def build_request_hook(original: Callable) -> Callable:
    """Wrap `BaseClient._build_request`: attach the current call as the trace extension."""
    @functools.wraps(original)
    def _build_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = original(self, *args, **kwargs)
        tracked = _CURRENT.get()
        if tracked is not None:
            try:
                tracked.attach_build(request)
            except Exception:
                count_drop()
        return request
    return _build_request


def stream_hook(original: Callable, is_async: bool) -> Callable:
    """Wrap `Stream.__stream__` / `AsyncStream.__stream__` (a generator function)."""
    @functools.wraps(original)
    def __stream__(self: Any) -> Any:
        inner = original(self)
        try:
            tracked = httpx_trace.tracked_of(getattr(self, "response", None), Tracked)
            if tracked is None:
                tracked = _CURRENT.get()
            if tracked is not None and tracked.claim():
                return tracked.wrap(inner, is_async)
        except Exception:
            count_drop()
        return inner
    return __stream__


def start_hook(original: Callable, is_async: bool) -> Callable:
    """Wrap a resource method: stamp `start` when the SDK method is entered."""
    if is_async:
        @functools.wraps(original)
        async def method(*args: Any, **kwargs: Any) -> Any:
            token = _START.set([perf_counter_ns()])
            try:
                return await original(*args, **kwargs)
            finally:
                _START.reset(token)
        return method

    @functools.wraps(original)
    def method(*args: Any, **kwargs: Any) -> Any:
        token = _START.set([perf_counter_ns()])
        try:
            return original(*args, **kwargs)
        finally:
            _START.reset(token)
    return method


# --- usage helpers shared by the SDK patches ----------------------------------------------------
def field(obj: Any, *path: str) -> Any:
    """obj.a.b (pydantic objects) or obj["a"]["b"] (JSON bodies); None when absent."""
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


# --- provider names -----------------------------------------------------------------------------
_KNOWN_HOSTS = {
    "api.openai.com": "openai", "api.anthropic.com": "anthropic",
    "api.deepseek.com": "deepseek", "api.groq.com": "groq", "api.together.xyz": "together",
    "api.together.ai": "together", "api.fireworks.ai": "fireworks",
    "openrouter.ai": "openrouter", "api.mistral.ai": "mistral", "api.x.ai": "xai",
    "generativelanguage.googleapis.com": "google", "api.perplexity.ai": "perplexity",
    "api.cerebras.ai": "cerebras", "integrate.api.nvidia.com": "nvidia",
    "api.deepinfra.com": "deepinfra", "router.huggingface.co": "huggingface",
}
_SUFFIXES = ((".azure.com", "azure"), (".azure-api.net", "azure"),
             (".amazonaws.com", "bedrock"), ("aiplatform.googleapis.com", "vertex"))
_SERVERS = ("vllm", "sglang", "ollama", "llamacpp", "llama-cpp", "lmstudio", "litellm", "tgi",
            "triton", "localai")
_INTERNAL_TLDS = frozenset({"local", "internal", "lan", "localdomain", "corp", "home", "intranet",
                            "cluster", "svc", "test", "localhost"})
_SECOND_LEVEL = frozenset({"co", "com", "net", "org", "ac", "gov", "edu"})
_NOT_LABEL = re.compile(r"[^a-z0-9_-]+")


def client_provider(client: Any, default: str, by_class: Sequence[tuple[str, str]],
                    cache: dict[tuple[type, str], str]) -> str:
    """The provider label of an SDK client: from its class name (`by_class`: substring ->
    provider, e.g. azure, bedrock), else from its base URL host; cached per (class, host)."""
    try:
        host = client.base_url.host
    except Exception:
        host = ""
    key = (type(client), host)
    name = cache.get(key)
    if name is None:
        cls = type(client).__name__.lower()
        name = next((n for part, n in by_class if part in cls), None) \
            or provider_name(host, default)
        if len(cache) < 1024:
            cache[key] = name
    return name


def provider_name(host: str | None, default: str) -> str:
    """A short provider name from the base URL host: never a URL, never a port.

    Known API hosts map to their provider; hosts naming a serving engine (vllm, sglang, ...)
    to that engine; loopback to "local"; other IP addresses to "ip"; internal DNS names
    (`*.svc.cluster.local`, single labels) to their first label, the service; public names to
    their registrable label (`llm.example.com` -> "example").
    """
    if not host:
        return default
    host = host.lower().strip("[]").rstrip(".")
    if host in _KNOWN_HOSTS:
        return _KNOWN_HOSTS[host]
    for suffix, name in _SUFFIXES:
        if host.endswith(suffix):
            return name
    for server in _SERVERS:
        if server in host:
            return server.replace("-", "")
    if host == "localhost":
        return "local"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return "local" if address.is_loopback else "ip"
    labels = host.split(".")
    if len(labels) == 1 or labels[-1] in _INTERNAL_TLDS or "svc" in labels:
        pick = labels[0]
    elif len(labels) >= 3 and labels[-2] in _SECOND_LEVEL:
        pick = labels[-3]
    else:
        pick = labels[-2]
    return _NOT_LABEL.sub("-", pick)[:32].strip("-") or default
