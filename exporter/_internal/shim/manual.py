"""`exporter.track()`: the manual API, for any client the SDK patches do not cover.

`Call` is the one object of a measured call, whichever way it is measured: `track()` hands it
to the caller, and the SDK patch's `SdkCall` (sdk_call.py) extends it. The per-token path is a
`perf_counter_ns()` stamp appended to a list; everything else happens once, when the call
finishes. Nothing here raises into the caller: a failure inside the exporter is a counted drop
(`ttft_exporter_dropped_total{reason="internal_error"}`), and an exception from the caller's
block passes through untouched (it only sets the outcome).
"""

from __future__ import annotations

from time import perf_counter_ns
from types import TracebackType
from typing import Any, MutableMapping

from .. import names, runtime
from ..record.outcome import outcome_of
from ..record.timeline import derive, new_timeline
from . import context, deadline, otel
from .task import _TASK, Task

_GENAI_METRICS = otel.GenAIMetrics()


class Call:
    """One tracked call. Methods are cheap and safe to call in any order, any number of times."""

    __slots__ = ("timeline", "span", "span_attributes", "genai_provider", "requested_model",
                 "task", "_state", "_in_flight", "_finished", "_attributes")

    def __init__(self, model: str, provider: str, route: str | None, tenant: str | None,
                 start: int | None = None, genai_provider: str | None = None):
        labels = context._current.get()  # (context.current(), without the call)
        #: `gen_ai.provider.name` (the SDK patch passes a well-known value or the SDK's API).
        self.genai_provider = genai_provider or provider
        self.requested_model = model
        if route is None:
            route = labels.get("route", names.UNKNOWN)
        self.timeline = new_timeline(perf_counter_ns() if start is None else start, model,
                                     provider, route,
                                     tenant if tenant is not None else labels.get("tenant", ""))
        self._state = state = runtime.state()
        self._in_flight = state.recorder.started(model, provider, route)
        self._finished = False
        #: The agent task this call is a step of (shim/task.py), if any.
        self.task: Task | None = _TASK.get()
        #: Extra attributes a client knows (server.address and .port, gen_ai.request.stream,
        #: gen_ai.response.id and .finish_reasons).
        self.span_attributes: dict[str, Any] = {}
        #: The call's OpenTelemetry span (when the app traces); its trace id is the exemplar.
        self.span: otel.CallSpan | None = None
        if state.config.otel.traces and otel.tracing():
            try:
                self.span = otel.CallSpan(self.timeline, provider=self.genai_provider)
            except Exception:  # the app's tracer provider failed: measure without a span
                self.count_drop()
        #: Whether anything reads `span_attributes` (the span, the GenAI metrics): when not,
        #: the per-call work of filling them is skipped.
        self._attributes = self.span is not None or state.config.otel.metrics

    def activate(self) -> object | None:
        """Make the call's span current while the client sends it (an SDK's own spans nest)."""
        return self.span.activate() if self.span is not None else None

    def deactivate(self, token: object | None) -> None:
        if self.span is not None:
            self.span.deactivate(token)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add the call's trace context (`traceparent`) and the deadline in force
        (`ttft-deadline-ms`, deadline.py) to an outgoing request's headers."""
        if not self._state.config.otel.propagate:
            return
        if self.span is not None:
            self.span.inject(headers)
        found = deadline.current()
        if found is not None:
            headers[deadline.HEADER] = deadline.header_value(found)

    def dispatched(self) -> None:
        """The request left client-side queueing (pool wait, semaphore) for the connection."""
        self.timeline.dispatched = perf_counter_ns()

    def connected(self) -> None:
        """DNS, TCP and TLS are done (call right after `dispatched()` on a reused connection)."""
        self.timeline.connected = perf_counter_ns()

    def sent(self) -> None:
        """The request body is written."""
        self.timeline.sent = perf_counter_ns()

    def headers(self) -> None:
        """The response headers are read."""
        self.timeline.headers = perf_counter_ns()

    def retried(self, cause: BaseException | int | None = None) -> None:
        """The attempt in flight failed and the client starts another one now (after its
        backoff): `cause` is the HTTP status the failed attempt answered, or the exception that
        ended it. The time so far is the call's `retry` phase; the new attempt's stamps
        (`dispatched()` ...) start afresh, and its `queue` phase from now."""
        t = self.timeline
        t.attempt_start = perf_counter_ns()
        t.dispatched = t.connected = t.sent = t.headers = t.round_trip = None
        t.upstream_address = t.upstream_region = None  # the next attempt's connection says
        reason = retry_reason(cause)
        retries = t.retries
        if retries is None:
            t.retries = retries = {}
        retries[reason] = retries.get(reason, 0) + 1
        if self._attributes:
            self.span_attributes[names.ATTR_RESEND_COUNT] = sum(retries.values())

    def token(self, kind: str = names.CONTENT) -> None:
        """One token event: output text (`content`), `reasoning` text, or `tool` arguments.

        Any kind other than `reasoning` counts as an answer token.
        """
        self.timeline.token(perf_counter_ns(), kind)

    def usage(self, input: int | None = None, output: int | None = None,
              cached: int | None = None, model: str | None = None,
              reasoning: int | None = None, finish_reason: str | None = None) -> None:
        """Token counts from the provider's usage (`reasoning`: the output tokens spent on
        reasoning), the response model when it differs, and the provider's stop reason
        (`stop`, `length`, `end_turn`, `max_tokens`, ...; as `response(finish_reason=...)`)."""
        t = self.timeline
        # Each value: an int (not a bool), not negative. Written out: once per call.
        if (input.__class__ is int or isinstance(input, int) and input.__class__ is not bool) \
                and input >= 0:  # type: ignore[operator]
            t.input_tokens = input
        if (output.__class__ is int or isinstance(output, int) and output.__class__ is not bool
                ) and output >= 0:  # type: ignore[operator]
            t.output_tokens = output
        if (cached.__class__ is int or isinstance(cached, int) and cached.__class__ is not bool
                ) and cached >= 0:  # type: ignore[operator]
            t.cached_input_tokens = cached
        if (reasoning.__class__ is int or isinstance(reasoning, int)
                and reasoning.__class__ is not bool) and reasoning >= 0:  # type: ignore[operator]
            t.reasoning_output_tokens = reasoning
        if model:
            t.model = model
        if finish_reason is not None:
            self.response(finish_reason=finish_reason)

    def max_tokens(self, limit: int) -> None:
        """The request's max_tokens, for the headroom metrics (the SDK patch reads it)."""
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            self.timeline.max_tokens = limit

    def upstream(self, address: str | None = None, region: str | None = None,
                 fingerprint: str | None = None) -> None:
        """Which upstream answered: the resolved "address:port", the region it names, the
        response's system fingerprint (a change of any of them is a route change)."""
        t = self.timeline
        for attr, value in (("upstream_address", address), ("upstream_region", region),
                            ("fingerprint", fingerprint)):
            if isinstance(value, str) and value:
                setattr(t, attr, value)

    def server_timing(self, queue_ms: float | None = None, prefill_ms: float | None = None
                      ) -> None:
        """The server's own account of its time before the first token, in milliseconds as
        engines report it: how long the request waited in its queue, and its time from
        scheduling (or from starting on the prompt) to the first token (vLLM's per-request
        `metrics`, llama.cpp's `timings`). Each a finite number, not negative."""
        t = self.timeline
        for attr, value in (("server_queue", queue_ms), ("server_prefill", prefill_ms)):
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and 0 <= value < 1e12:  # (NaN fails both; a year is ~3e10 ms)
                setattr(t, attr, round(value * 1_000_000))

    def response(self, id: str | None = None, finish_reason: str | None = None) -> None:
        """The response's id and (once per choice) why the model stopped, for the span; the
        first choice's reason is the call's (the finish-reason counter, truncation rate)."""
        if isinstance(id, str) and id and self._attributes:
            self.span_attributes[names.ATTR_RESPONSE_ID] = id
        if isinstance(finish_reason, str) and finish_reason:
            if self.timeline.finish_reason is None:
                self.timeline.finish_reason = finish_reason
            if not self._attributes:
                return  # no span, no GenAI metrics: nothing reads the attributes
            reasons = self.span_attributes.setdefault(names.ATTR_FINISH_REASONS, [])
            if len(reasons) < 16:
                reasons.append(finish_reason)

    def abandon(self) -> None:
        """The caller stopped reading before the end of the response."""
        if self.timeline.outcome is None:
            self.timeline.outcome = names.ABANDONED

    def finish(self, exc: BaseException | None = None, *, end: int | None = None) -> None:
        """End the call once (later calls do nothing): stamp `end` (now, or the given stamp),
        classify the outcome, record. Never raises."""
        if self._finished:
            return
        self._finished = True
        t = self.timeline
        derived = None
        try:
            t.end = perf_counter_ns() if end is None else end
            if exc is not None:
                t.outcome = outcome_of(exc)
            elif t.outcome is None:
                t.outcome = names.OK  # (outcome_of(None), without the call)
            derived = derive(t)
            if self.span is not None:
                self.span.finish(t, derived, exc, self.span_attributes)
            if self._state.config.otel.metrics:
                _GENAI_METRICS.record(t, derived, self.genai_provider, self.requested_model,
                                      self.span_attributes)
            if self.task is not None:
                self.task.add_step(t, derived)
        except Exception:
            self.count_drop()
        finally:
            self._state.recorder.record_call(t, self._in_flight, derived)

    def count_drop(self) -> None:
        """One internal failure while measuring this call: counted, never raised."""
        self._state.recorder.count_drop(names.DROP_INTERNAL)


