"""OpenTelemetry: one span per call with phase events, and the GenAI client metrics.

The span starts when the call starts (so its context can travel in the request's
`traceparent` and its trace id can become the exemplar of the call's buckets) and is finished
from the call timeline: the GenAI semantic-convention attributes, this project's route, tenant,
outcome and phase attributes, and one event per phase boundary at its real time (monotonic
stamps mapped onto the wall clock at the call's start). No per-chunk span events.

Nothing happens unless the app installed an SDK `TracerProvider` (or `MeterProvider`): the
default no-op providers cost one `isinstance` per call.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from opentelemetry import context, metrics, trace
from opentelemetry.propagate import inject
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import names
from .timeline import CallTimeline, Derived

_SCOPE = "ttft-exporter"
_NO_SPAN_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
#: Meter providers that record nothing: the no-op one and the API's proxy (its class is private).
_NO_METER_PROVIDER_NAMES = frozenset({"NoOpMeterProvider", "_ProxyMeterProvider"})


_tracers: dict[int, tuple[Any, Any]] = {}


def _tracer(provider: Any) -> Any:
    """The provider's tracer for this package, made once (`get_tracer` costs ~8 µs)."""
    found = _tracers.get(id(provider))
    if found is None or found[0] is not provider:
        if len(_tracers) > 8:  # providers come and go only in tests
            _tracers.clear()
        found = _tracers[id(provider)] = (provider, provider.get_tracer(_SCOPE))
    return found[1]


def tracing() -> bool:
    """True when the app installed a TracerProvider that records (one isinstance per call)."""
    return not isinstance(trace.get_tracer_provider(), _NO_SPAN_PROVIDERS)


class CallSpan:
    """The span of one call, or nothing when tracing is off. Never raises into the caller."""

    __slots__ = ("span", "_wall_minus_mono")

    def __init__(self, t: CallTimeline, operation: str = "chat"):
        self.span: Any = None
        self._wall_minus_mono = 0
        provider = trace.get_tracer_provider()
        if isinstance(provider, _NO_SPAN_PROVIDERS):
            return
        self._wall_minus_mono = time.time_ns() - t.start
        attributes = {names.ATTR_OPERATION: operation, names.ATTR_PROVIDER: t.provider,
                      names.ATTR_REQUEST_MODEL: t.model, names.ATTR_ROUTE: t.route}
        if t.tenant:
            attributes[names.ATTR_TENANT] = t.tenant
        self.span = _tracer(provider).start_span(
            f"{operation} {t.model}", kind=SpanKind.CLIENT, attributes=attributes,
            start_time=t.start + self._wall_minus_mono)
        context = self.span.get_span_context()
        if context.is_valid and context.trace_flags.sampled:
            t.trace_id = format(context.trace_id, "032x")

    def activate(self) -> object | None:
        """Make this span the current one (returns the token for `deactivate`)."""
        if self.span is None:
            return None
        return context.attach(trace.set_span_in_context(self.span))

    def deactivate(self, token: object | None) -> None:
        if token is not None:
            try:
                context.detach(token)  # type: ignore[arg-type]
            except Exception:  # detached in another context: OTel logs it; never raise
                pass

    def inject(self, headers: Any) -> None:
        """Write `traceparent` (and the app's other propagators' headers) into `headers`."""
        if self.span is not None:
            inject(headers, context=trace.set_span_in_context(self.span))

    def finish(self, t: CallTimeline, d: Derived, exc: BaseException | None,
               attributes: Mapping[str, Any] | None = None) -> None:
        """Set what the call revealed, add the phase-boundary events, end at `t.end`."""
        span = self.span
        if span is None:
            return
        shift = self._wall_minus_mono
        attrs: dict[str, Any] = {names.ATTR_RESPONSE_MODEL: t.model,
                                 names.ATTR_OUTCOME: t.outcome or names.OK}
        if attributes:
            attrs.update(attributes)
        for key, value in ((names.ATTR_INPUT_TOKENS, t.input_tokens),
                           (names.ATTR_OUTPUT_TOKENS, t.output_tokens),
                           (names.ATTR_CACHE_READ_TOKENS, t.cached_input_tokens)):
            if value is not None:
                attrs[key] = value
        for key, value in ((names.ATTR_TIME_TO_FIRST_CHUNK, d.ttft),
                           (names.ATTR_TIME_TO_FIRST_ANSWER, d.first_answer),
                           (names.ATTR_STALL, d.stall)):
            if value is not None:
                attrs[key] = value / 1e6
        for phase, value in d.phases.items():
            attrs[names.ATTR_PHASE_PREFIX + phase] = value / 1e6
        if t.outcome not in (None, names.OK, names.ABANDONED):
            attrs[names.ATTR_ERROR_TYPE] = type(exc).__qualname__ if exc is not None \
                else t.outcome
            span.set_status(Status(StatusCode.ERROR))
        span.set_attributes(attrs)
        stamps = (t.dispatched, t.connected, t.sent, t.headers, t.first_token,
                  t.first_answer_token, t.last_token)
        for name, stamp in zip(names.SPAN_EVENTS, stamps):
            if stamp is not None:
                span.add_event(name, timestamp=stamp + shift)
        span.end(end_time=(t.end if t.end is not None else time.perf_counter_ns()) + shift)


