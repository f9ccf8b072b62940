"""OpenTelemetry: one span per call with phase events, and the GenAI client metrics.

Names, attributes and recording rules follow the OpenTelemetry GenAI semantic conventions
(docs/tracing.md names the text and its commit). The names this project emitted before are
kept beside them only when the app opts in, as OpenTelemetry's instrumentations do: the
comma-separated `OTEL_SEMCONV_STABILITY_OPT_IN` listing `gen_ai/dup` (after `http/dup`, the
old and the new names together), read once when the API loads.

The span starts when the call starts (so its context can travel in the request's
`traceparent` and its trace id can become the exemplar of the call's buckets) and is finished
from the call timeline: the GenAI attributes, this project's route, tenant, outcome and phase
attributes, and one event per phase boundary at its real time (monotonic stamps mapped onto
the wall clock at the call's start). No per-chunk span events.
Time to first chunk exists only for streamed calls; time per output chunk is recorded once per
chunk after the first.

Nothing happens unless the app installed an SDK `TracerProvider` (or `MeterProvider`): the
default no-op providers cost one `isinstance` per call.

OpenTelemetry's API is imported on first need (`_api()`), not with this module: a process that
imported no OpenTelemetry API module and names no provider in its environment has no provider
to record into, and its start-up need not load the API (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from .. import names
from ..record.timeline import CallTimeline, Derived

_SCOPE = "ttft-exporter"
#: Meter providers that record nothing: the no-op one and the API's proxy (its class is private).
_NO_METER_PROVIDER_NAMES = frozenset({"NoOpMeterProvider", "_ProxyMeterProvider"})


#: The conventions' advised bucket boundaries (genai_views replaces the seconds ones with the
#: exporter's SLO-aligned layout).
SECONDS_BOUNDARIES = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                      40.96, 81.92)
TOKEN_BOUNDARIES = tuple(4 ** k for k in range(14))  # 1, 4, 16, ..., 67108864
#: `gen_ai.token.modality` of the legacy token counters: the providers' usage has no breakdown.
MODALITY_UNKNOWN = "unknown"
#: OpenTelemetry's opt-in variable, and the value that keeps the earlier names as well
#: (`gen_ai_latest_experimental`, the instrumentations' opt-in to the current text, is the
#: default here and changes nothing).
OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
OPT_IN_DUP = "gen_ai/dup"


def legacy_names_opted_in(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the app asked for the earlier GenAI names beside the current ones."""
    return OPT_IN_DUP in (value.strip() for value in environ.get(OPT_IN_ENV, "").split(","))

_tracers: dict[int, tuple[Any, Any]] = {}


def _tracer(provider: Any) -> Any:
    """The provider's tracer for this package, made once (`get_tracer` costs ~8 µs)."""
    found = _tracers.get(id(provider))
    if found is None or found[0] is not provider:
        if len(_tracers) > 8:  # providers come and go only in tests
            _tracers.clear()
        found = _tracers[id(provider)] = (provider, provider.get_tracer(_SCOPE))
    return found[1]


#: With no provider set, the API's `get_tracer_provider()` looks its environment variable up in
#: `os.environ` on every call (a KeyError raised and caught inside `os.environ`, ~1 µs).
#: `tracing()` answers that case from the same data: the API's function as imported (not
#: replaced, e.g. by a test), no provider set yet, the variable not in the environment's dict.
_ENVIRON: Any = getattr(os.environ, "_data", None)
try:
    _PROVIDER_ENV_KEY: Any = os.environ.encodekey(  # type: ignore[attr-defined]
        "OTEL_PYTHON_TRACER_PROVIDER")
    _METER_PROVIDER_ENV_KEY: Any = os.environ.encodekey(  # type: ignore[attr-defined]
        "OTEL_PYTHON_METER_PROVIDER")
except Exception:  # pragma: no cover - not CPython's os.environ
    _ENVIRON = None

#: The API's names this module uses, bound as its globals by `_load()` (declared, not bound,
#: until then); read from outside (`otel.trace`: tests patch the API through it) they are
#: loaded by `__getattr__`.
context: Any
metrics: Any
trace: Any
inject: Any
SpanKind: Any
Status: Any
StatusCode: Any
_NO_SPAN_PROVIDERS: tuple[type, ...]
_API_GET_TRACER_PROVIDER: Any
_API_NAMES = frozenset({"context", "metrics", "trace", "inject", "SpanKind", "Status",
                        "StatusCode", "_NO_SPAN_PROVIDERS", "_API_GET_TRACER_PROVIDER"})
_loaded = False
#: The earlier names too (`legacy_names_opted_in()`), decided by `_load()`.
_dup = False


