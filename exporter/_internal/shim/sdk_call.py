"""One SDK call from the request to its end: `SdkCall`, the `Call` the SDK patch measures.

It is at the same time the httpx `trace` extension of the call's requests (httpx_trace.py stamps
dispatched / connected / sent / headers, and reports the response being closed), and it knows
its endpoint (`Endpoint`: what an SDK patch says about one API path: how to classify a stream
event, where the usage is).

A call ends exactly once (`end`): when its stream is exhausted (ok), raises (the exception is
re-raised untouched by the stream wrapper; it only sets the outcome), is closed before its end or
garbage-collected (abandoned), when `request()` raises or returns a non-stream result, or, for a
non-stream `with_streaming_response`, when the caller reads its body. Nothing here raises into
the caller: an internal failure is a counted drop.

The upstream (docs/metrics.md, `llm_client_upstream_requests_total`) is read the same way on
every path: the address from the connection (at connect, or from the response the SDK
processes: `reached`), the region from the response headers, the fingerprint from the body
(each endpoint's usage reader), whether the SDK parses the body or the caller reads it raw.
"""

from __future__ import annotations

import atexit
import weakref
from time import perf_counter_ns
from typing import Any, Callable

from .. import names
from . import deadline, httpx_trace
from .manual import Call

#: httpx response classes (httpx2 for current SDKs, httpx for older ones), where importable.
_RESPONSE_TYPES: tuple[type, ...] = ()
for _module in ("httpx2", "httpx"):
    try:
        _RESPONSE_TYPES += (__import__(_module).Response,)
    except Exception:  # pragma: no cover - depends on what is installed
        pass

#: Parsed response bodies (the SDKs' pydantic models), never a raw response: `getattr(model,
#: "http_response", None)` on one misses into pydantic's `__getattr__`, which raises and catches
#: two AttributeErrors (~2 µs, more than all the rest of `returned()`). Their fields are in the
#: instance `__dict__`, so that is where a field of this name would be.
try:
    from pydantic import BaseModel as _BaseModel
except Exception:  # pragma: no cover - both SDKs depend on pydantic
    _BaseModel = None  # type: ignore[assignment,misc]


def _http_response(result: Any) -> Any:
    """`result.http_response` (`with_raw_response` / `with_streaming_response`), else None."""
    if _BaseModel is not None and isinstance(result, _BaseModel):
        return getattr(result, "__dict__", {}).get("http_response")
    return getattr(result, "http_response", None)


_TRACED = httpx_trace.EVENTS
_Tracer = httpx_trace.Tracer

#: Which specialised loop of tokens.py follows the first answer token of an endpoint.
HOT_GENERIC, HOT_CHAT, HOT_RESPONSES, HOT_ANTHROPIC = range(4)


class Endpoint:
    """What an SDK patch says about one LLM endpoint (one URL path)."""

    __slots__ = ("classify", "final", "body_usage", "hot")

    def __init__(self, classify: Callable[[Any, "SdkCall"], str | None],
                 final: Callable[[Any, "SdkCall"], None],
                 body_usage: Callable[[Any, "SdkCall"], None], hot: int = HOT_GENERIC):
        #: classify(event, call) -> token kind or None (framing); may note usage/model.
        self.classify = classify
        #: final(last_event, call): usage and model from the stream's last event.
        self.final = final
        #: body_usage(parsed_or_json_body, call): usage and model of a non-stream response.
        self.body_usage = body_usage
        #: Which specialised loop follows the first answer token (HOT_*).
        self.hot = hot


def field(obj: Any, *path: str) -> Any:
    """obj.a.b (pydantic objects) or obj["a"]["b"] (JSON bodies); None when absent."""
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


