"""Network phases for aiohttp users of the manual API, from aiohttp's `TraceConfig` signals.

    session = aiohttp.ClientSession(trace_configs=[exporter.integrations.aiohttp_trace_config()])
    with exporter.track(model="m", provider="vllm") as call:
        async with session.post(url, json=body, trace_request_ctx=call) as response:
            ...

The `Call` travels in `trace_request_ctx` (an object with a `timeline`, or a mapping with a
"call" key). Stamps: `dispatched` when the request gets its connection (a new one starts, or an
idle one is reused, after any pool wait), `connected` when a new connection is up (= dispatched
on reuse: connect = 0), `sent` when the last request chunk (or the headers, for a body-less
request) is written, `headers` when the response headers are read (`on_request_end`; with
them the provider's own processing time, `openai-processing-ms`, which gives the round trip),
`first_byte` at the first response body chunk. Requests without a call are ignored.
"""

from __future__ import annotations

from time import perf_counter_ns
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import aiohttp

from ..names import PROCESSING_HEADER
from ..runtime import count_drop
from .httpx_trace import note_processing


def _timeline(ctx: SimpleNamespace) -> Any:
    call = getattr(ctx, "trace_request_ctx", None)
    if isinstance(call, dict):
        call = call.get("call")
    return getattr(call, "timeline", None)


def _signal(stamp: Callable[[Any, int, Any], None]) -> Callable[..., Awaitable[None]]:
    """An aiohttp signal handler that stamps the request's call, if any; never raises."""
    async def handler(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        try:
            t = _timeline(ctx)
            if t is not None:
                stamp(t, perf_counter_ns(), params)
        except Exception:
            count_drop()
    return handler


def _create_start(t: Any, now: int, params: Any) -> None:
    """A new connection starts: the request has its connection (after any pool wait)."""
    if t.dispatched is None:
        t.dispatched = now


def _create_end(t: Any, now: int, params: Any) -> None:
    t.connected = now


def _reuse(t: Any, now: int, params: Any) -> None:
    """An idle connection is reused: dispatched and connected at once (connect = 0)."""
    _create_start(t, now, params)
    t.connected = t.dispatched


def _sent(t: Any, now: int, params: Any) -> None:
    """Headers sent, then each body chunk: the last one wins."""
    t.sent = now


def _request_end(t: Any, now: int, params: Any) -> None:
    t.headers = now
    headers = getattr(params.response, "headers", None)
    if headers is not None:
        note_processing(t, now, headers.get(PROCESSING_HEADER))


def _chunk(t: Any, now: int, params: Any) -> None:
    if t.first_byte is None:
        t.first_byte = now


def trace_config() -> aiohttp.TraceConfig:
    """A `TraceConfig` stamping the phases of the `Call` passed as `trace_request_ctx`."""
    config = aiohttp.TraceConfig()
    config.on_connection_create_start.append(_signal(_create_start))
    config.on_connection_create_end.append(_signal(_create_end))
    config.on_connection_reuseconn.append(_signal(_reuse))
    sent = _signal(_sent)
    config.on_request_headers_sent.append(sent)
    config.on_request_chunk_sent.append(sent)
    config.on_request_end.append(_signal(_request_end))
    config.on_response_chunk_received.append(_signal(_chunk))
    return config