def _api() -> bool:
    """True once the API is loaded here; loads it when the app may have a provider: it imported
    `opentelemetry.trace` or `opentelemetry.metrics` (no provider is set without them), or its
    environment names one. Until then, two dict lookups and two environment lookups."""
    if _loaded:
        return True
    modules = sys.modules
    if "opentelemetry.trace" not in modules and "opentelemetry.metrics" not in modules and (
            _ENVIRON is not None and _PROVIDER_ENV_KEY not in _ENVIRON
            and _METER_PROVIDER_ENV_KEY not in _ENVIRON):
        return False
    _load()
    return True


def _load() -> None:
    global context, metrics, trace, inject, SpanKind, Status, StatusCode, _loaded
    global _NO_SPAN_PROVIDERS, _API_GET_TRACER_PROVIDER, _dup
    from opentelemetry import context, metrics, trace
    from opentelemetry.propagate import inject
    from opentelemetry.trace import SpanKind, Status, StatusCode

    _NO_SPAN_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    _API_GET_TRACER_PROVIDER = trace.get_tracer_provider
    _dup = legacy_names_opted_in()
    _loaded = True


def __getattr__(name: str) -> Any:
    if name in _API_NAMES:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tracing() -> bool:
    """True when the app installed a TracerProvider that records (one isinstance per call)."""
    if not _api():
        return False
    if trace.get_tracer_provider is _API_GET_TRACER_PROVIDER and _ENVIRON is not None \
            and getattr(trace, "_TRACER_PROVIDER", False) is None \
            and _PROVIDER_ENV_KEY not in _ENVIRON:
        return False  # get_tracer_provider() would return the no-op proxy
    return not isinstance(trace.get_tracer_provider(), _NO_SPAN_PROVIDERS)


def recording_span() -> bool:
    """True when the span current in this context records (~0.5 µs: a context lookup)."""
    return _api() and trace.get_current_span().is_recording()