class SdkCall(Call):
    """One measured SDK call; also the httpx `trace` extension of its requests (sync flavour)
    where the C one (`httpx_trace.Tracer`, the same steps) is not built."""

    __slots__ = ("endpoint", "streaming", "claimed", "gen", "finalizer", "usage_seen",
                 "complete", "pending_body", "reading", "__weakref__")

    #: httpcore calls the trace extension (sync) rather than awaiting it (async).
    sync = True

    def __init__(self, model: str, provider: str, endpoint: Endpoint, start: int | None,
                 genai_provider: str | None = None):
        Call.__init__(self, model, provider, None, None, start, genai_provider)  # (no super())
        self.endpoint = endpoint
        #: `request()` returned a response whose body is still to come: a stream that has not
        #: ended yet, or a `pending_body`.
        self.streaming = False
        self.claimed = False
        self.gen: weakref.ref | None = None  # our stream wrapper, to tell if it is running
        self.finalizer: _Anchor | None = None  # ends the call if the response is collected
        self.usage_seen: dict[str, Any] | None = None  # scratch for SDKs that spread usage
        #: The response's own end was seen (finish_reason, response.completed, message_stop):
        #: closing the stream after it, without reading the trailing framing, is not abandoning.
        self.complete = False
        #: A non-stream `with_streaming_response`: the caller reads the body after `request()`.
        self.pending_body = False
        #: The SDK is reading that body (`read()`; hooks.read_hook): its close is no abandon.
        self.reading = False

    # httpx trace extension (httpcore / httpcore2 call it with each connection event).
    def __call__(self, name: str, info: dict) -> None:
        if name in _TRACED:  # about half of the events stamp nothing
            try:  # (inline: one Python call less per stamped event)
                if httpx_trace.stamp(self.timeline, name, info) and self.streaming \
                        and not self._finished:
                    self._closed()
            except Exception:
                self.count_drop()

    def _closed(self) -> None:
        """The response was closed. Mid-iteration it is the SDK ending its own stream (the
        wrapper ends the call); otherwise the caller closed it before its end."""
        if self.reading:
            return  # the SDK reading a pending body: hooks.read_hook ends the call
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
                if self.pending_body:  # the whole body was read (iter_bytes(), iter_lines())
                    t = self.timeline
                    t.first_token = t.first_answer_token = perf_counter_ns()
                self.end(None)
                return
        self.end(None, abandoned=True)

    # lifecycle
    def attach_build(self, request: Any) -> None:
        """A request (first attempt or a retry) of this call was built."""
        t = self.timeline
        t.dispatched = t.connected = t.sent = t.headers = None
        t.upstream_address = t.upstream_region = None  # this attempt's connection and headers
        tracer = self if _Tracer is None or not self.sync else \
            _Tracer(self, t, _TRACED, httpx_trace.note_headers, httpx_trace.note_connected)
        extensions = request.extensions
        if extensions.get("trace") is None:  # (`httpx_trace.attach`'s common case, inline)
            extensions["trace"] = tracer
        else:
            httpx_trace.attach(request, tracer)
        if self.span is not None or deadline.current() is not None:  # else it writes nothing
            self.inject(request.headers)
        if not self._attributes:
            return  # nothing reads the attributes below (no span, no GenAI metrics)
        url = request.url  # (httpx's URL properties parse: ~1 µs for these three)
        self.span_attributes[names.ATTR_SERVER_ADDRESS] = url.host
        self.span_attributes[names.ATTR_SERVER_PORT] = url.port or (
            443 if url.scheme == "https" else 80)

    def claim(self) -> bool:
        """True once: the first stream iterator built over this call's response is ours."""
        if self.claimed or self._finished:
            return False
        self.claimed = True
        return True

    def reached(self, response: Any) -> None:
        """The SDK got the httpx response of this call's request (`_process_response`, or the
        response of a status error): the address its connection reached, where no connect
        event said it; the region, where no trace event read the headers."""
        try:
            t = self.timeline
            if t.upstream_address is None:
                t.upstream_address = httpx_trace.address_of(response)
            if t.upstream_region is None and t.headers is None:
                t.upstream_region = httpx_trace.region_of(response.headers)
        except Exception:
            self.count_drop()

    def returned(self, result: Any, stream: bool) -> None:
        """`request()` returned `result`: a stream to follow, or a complete response."""
        try:
            now = perf_counter_ns()
            if self._finished:
                return
            t = self.timeline
            if stream:
                if t.headers is None:
                    # No trace events (a transport that is not httpcore): the headers were read
                    # by the time a stream is handed back.
                    t.headers = now
                self.streaming = True
                anchor = getattr(result, "response", None)
                if not isinstance(anchor, _RESPONSE_TYPES):
                    anchor = getattr(result, "http_response", None)
                if anchor is not None:
                    self.finalizer = _Anchor.attach(anchor, self)
                return
            # Not streamed. The first token reaches the caller when the body is parsed; the
            # server and prefill phases do not exist apart (they need a stream), so the headers
            # stamp is dropped and only the network phases remain.
            t.headers = None
            raw = _http_response(result)
            if raw is not None and not raw.is_closed:
                # with_streaming_response: the caller reads the body later (`body_read`).
                self.streaming = self.pending_body = True
                self.finalizer = _Anchor.attach(raw, self)
                return
            self._answered(result, raw, now)
        except Exception:
            self.count_drop()
            self.end(None)

    def body_read(self, raw: Any) -> None:
        """The SDK read the pending body of `raw` for the caller (`read()`, `parse()`, `json()`,
        `text()`): it is the non-stream call's answer."""
        now = perf_counter_ns()
        self.reading = False
        if self._finished:
            return
        try:
            self._answered(None, raw, now)
        except Exception:
            self.count_drop()
            self.end(None)

    def _answered(self, parsed: Any, raw: Any, now: int) -> None:
        """The whole non-streamed body reached the caller at `now`: parsed by the SDK
        (`parsed`), or read as `raw` (with_raw_response, with_streaming_response)."""
        self.streaming = self.pending_body = False
        if raw is None:
            self.endpoint.body_usage(parsed, self)
        else:
            try:
                body = raw.json()
            except Exception:
                body = None  # not a JSON body: no usage
            if body is not None:
                self.endpoint.body_usage(body, self)
        t = self.timeline
        t.first_token = t.first_answer_token = now
        self.end(None, at=now)

    def end(self, exc: BaseException | None, abandoned: bool = False,
            at: int | None = None) -> None:
        """End the call once, however it ended. Never raises."""
        if self._finished:
            return
        now = perf_counter_ns() if at is None else at
        try:
            if abandoned and not self.complete:
                self.abandon()
            fin = self.finalizer
            if fin is not None:
                self.finalizer = None
                fin.detach()
        except Exception:
            self.count_drop()
        self.finish(exc, end=now)

    def finish_stream(self, last: Any) -> None:
        """The stream was read to its end."""
        try:
            if last is not None:
                self.endpoint.final(last, self)
        except Exception:
            self.count_drop()
        self.end(None)