class TaskSpan:
    """The span of an agent task or of one of its tool or guardrail blocks (INTERNAL spans).

    Made current while its block runs, so the spans of the LLM calls, tools and guardrails
    inside it are its children. Created only when the app traces; never raises.
    """

    __slots__ = ("span", "_token")

    def __init__(self, operation: str, name: str, attributes: dict[str, Any]):
        self._token: object | None = None
        self.span: Any = _tracer(trace.get_tracer_provider()).start_span(
            f"{operation} {name}", kind=SpanKind.INTERNAL,
            attributes={names.ATTR_OPERATION: operation, **attributes})
        self._token = context.attach(trace.set_span_in_context(self.span))

    def end(self, exc: BaseException | None, attributes: Mapping[str, Any] | None = None,
            end_ns: int | None = None) -> None:
        """Leave the span's context and end it (ERROR with the exception's class, if any)."""
        token, self._token = self._token, None
        if token is not None:
            try:
                context.detach(token)  # type: ignore[arg-type]
            except Exception:  # detached in another context: OTel logs it; never raise
                pass
        span = self.span
        if attributes:
            span.set_attributes(attributes)
        if exc is not None:
            span.set_attribute(names.ATTR_ERROR_TYPE, type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end_ns)


class GenAIMetrics:
    """The GenAI client metrics, through the app's MeterProvider (config `otel.metrics`)."""

    def __init__(self) -> None:
        self._provider: Any = None
        self._instruments: tuple[Any, ...] = ()

    def _ensure(self) -> tuple[Any, ...]:
        provider = metrics.get_meter_provider()
        if provider is not self._provider:
            self._provider = provider
            if type(provider).__name__ in _NO_METER_PROVIDER_NAMES:
                self._instruments = ()
            else:
                meter = provider.get_meter(_SCOPE)
                self._instruments = (
                    meter.create_histogram(names.OTEL_OPERATION_DURATION, unit="s"),
                    meter.create_histogram(names.OTEL_TIME_TO_FIRST_CHUNK, unit="s"),
                    meter.create_histogram(names.OTEL_TIME_PER_OUTPUT_CHUNK, unit="s"),
                    meter.create_histogram(names.OTEL_TOKEN_USAGE, unit="{token}"))
        return self._instruments

    def record(self, t: CallTimeline, d: Derived, operation: str = "chat") -> None:
        instruments = self._ensure()
        if not instruments:
            return
        duration, first_chunk, per_chunk, usage = instruments
        attrs = {names.ATTR_OPERATION: operation, names.ATTR_PROVIDER: t.provider,
                 names.ATTR_REQUEST_MODEL: t.model, names.ATTR_ROUTE: t.route}
        if t.outcome not in (None, names.OK, names.ABANDONED):
            attrs[names.ATTR_ERROR_TYPE] = t.outcome
        if d.duration is not None:
            duration.record(d.duration / 1e6, attrs)
        if d.ttft is not None:
            first_chunk.record(d.ttft / 1e6, attrs)
        if d.tpot is not None:
            per_chunk.record(d.tpot / 1e6, attrs)
        for kind, value in (("input", t.input_tokens), ("output", t.output_tokens)):
            if value is not None:
                usage.record(value, {**attrs, names.ATTR_TOKEN_TYPE: kind})


def genai_views(seconds_buckets: tuple[float, ...]) -> list[Any]:
    """Views giving the GenAI time histograms SLO-aligned buckets.

    The semantic conventions advise doubling buckets (…, 0.64, 1.28, 2.56 s): a 1 s or 2 s SLO
    threshold falls inside a bucket and its attainment cannot be computed. Pass these views to
    `MeterProvider(views=...)`, with the exporter's own layout (`Config().seconds_buckets()`).
    """
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    aggregation = ExplicitBucketHistogramAggregation(boundaries=list(seconds_buckets))
    return [View(instrument_name=name, aggregation=aggregation)
            for name in (names.OTEL_OPERATION_DURATION, names.OTEL_TIME_TO_FIRST_CHUNK,
                         names.OTEL_TIME_PER_OUTPUT_CHUNK)]