#: The HTTP statuses a retry reason names apart (any other 5xx is a `server_error`).
_RETRY_STATUSES = {429: names.RETRY_RATE_LIMITED, 503: names.RETRY_OVERLOADED,
                   529: names.RETRY_OVERLOADED, 408: names.RETRY_TIMEOUT}


def retry_reason(cause: BaseException | int | None) -> str:
    """What ended a retried attempt, as one of `names.RETRY_REASONS`: the HTTP status it
    answered (given, or carried by the SDK's status error), else the exception's class
    (a timeout, a connection that failed or broke), else `other`."""
    status = cause
    if isinstance(cause, BaseException):  # the SDKs' `status_code`, aiohttp's `status`
        status = getattr(cause, "status_code", None) or getattr(cause, "status", None)
        if not isinstance(status, int):
            kind = outcome_of(cause)
            if kind == names.TIMEOUT:
                return names.RETRY_TIMEOUT
            return names.RETRY_CONNECTION if kind == names.CONNECTION_ERROR else \
                names.RETRY_OTHER
    if not isinstance(status, int) or isinstance(status, bool):
        return names.RETRY_OTHER
    reason = _RETRY_STATUSES.get(status)
    if reason is not None:
        return reason
    return names.RETRY_SERVER_ERROR if 500 <= status <= 599 else names.RETRY_OTHER


class track:
    """Context manager (sync and async) that measures one call: `with track(model=...) as call`."""

    __slots__ = ("_args", "_call")

    def __init__(self, model: str, provider: str = names.UNKNOWN, *, route: str | None = None,
                 tenant: str | None = None):
        self._args = (model, provider, route, tenant)
        self._call: Call | None = None

    def __enter__(self) -> Call:
        self._call = Call(*self._args)
        return self._call

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._call is not None:
            self._call.finish(exc)

    async def __aenter__(self) -> Call:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)
