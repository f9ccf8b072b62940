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
from typing import Any

import aiohttp

from ..names import PROCESSING_HEADER
from ..runtime import count_drop
from .httpx_trace import note_processing


def _timeline(ctx: SimpleNamespace) -> Any:
    call = getattr(ctx, "trace_request_ctx", None)
    if isinstance(call, dict):
        call = call.get("call")
    return getattr(call, "timeline", None)


def _dispatched(t: Any, now: int, reused: bool) -> None:
    if t.dispatched is None:
        t.dispatched = now
    if reused:
        t.connected = t.dispatched


async def _on_create_start(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    try:
        t = _timeline(ctx)
        if t is not None:
            _dispatched(t, perf_counter_ns(), reused=False)
    except Exception:
        count_drop()


async def _on_create_end(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    try:
        t = _timeline(ctx)
        if t is not None:
            t.connected = perf_counter_ns()
    except Exception:
        count_drop()


async def _on_reuse(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    try:
        t = _timeline(ctx)
        if t is not None:
            _dispatched(t, perf_counter_ns(), reused=True)
    except Exception:
        count_drop()


async def _on_sent(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    """Headers sent, then each body chunk: the last one wins."""
    try:
        t = _timeline(ctx)
        if t is not None:
            t.sent = perf_counter_ns()
    except Exception:
        count_drop()


async def _on_request_end(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    try:
        t = _timeline(ctx)
        if t is not None:
            t.headers = now = perf_counter_ns()
            headers = getattr(params.response, "headers", None)
            if headers is not None:
                note_processing(t, now, headers.get(PROCESSING_HEADER))
    except Exception:
        count_drop()


async def _on_chunk(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    try:
        t = _timeline(ctx)
        if t is not None and t.first_byte is None:
            t.first_byte = perf_counter_ns()
    except Exception:
        count_drop()


def trace_config() -> aiohttp.TraceConfig:
    """A `TraceConfig` stamping the phases of the `Call` passed as `trace_request_ctx`."""
    config = aiohttp.TraceConfig()
    config.on_connection_create_start.append(_on_create_start)
    config.on_connection_create_end.append(_on_create_end)
    config.on_connection_reuseconn.append(_on_reuse)
    config.on_request_headers_sent.append(_on_sent)
    config.on_request_chunk_sent.append(_on_sent)
    config.on_request_end.append(_on_request_end)
    config.on_response_chunk_received.append(_on_chunk)
    return config
