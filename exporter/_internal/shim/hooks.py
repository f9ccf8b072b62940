"""The hooks the SDK patches install: where an SDK call is seen, from entry to stream.

* `start_hook` wraps a resource method (`chat.completions.create`, `messages.create`, ...) and
  only stamps `start` (SDK method entered) into a ContextVar cell.
* `request_hook` wraps the SDK client's `request()`, the one method every API call of the SDK
  goes through (stream helpers, `with_raw_response`, `with_streaming_response` included). For an
  LLM endpoint it creates the call (`SdkCall`) and makes it current while the SDK builds and
  sends the request (its span too, so the SDK's own spans nest under it).
* `build_request_hook` wraps the SDK's `_build_request()`: the request of the current call gets
  the call itself as its httpx `trace` extension (httpx_trace.py). The user's `http_client` is
  never replaced.
* `process_response_hook` wraps the SDK's `_process_response()`, which every successful
  request's httpx response goes through before the SDK parses or wraps it: the call notes the
  upstream the response came from (`SdkCall.reached`), for parsed results too.
* `sleep_for_retry_hook` wraps the SDK's `_sleep_for_retry()`, its backoff between a failed
  attempt and the next: once it has slept, the current call notes the retry (`Call.retried`:
  what ended the attempt, and the next attempt's start), so the failed attempts and the backoff
  are the call's `retry` phase, not its `queue`. Never called on a call's first attempt.
* `read_hook` wraps `APIResponse.read()` (what `parse()`, `json()` and `text()` read through):
  a non-stream `with_streaming_response` call ends when its caller reads the body.
* `stream_hook` wraps `Stream.__stream__` / `AsyncStream.__stream__`: the generator the SDK's
  stream object iterates is wrapped by the token loops (tokens.py).

The SDK patches (openai.py, anthropic.py) only say which endpoints are LLM calls and how to read
their events (`SDK`, `Endpoint`). Nothing here raises into the caller.
"""

from __future__ import annotations

import functools
import importlib
import sys
import weakref
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, Callable

from .. import names, runtime
from . import httpx_trace
from .providers import genai_provider
from .sdk_call import AsyncSdkCall, Endpoint, SdkCall
from .tokens import async_tokens, stamped

#: Stamp of the resource method's entry, consumed by the `request()` it leads to.
_START: ContextVar[list | None] = ContextVar("ttft_exporter_start", default=None)
#: The call whose request the SDK is building and sending right now.
_CURRENT: ContextVar["SdkCall | None"] = ContextVar("ttft_exporter_current", default=None)
#: Set by `uninstrument()`: hooks still installed (e.g. under a later patch) pass through.
enabled = [False]
#: Where a request body states its output limit (Chat, Responses, Anthropic Messages).
_MAX_TOKENS_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_MAX_TOKENS_SET = frozenset(_MAX_TOKENS_KEYS)
#: Base URL objects an SDK's label cache holds at most.
_MAX_LABELS = 1024


class SDK:
    """What an SDK patch provides to the generic hooks."""

    def __init__(self, name: str, endpoints: dict[str, Endpoint],
                 provider: Callable[[Any], str]):
        self.name = name
        self.endpoints = endpoints
        self.provider = provider
        #: id(client._base_url) -> (that URL, the client's class, provider label, GenAI
        #: provider): a client's labels in one lookup, no URL property read. The URL is held,
        #: so its id is not reused; a new URL object (base_url set again) misses. Bounded.
        self.labels: dict[int, tuple[Any, type, str, str]] = {}

    def labels_of(self, client: Any) -> tuple[str, str]:
        """(provider label, `gen_ai.provider.name`) of a client."""
        url = getattr(client, "_base_url", None)
        entry = self.labels.get(id(url))
        if entry is not None and entry[0] is url and entry[1] is client.__class__:
            return entry[2], entry[3]
        provider = self.provider(client)
        genai = genai_provider(provider, self.name)
        if url is not None and len(self.labels) < _MAX_LABELS:
            self.labels[id(url)] = (url, client.__class__, provider, genai)
        return provider, genai


