"""Network phases from httpx's own `trace` request extension (httpx/httpcore and httpx2/httpcore2).

httpcore calls `request.extensions["trace"](name, info)` around each step of a request (an
`async def` for async clients). Event names are `<logger>.<step>.<started|complete|failed>`,
the logger being the last part of `httpcore.connection`, `httpcore.http11`, `httpcore.http2`,
`httpcore.proxy` and `httpcore.socks` (httpcore2 names its loggers `httpcore2.*`, so the names
are the same). There is no event for a connection-pool wait, so:

* `dispatched` = the first network step of the request: `connection.connect_tcp.started` on a
  new connection, `http11.send_request_headers.started` (or http2) on a reused one, where
  `connected` = `dispatched`, i.e. connect = 0;
* `connected` = `connect_tcp` / `start_tls` complete (the last one: TLS, or TLS through a proxy);
  the new connection's stream also gives the address it reached (`note_connected`), read while
  the socket is surely open (a connection the server closes after its response is closed by the
  time a non-streamed body is parsed);
* `sent` = `send_request_body.complete`; `headers` = `receive_response_headers.complete`,
  whose headers also give the provider's own processing time (`openai-processing-ms`): the
  rest of sent -> headers is the network round trip (`round_trip`, tasks.py), and the region
  that answered (`names.REGION_HEADERS`), in the same pass over them;
* `response_closed.started` tells the SDK patch that the response was closed.

Only httpcore-based transports emit these; with any other transport no stamp is taken and the
phases that need them are not recorded.

For the manual API with a plain httpx client: `extensions={"trace": trace_for(call)}` (or
`trace_for(call, is_async=True)` for `httpx.AsyncClient`).

A sync SDK call's extension is `Tracer` (_hottrace.c: `stamp` without a Python frame per
event) where the optional C part was built and its clock is `perf_counter_ns()`'s, else the
call itself (`SdkCall.__call__`, the same steps in Python).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from .. import names
from ..names import PROCESSING_HEADER
from ..record.clock import PERF_COUNTER_IS_CLOCK_MONOTONIC

_PROCESSING = PROCESSING_HEADER.encode("ascii")
#: Region header (lower case, as bytes) -> its precedence (the first of REGION_HEADERS wins).
_REGIONS = {name.encode("ascii"): rank for rank, name in enumerate(names.REGION_HEADERS)}

_DISPATCH, _CONNECTED, _SEND_START, _SENT, _HEADERS, _CLOSED = range(6)
_STEPS = {
    "connect_tcp.started": _DISPATCH,
    "connect_unix_socket.started": _DISPATCH,
    "connect_tcp.complete": _CONNECTED,
    "connect_unix_socket.complete": _CONNECTED,
    "start_tls.complete": _CONNECTED,
    "setup_socks5_connection.complete": _CONNECTED,
    "send_request_headers.started": _SEND_START,
    "send_request_body.complete": _SENT,
    "receive_response_headers.complete": _HEADERS,
    "response_closed.started": _CLOSED,
}
#: Full event name -> what it stamps.
EVENTS = {f"{logger}.{step}": code
          for logger in ("connection", "http11", "http2", "proxy", "socks")
          for step, code in _STEPS.items()}

#: `Tracer(call, timeline, EVENTS, note_headers, note_connected)`: the C trace extension of a
#: sync SDK call (setup.py builds it where a compiler is found), or None. Its stamps are
#: CLOCK_MONOTONIC readings: used only where `perf_counter_ns()` reads that clock too.
Tracer: Any
try:
    from ._hottrace import Tracer
except ImportError:  # built without a compiler: the call itself is the extension
    Tracer = None
if not PERF_COUNTER_IS_CLOCK_MONOTONIC:
    Tracer = None


def stamp(t: Any, name: str, info: Any = None) -> bool:
    """Stamp the timeline `t` for the trace event `name` (whose `info` carries the response
    headers once they are read); True when the response was closed."""
    code = EVENTS.get(name)
    if code is None:
        return False
    now = perf_counter_ns()
    if code == _HEADERS:
        t.headers = now
        if info is not None:
            note_headers(t, now, info)
    elif code == _SENT:
        t.sent = now
    elif code == _SEND_START:
        if t.dispatched is None:
            t.dispatched = now
        if t.connected is None:  # a reused connection: no connect step
            t.connected = t.dispatched
    elif code == _DISPATCH:
        if t.dispatched is None:
            t.dispatched = now
    elif code == _CONNECTED:
        t.connected = now
        if info is not None:
            note_connected(t, info)
    else:
        return True
    return False


def note_headers(t: Any, now: int, info: Any) -> None:
    """The response headers were read at `now` (`info`: the trace event's): the provider's
    processing time and the region, in one pass over the raw headers."""
    try:
        headers = info["return_value"][3]
    except (KeyError, IndexError, TypeError):
        return
    processing = region = None
    rank = len(_REGIONS)
    for key, value in headers:
        key = key.lower()
        if key == _PROCESSING:
            processing = value
        elif key in _REGIONS and _REGIONS[key] < rank and value:
            rank, region = _REGIONS[key], value
    if region is not None and t.upstream_region is None:
        t.upstream_region = _text(region)
    note_processing(t, now, processing)


def _text(value: Any) -> str:
    """A raw header value as httpx decodes it (UTF-8, else Latin-1)."""
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def note_connected(t: Any, info: Any) -> None:
    """A connection was made (`info`: the trace event's; its return value is the connection's
    network stream): the address it reached, unless the request's address is known already."""
    if t.upstream_address is None and isinstance(info, dict):
        stream = info.get("return_value")
        if stream is not None:
            t.upstream_address = peer_address(stream)


def note_processing(t: Any, headers_at: int, value: Any) -> None:
    """The round trip in the server phase: sent -> headers less the provider's own processing
    time (milliseconds, as `openai-processing-ms` says it), when both are known."""
    if value is None or t.sent is None:
        return
    try:
        processing = int(float(value) * 1_000_000)
    except (TypeError, ValueError):
        return
    if processing >= 0:
        t.round_trip = max(0, headers_at - t.sent - processing)


class _Chain:
    """Our trace callback after one that was already on the request."""

    __slots__ = ("first", "ours")

    def __init__(self, first: Any, ours: Any):
        self.first = first
        self.ours = ours

    def __call__(self, name: str, info: dict) -> Any:
        self.ours(name, info)
        return self.first(name, info)


class _AsyncChain(_Chain):
    __slots__ = ()

    async def __call__(self, name: str, info: dict) -> Any:  # type: ignore[override]
        await self.ours(name, info)
        return await self.first(name, info)


def attach(request: Any, tracer: Any) -> None:
    """Make `tracer` the request's trace extension, keeping one that is already there."""
    extensions = request.extensions
    previous = extensions.get("trace")
    if previous is None or previous is tracer:
        extensions["trace"] = tracer
    elif not (isinstance(previous, _Chain) and previous.ours is tracer):
        import inspect

        is_async = inspect.iscoroutinefunction(getattr(tracer, "__call__", tracer))
        extensions["trace"] = (_AsyncChain if is_async else _Chain)(previous, tracer)


def peer_address(stream: Any) -> str | None:
    """"address:port" an httpcore network stream is connected to; None where it cannot say
    (a closed socket, a stream of a transport without `server_addr`)."""
    try:
        peer = stream.get_extra_info("server_addr")
    except Exception:  # OSError from a closed socket's getpeername()
        return None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return None


def address_of(response: Any) -> str | None:
    """"address:port" the connection of an httpx response reached, while that connection is
    open (`note_connected` saw it at connect time otherwise). None where not available: a
    transport that is not httpcore-based has no `network_stream`."""
    stream = response.extensions.get("network_stream")
    return None if stream is None else peer_address(stream)


def region_of(headers: Any) -> str | None:
    """The region header of an httpx response's headers (for a transport that emits no trace
    events; otherwise `note_headers` read it)."""
    for name in names.REGION_HEADERS:
        region = headers.get(name)
        if region:
            return region
    return None


def tracked_of(response: Any, kind: type) -> Any:
    """The object of type `kind` that is the trace extension of `response`'s request."""
    if response is None:
        return None
    try:
        tracer = response.request.extensions.get("trace")
    except Exception:  # no request on a hand-made response
        return None
    if isinstance(tracer, _Chain):
        tracer = tracer.ours
    if Tracer is not None and isinstance(tracer, Tracer):
        tracer = tracer.call
    return tracer if isinstance(tracer, kind) else None


class _CallTrace:
    __slots__ = ("timeline",)

    def __init__(self, call: Any):
        self.timeline = call.timeline

    def __call__(self, name: str, info: dict) -> None:
        try:
            stamp(self.timeline, name, info)
        except Exception:
            pass


class _AsyncCallTrace(_CallTrace):
    __slots__ = ()

    async def __call__(self, name: str, info: dict) -> None:  # type: ignore[override]
        try:
            stamp(self.timeline, name, info)
        except Exception:
            pass


def trace_for(call: Any, is_async: bool = False) -> Any:
    """An httpx `trace` extension stamping the phases of a manual-API `Call`."""
    return (_AsyncCallTrace if is_async else _CallTrace)(call)