class AsyncSdkCall(SdkCall):
    """The async flavour: httpcore awaits what the trace extension returns."""

    __slots__ = ()
    sync = False

    async def __call__(self, name: str, info: dict) -> None:  # type: ignore[override]
        if name in _TRACED:
            SdkCall.__call__(self, name, info)


def _collected(call: SdkCall) -> None:
    """The response was garbage-collected before the call ended (never read, never closed)."""
    call.finalizer = None
    call.end(None, abandoned=True)


class _Anchor(weakref.ref):
    """`weakref.finalize(response, _collected, call)` with `atexit = False`, at a fraction of
    its cost per streamed call (~1 µs less): a weak reference to the response whose callback
    ends the call. `_anchors` keeps it alive (the call may die with the response in one garbage
    cycle, and a dead weak reference never calls back); `detach()` takes it out; nothing runs
    once the interpreter is exiting."""

    __slots__ = ("call",)

    @classmethod
    def attach(cls, response: Any, call: SdkCall) -> "_Anchor":
        anchor = cls(response, _anchor_collected)
        anchor.call = call
        _anchors[id(anchor)] = anchor
        return anchor

    def peek(self) -> tuple[Any] | None:
        """(response,) while attached and the response is alive, else None (the first item
        of what `weakref.finalize.peek()` returns)."""
        response = self()
        return (response,) if response is not None and id(self) in _anchors else None

    def detach(self) -> None:
        _anchors.pop(id(self), None)


#: The attached anchors, by id (a weak reference's hash is its referent's, which may be gone).
_anchors: dict[int, _Anchor] = {}
_exiting = [False]
atexit.register(_exiting.__setitem__, 0, True)


def _anchor_collected(anchor: _Anchor) -> None:
    if _anchors.pop(id(anchor), None) is not None and not _exiting[0]:
        _collected(anchor.call)