def _begin(sdk: SDK, client: Any, options: Any, is_async: bool) -> SdkCall | None:
    endpoint = sdk.endpoints.get(getattr(options, "url", None))
    if endpoint is None:
        return None
    method = getattr(options, "method", "")
    if method != "post" and str(method).lower() != "post":  # (the SDKs say "post")
        return None
    body = getattr(options, "json_data", None)
    model = body.get("model") if isinstance(body, dict) else None
    cell = _START.get()
    start = None
    if cell is not None and cell[0] is not None:
        start, cell[0] = cell[0], None  # one method entry, one call
    provider, genai = sdk.labels_of(client)
    call = (AsyncSdkCall if is_async else SdkCall)(
        model if isinstance(model, str) and model else names.UNKNOWN, provider,
        endpoint, start, genai)
    if call._attributes:  # only the span and the GenAI metrics read it
        call.span_attributes[names.ATTR_REQUEST_STREAM] = bool(
            isinstance(body, dict) and body.get("stream"))
    if isinstance(body, dict) and not _MAX_TOKENS_SET.isdisjoint(body):  # (one C call)
        for key in _MAX_TOKENS_KEYS:
            limit = body.get(key)
            if limit is not None:
                call.max_tokens(limit)
                break
    task = call.task
    if task is not None and task.sdk_timeout:
        task.limit(options)
    return call


#: What `request()` changed while the SDK builds and sends one request: (the current call, or
#: None hiding an outer call from a request that is not an LLM call; the ContextVar token; the
#: span's token). A tuple, not an object: one class instantiation less per call.
_Scope = tuple[Any, Any, Any]


def _enter(sdk: SDK, client: Any, options: Any, is_async: bool) -> _Scope | None:
    """The scope of one `request()`, or None when it changes nothing (the fast pass-through)."""
    call = None
    if enabled[0]:
        try:
            call = _begin(sdk, client, options, is_async)
        except Exception:
            runtime.count_drop()
    if call is None:
        if _CURRENT.get() is None:
            return None
        return None, _CURRENT.set(None), None
    token = _CURRENT.set(call)
    return call, token, call.activate() if call.span is not None else None


def _leave(scope: _Scope, exc: BaseException | None, result: Any = None, stream: Any = False
           ) -> Any:
    """Restore the context; end the call on `exc`, else hand it the result."""
    call, token, span_token = scope
    try:
        if call is not None and exc is not None:
            response = getattr(exc, "response", None)  # a status error's
            if response is not None and hasattr(response, "extensions"):
                call.reached(response)
            call.end(exc)
    finally:
        _CURRENT.reset(token)
        if call is not None and call.span is not None:
            call.deactivate(span_token)
    if call is not None and exc is None:
        call.returned(result, bool(stream))
    return result


def request_hook(original: Callable, sdk: SDK, is_async: bool) -> Callable:
    """Wrap `SyncAPIClient.request` / `AsyncAPIClient.request`. The two bodies differ only by
    `await` (Python has no other way); `_enter` and `_leave` hold the logic."""
    if is_async:
        @functools.wraps(original)
        async def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any
                          ) -> Any:
            scope = _enter(sdk, self, options, True)
            if scope is None:
                return await original(self, cast_to, options, *args, **kwargs)
            try:
                result = await original(self, cast_to, options, *args, **kwargs)
            except BaseException as exc:
                _leave(scope, exc)
                raise
            return _leave(scope, None, result, kwargs.get("stream"))
        return request

    @functools.wraps(original)
    def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        scope = _enter(sdk, self, options, False)
        if scope is None:
            return original(self, cast_to, options, *args, **kwargs)
        try:
            result = original(self, cast_to, options, *args, **kwargs)
        except BaseException as exc:
            _leave(scope, exc)
            raise
        return _leave(scope, None, result, kwargs.get("stream"))
    return request


def client_hooks(sdk: SDK) -> Callable[[Any], list[tuple[type, str, Any]]]:
    """The hooks of the base client every SDK built on Stainless' needs (openai, anthropic),
    given its `_base_client` module once imported: classes of it and of the SDK's `_streaming`
    and `_response` modules (imported then, with it)."""
    return lambda base_client: _client_hooks(
        base_client, importlib.import_module(f"{sdk.name}._streaming"),
        importlib.import_module(f"{sdk.name}._response"), sdk)


def _client_hooks(base_client: Any, streaming: Any, response: Any, sdk: SDK
                  ) -> list[tuple[type, str, Any]]:
    return [
        (base_client.SyncAPIClient, "request", lambda f: request_hook(f, sdk, is_async=False)),
        (base_client.AsyncAPIClient, "request", lambda f: request_hook(f, sdk, is_async=True)),
        (base_client.BaseClient, "_build_request", build_request_hook),
        (base_client.SyncAPIClient, "_process_response", process_response_hook),
        (base_client.AsyncAPIClient, "_process_response", process_response_hook),
        (base_client.SyncAPIClient, "_sleep_for_retry",
         lambda f: sleep_for_retry_hook(f, is_async=False)),
        (base_client.AsyncAPIClient, "_sleep_for_retry",
         lambda f: sleep_for_retry_hook(f, is_async=True)),
        (streaming.Stream, "__stream__", lambda f: stream_hook(f, is_async=False)),
        (streaming.AsyncStream, "__stream__", lambda f: stream_hook(f, is_async=True)),
        (response.APIResponse, "read", lambda f: read_hook(f, is_async=False)),
        (response.AsyncAPIResponse, "read", lambda f: read_hook(f, is_async=True)),
    ]


