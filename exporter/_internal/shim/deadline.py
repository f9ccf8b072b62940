"""Deadlines across calls and services: the deadline in force, its header, its propagator.

One ContextVar holds the deadline in force here (a `perf_counter_ns()` stamp): a task with a
deadline sets it (the earlier of its own and the one already in force) and an inbound request
that brought one sets it (middleware.py). `remaining()` reads it.

Between services the deadline travels as the header `ttft-deadline-ms`: the whole milliseconds
left, relative (as gRPC's `grpc-timeout`) so the two clocks need not agree. The transit time is
not subtracted, so a downstream deadline is late by one network hop. SDK calls made in a task
with a deadline send it next to their `traceparent` (manual.py); other outbound calls get it
from `DeadlinePropagator`, an OpenTelemetry propagator (`OTEL_PROPAGATORS=tracecontext,baggage,
ttft_deadline`, or `exporter.integrations.DeadlinePropagator()` in a composite propagator),
which also reads it back where OpenTelemetry's server instrumentation extracts the context.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from time import perf_counter_ns
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import (CarrierT, Getter, Setter, TextMapPropagator,
                                               default_getter, default_setter)

from .. import names

HEADER = names.DEADLINE_HEADER
#: A header value above this (a day) is not a deadline anyone meant: ignored.
MAX_MS = 86_400_000
_NS_PER_MS = 1_000_000

_DEADLINE: ContextVar[int | None] = ContextVar("ttft_exporter_deadline", default=None)
#: Where DeadlinePropagator.extract leaves an inbound deadline in an OpenTelemetry context.
_OTEL_KEY = otel_context.create_key("ttft-exporter-deadline")


#: Set once `DeadlinePropagator.extract` put a deadline in an OpenTelemetry context (the only
#: writer of `_OTEL_KEY`): until then no context holds one, and `current()` skips looking.
_extracted = [False]


def current() -> int | None:
    """The deadline in force here (perf_counter_ns), or None."""
    found = _DEADLINE.get()
    if found is None:
        if not _extracted[0]:
            return None  # (OpenTelemetry's context lookup is three Python calls)
        found = otel_context.get_value(_OTEL_KEY)
    return found if found.__class__ is int else None


def remaining() -> float | None:
    """Seconds left before the deadline in force (0.0 once it passed), or None without one."""
    deadline = current()
    if deadline is None:
        return None
    return max(0, deadline - perf_counter_ns()) / 1e9


def enter(deadline: int | None) -> Token[int | None]:
    """Put the earlier of `deadline` and the one in force in force; `leave()` undoes it."""
    now = current()
    if deadline is None or (now is not None and now < deadline):
        deadline = now
    return _DEADLINE.set(deadline)


def leave(token: Token[int | None] | None) -> None:
    if token is not None:
        try:
            _DEADLINE.reset(token)
        except ValueError:  # left in another context (a generator moved threads)
            pass


def parse(value: Any) -> int | None:
    """A `ttft-deadline-ms` header value as a local deadline stamp; None when malformed."""
    try:
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        ms = int(text.strip())
    except Exception:
        return None
    if not 0 <= ms <= MAX_MS:
        return None
    return perf_counter_ns() + ms * _NS_PER_MS


def header_value(deadline: int) -> str:
    """The header value for `deadline`: whole milliseconds left, 0 once it passed."""
    return str(max(0, deadline - perf_counter_ns()) // _NS_PER_MS)


class DeadlinePropagator(TextMapPropagator):
    """OpenTelemetry propagator of the `ttft-deadline-ms` header (inject and extract)."""

    def extract(self, carrier: CarrierT, context: Any = None,
                getter: Getter[CarrierT] = default_getter) -> Any:
        base = context if context is not None else otel_context.get_current()
        try:
            values = getter.get(carrier, HEADER)
            deadline = parse(values[0]) if values else None
        except Exception:
            deadline = None
        if deadline is None:
            return base
        _extracted[0] = True
        return otel_context.set_value(_OTEL_KEY, deadline, base)

    def inject(self, carrier: CarrierT, context: Any = None,
               setter: Setter[CarrierT] = default_setter) -> None:
        deadline = _DEADLINE.get()
        if deadline is None:
            found = otel_context.get_value(_OTEL_KEY, context)
            deadline = found if found.__class__ is int else None
        if deadline is not None:
            setter.set(carrier, HEADER, header_value(deadline))

    @property
    def fields(self) -> set[str]:
        return {HEADER}
