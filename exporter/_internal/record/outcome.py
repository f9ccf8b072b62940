"""How a call ended, from the exception that ended it: one of `names.OUTCOMES`.

The classes tell the provider's failures (5xx and 529, timeouts, broken connections) apart
from the caller's own (a 4xx is the request's mistake, a 429 the caller's quota), because only
the provider's spend its error budget (docs/decisions.md). The SDKs are never imported here:
an exception is read by what it carries (`status_code` of openai's and anthropic's
`APIStatusError`, `status` of aiohttp's `ClientResponseError`, the error `type` of an error
event in the stream) and by the names of its classes (`APITimeoutError`,
`APIConnectionError`, httpx's `ConnectError` / `RemoteProtocolError`), so any release of either
SDK, and the HTTP clients under them, are classified the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import names

#: Error `type`s of an error event in a stream (the response's status was 200): Anthropic's
#: (`overloaded_error`, ...) and OpenAI's; an unknown type is the provider's failure.
_EVENT_TYPES = {
    "invalid_request_error": names.CLIENT_ERROR, "authentication_error": names.CLIENT_ERROR,
    "permission_error": names.CLIENT_ERROR, "not_found_error": names.CLIENT_ERROR,
    "request_too_large": names.CLIENT_ERROR, "rate_limit_error": names.RATE_LIMITED,
    "rate_limit_exceeded": names.RATE_LIMITED, "tokens": names.RATE_LIMITED,
    "requests": names.RATE_LIMITED, "timeout_error": names.TIMEOUT,
}
#: Class names (anywhere in an exception's MRO) of a connection that failed or broke: the SDKs'
#: APIConnectionError, httpx/httpx2's transport errors, aiohttp's and the builtin ones.
_CONNECTION_NAMES = frozenset({
    "APIConnectionError", "NetworkError", "ConnectError", "ReadError", "WriteError",
    "CloseError", "RemoteProtocolError", "ProxyError", "ClientConnectionError",
    "ClientPayloadError", "ConnectionError",
})


def outcome_of(exc: BaseException | None) -> str:
    """Classify how a call ended from the exception that ended it (None: it completed)."""
    if exc is None:
        return names.OK
    if isinstance(exc, GeneratorExit):
        return names.ABANDONED
    if isinstance(exc, asyncio.CancelledError):
        return names.CANCELLED
    status = _status(exc)
    if status is not None and status >= 400:
        return outcome_of_status(status)
    if isinstance(exc, TimeoutError):
        return names.TIMEOUT
    mro = [cls.__name__ for cls in type(exc).__mro__]
    # SDK and HTTP-client timeouts do not all derive from TimeoutError (openai.APITimeoutError,
    # httpx/httpx2.TimeoutException); the SDKs' timeout is also a connection error: test first.
    if any("Timeout" in name for name in mro):
        return names.TIMEOUT
    if any(name in _CONNECTION_NAMES for name in mro):
        return names.CONNECTION_ERROR
    if "APIError" in mro:
        # The SDKs' error about what the provider sent: an error event in a 200 stream, or a
        # body that does not parse (APIResponseValidationError). The provider's, unless the
        # event's type says otherwise.
        return _EVENT_TYPES.get(_error_type(exc), names.PROVIDER_ERROR)
    return names.ERROR


def outcome_of_status(status: int) -> str:
    """The outcome of an HTTP error status (400 and up)."""
    if status == 429:
        return names.RATE_LIMITED
    if status == 408:
        return names.TIMEOUT
    if status < 500:
        return names.CLIENT_ERROR
    return names.PROVIDER_ERROR  # 5xx, and Anthropic's 529 "overloaded"


def _status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (SDKs: `status_code`, aiohttp: `status`)."""
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _error_type(exc: BaseException) -> str:
    """The error `type` of the body an SDK error carries (Anthropic: body.error.type; OpenAI:
    `exc.type` or body.type), "" when there is none."""
    body: Any = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("type"), str):
            return str(inner["type"])
        if isinstance(body.get("type"), str) and body["type"] != "error":
            return str(body["type"])
    kind = getattr(exc, "type", None)
    return kind if isinstance(kind, str) else ""