def process_response_hook(original: Callable) -> Callable:
    """Wrap `SyncAPIClient._process_response` / `AsyncAPIClient._process_response`: the
    current call notes where its response came from. One plain function for both: the async
    original's coroutine is returned as it is, for the SDK to await."""
    @functools.wraps(original)
    def _process_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _CURRENT.get()
        if call is not None:
            call.reached(kwargs.get("response"))
        return original(self, *args, **kwargs)
    return _process_response


def _retry_cause(response: Any) -> Any:
    """What ended the attempt the SDK is about to retry: the status of its error response (the
    SDK passes it to `_sleep_for_retry`), else the exception the SDK is handling (a timeout, a
    connection error: the SDK sleeps inside its `except`), else None."""
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else sys.exc_info()[1]


def _retried(call: SdkCall, cause: Any) -> None:
    try:
        call.retried(cause)
    except Exception:
        call.count_drop()


def sleep_for_retry_hook(original: Callable, is_async: bool) -> Callable:
    """Wrap `SyncAPIClient._sleep_for_retry` / `AsyncAPIClient._sleep_for_retry`: after the
    backoff, the current call's next attempt starts (`Call.retried`). A sleep that raises
    (the task cancelled during its backoff) starts no attempt."""
    @functools.wraps(original)
    def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _CURRENT.get()
        if call is None:
            return original(self, *args, **kwargs)
        cause = _retry_cause(kwargs.get("response"))  # (here: inside the SDK's `except`)
        sleeping = original(self, *args, **kwargs)  # (async: the coroutine, not yet slept)
        if is_async:
            return _retried_after(sleeping, call, cause)
        _retried(call, cause)
        return sleeping
    return _sleep_for_retry


async def _retried_after(sleeping: Any, call: SdkCall, cause: Any) -> Any:
    result = await sleeping
    _retried(call, cause)
    return result


def _pending(api_response: Any) -> SdkCall | None:
    """The call whose body `api_response` (an SDK `APIResponse`) holds for its caller, if it
    is a non-stream `with_streaming_response` not read yet; else None (quickly, inside
    `request()`, where the SDK reads a plain call's body itself)."""
    if _CURRENT.get() is not None:
        return None
    try:
        call = httpx_trace.tracked_of(api_response.http_response, SdkCall)
    except Exception:
        return None
    return call if call is not None and call.pending_body and not call._finished else None


def read_hook(original: Callable, is_async: bool) -> Callable:
    """Wrap `APIResponse.read` / `AsyncAPIResponse.read`: a pending body read to its end is
    the call's answer (`SdkCall.body_read`); the response's close on the way is not an
    abandon (`SdkCall.reading`)."""
    if is_async:
        @functools.wraps(original)
        async def read(self: Any) -> Any:
            call = _pending(self)
            if call is None:
                return await original(self)
            call.reading = True
            try:
                body = await original(self)
            except BaseException as exc:
                call.reading = False
                call.end(exc)
                raise
            call.body_read(self.http_response)
            return body
        return read

    @functools.wraps(original)
    def read(self: Any) -> Any:  # (the same body without `await`, as request_hook's)
        call = _pending(self)
        if call is None:
            return original(self)
        call.reading = True
        try:
            body = original(self)
        except BaseException as exc:
            call.reading = False
            call.end(exc)
            raise
        call.body_read(self.http_response)
        return body
    return read


def build_request_hook(original: Callable) -> Callable:
    """Wrap `BaseClient._build_request`: attach the current call as the trace extension."""
    @functools.wraps(original)
    def _build_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = original(self, *args, **kwargs)
        call = _CURRENT.get()
        if call is not None:
            try:
                call.attach_build(request)
            except Exception:
                call.count_drop()
        return request
    return _build_request


def stream_hook(original: Callable, is_async: bool) -> Callable:
    """Wrap `Stream.__stream__` / `AsyncStream.__stream__` (a generator function)."""
    @functools.wraps(original)
    def __stream__(self: Any) -> Any:
        inner = original(self)
        try:
            call = httpx_trace.tracked_of(getattr(self, "response", None), SdkCall)
            if call is None:
                call = _CURRENT.get()
            if call is not None and call.claim():
                gen = async_tokens(inner, call) if is_async else stamped(inner, call)
                call.gen = weakref.ref(gen)
                return gen
        except Exception:
            runtime.count_drop()
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