class CallSpan:
    """The span of one call, or nothing when tracing is off. Never raises into the caller."""

    __slots__ = ("span", "_wall_minus_mono")

    def __init__(self, t: CallTimeline, operation: str = "chat", provider: str | None = None):
        """`provider`: the call's `gen_ai.provider.name` (default: its provider label)."""
        self.span: Any = None
        self._wall_minus_mono = 0
        if not _api():
            return
        tracer_provider = trace.get_tracer_provider()
        if isinstance(tracer_provider, _NO_SPAN_PROVIDERS):
            return
        self._wall_minus_mono = time.time_ns() - t.start
        attributes = {names.ATTR_OPERATION: operation,
                      names.ATTR_PROVIDER: provider or t.provider,
                      names.ATTR_REQUEST_MODEL: t.model, names.ATTR_ROUTE: t.route}
        if t.tenant:
            attributes[names.ATTR_TENANT] = t.tenant
        self.span = _tracer(tracer_provider).start_span(
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
        reasons = attrs.get(names.ATTR_FINISH_REASONS)
        if reasons is not None:
            attrs[names.ATTR_FINISH_REASONS] = tuple(reasons)
        for key, value in ((names.ATTR_INPUT_TOKENS, t.input_tokens),
                           (names.ATTR_OUTPUT_TOKENS, t.output_tokens),
                           (names.ATTR_CACHE_READ_TOKENS, t.cached_input_tokens),
                           (names.ATTR_REASONING_TOKENS, t.reasoning_output_tokens)):
            if value is not None:
                attrs[key] = value
        if _dup and names.ATTR_CACHE_WRITE_TOKENS in attrs:
            attrs[names.LEGACY_ATTR_CACHE_CREATION_TOKENS] = attrs[names.ATTR_CACHE_WRITE_TOKENS]
        for key, value in ((names.ATTR_TIME_TO_FIRST_CHUNK,
                            d.ttft if streamed(t, attrs) else None),
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


def streamed(t: CallTimeline, attributes: Mapping[str, Any]) -> bool:
    """Whether the call streamed its answer: chunks were seen, and the request (when known)
    asked for a stream. A non-streamed body has no first chunk of its own."""
    return bool(t.token_times) and attributes.get(names.ATTR_REQUEST_STREAM) is not False


class GenAIMetrics:
    """The GenAI client metrics, through the app's MeterProvider (config `otel.metrics`)."""

    def __init__(self) -> None:
        self._provider: Any = None
        self._instruments: tuple[Any, ...] = ()
        self._legacy: tuple[Any, ...] = ()

    def _ensure(self) -> tuple[Any, ...]:
        if not _api():
            return ()
        provider = metrics.get_meter_provider()
        if provider is not self._provider:
            self._provider = provider
            self._instruments = self._legacy = ()
            if type(provider).__name__ not in _NO_METER_PROVIDER_NAMES:
                meter = provider.get_meter(_SCOPE)

                def seconds(name: str) -> Any:
                    return meter.create_histogram(
                        name, unit="s", explicit_bucket_boundaries_advisory=SECONDS_BOUNDARIES)

                def tokens(name: str) -> Any:
                    return meter.create_histogram(
                        name, unit="{token}",
                        explicit_bucket_boundaries_advisory=TOKEN_BOUNDARIES)

                self._instruments = (
                    seconds(names.OTEL_OPERATION_DURATION),
                    seconds(names.OTEL_TIME_TO_FIRST_CHUNK),
                    seconds(names.OTEL_TIME_PER_OUTPUT_CHUNK),
                    tokens(names.OTEL_TOKEN_USAGE))
                if _dup:
                    self._legacy = (
                        tokens(names.LEGACY_OPERATION_INPUT_TOKENS),
                        tokens(names.LEGACY_OPERATION_OUTPUT_TOKENS),
                        *(meter.create_counter(name, unit="{token}") for name in (
                            names.LEGACY_USAGE_INPUT_TOKENS, names.LEGACY_USAGE_OUTPUT_TOKENS,
                            names.LEGACY_USAGE_CACHE_READ_TOKENS,
                            names.LEGACY_USAGE_REASONING_TOKENS)))
        return self._instruments

    def record(self, t: CallTimeline, d: Derived, provider: str, requested_model: str,
               attributes: Mapping[str, Any], operation: str = "chat") -> None:
        """One finished call: its duration (`error.type` when it failed); for a stream its
        first chunk and each chunk after it; the input and output tokens the provider
        reported (none recorded when it reported none, as the conventions ask)."""
        instruments = self._ensure()
        if not instruments:
            return
        duration, first_chunk, per_chunk, token_usage = instruments
        attrs: dict[str, Any] = {
            names.ATTR_OPERATION: operation, names.ATTR_PROVIDER: provider,
            names.ATTR_REQUEST_MODEL: requested_model, names.ATTR_RESPONSE_MODEL: t.model,
            names.ATTR_ROUTE: t.route}
        for key in (names.ATTR_SERVER_ADDRESS, names.ATTR_SERVER_PORT):
            if key in attributes:
                attrs[key] = attributes[key]
        failed = dict(attrs)
        if t.outcome not in (None, names.OK, names.ABANDONED):
            failed[names.ATTR_ERROR_TYPE] = t.outcome
        if d.duration is not None:
            duration.record(d.duration / 1e6, failed)
        if streamed(t, attributes):
            if d.ttft is not None:
                first_chunk.record(d.ttft / 1e6, attrs)
            for gap in d.gaps:  # each chunk after the first
                per_chunk.record(gap / 1e6, attrs)
        for kind, count in ((names.TOKEN_INPUT, t.input_tokens),
                            (names.TOKEN_OUTPUT, t.output_tokens)):
            if count is not None:
                token_usage.record(count, {**attrs, names.ATTR_TOKEN_TYPE: kind})
        if self._legacy:
            self._record_legacy(t, attrs, failed)

    def _record_legacy(self, t: CallTimeline, attrs: dict[str, Any],
                       failed: dict[str, Any]) -> None:
        """The earlier token metrics (opt-in), recorded as they were: every call, 0 without
        usage; the counters with `gen_ai.token.modality` `unknown`."""
        op_input, op_output, use_input, use_output, use_cached, use_reasoning = self._legacy
        op_input.record(t.input_tokens or 0, failed)
        op_output.record(t.output_tokens or 0, failed)
        usage = {**attrs, names.LEGACY_ATTR_TOKEN_MODALITY: MODALITY_UNKNOWN}
        use_input.add(t.input_tokens or 0, usage)
        use_output.add(t.output_tokens or 0, usage)
        if t.cached_input_tokens is not None:
            use_cached.add(t.cached_input_tokens, usage)
        if t.reasoning_output_tokens is not None:
            use_reasoning.add(t.reasoning_output_tokens, usage)


def genai_views(seconds_buckets: tuple[float, ...]) -> list[Any]:
    """Views giving the GenAI time histograms SLO-aligned buckets.

    The instruments advise the conventions' doubling buckets (…, 0.64, 1.28, 2.56 s): a 1 s or
    2 s SLO threshold falls inside a bucket and its attainment cannot be computed. Pass these
    views to `MeterProvider(views=...)`, with the exporter's own layout
    (`Config().seconds_buckets()`), to replace them.
    """
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    aggregation = ExplicitBucketHistogramAggregation(boundaries=list(seconds_buckets))
    return [View(instrument_name=name, aggregation=aggregation)
            for name in (names.OTEL_OPERATION_DURATION, names.OTEL_TIME_TO_FIRST_CHUNK,
                         names.OTEL_TIME_PER_OUTPUT_CHUNK)]
