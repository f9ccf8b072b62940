"""Deadlines across calls and services: the deadline in force, its header, its propagator.

One ContextVar holds the deadline in force here (a `perf_counter_ns()` stamp): a task with a
deadline sets it (the earlier of its own and the one already in force) and an inbound request
that brought one sets it (middleware.py). `remaining()` reads it.

Between services the deadline travels as the header `ttft-deadline-ms`: the whole milliseconds
left, relative (as gRPC's `grpc-timeout`) so the two clocks need not agree. The transit time is
not subtracted, so a downstream deadline is late by one network hop. SDK calls made in a task
with a deadline send it next to their `traceparent` (manual.py); other outbound calls get it
from `DeadlinePropagator` (deadline_propagator.py), an OpenTelemetry propagator
(`OTEL_PROPAGATORS=tracecontext,baggage,ttft_deadline`, or
`exporter.integrations.DeadlinePropagator()` in a composite propagator), which also reads it
back where OpenTelemetry's server instrumentation extracts the context. It lives apart so that
this module, on every call's path, imports no OpenTelemetry.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from time import perf_counter_ns
from typing import Any, Callable

from .. import names

HEADER = names.DEADLINE_HEADER
#: A header value above this (a day) is not a deadline anyone meant: ignored.
MAX_MS = 86_400_000
_NS_PER_MS = 1_000_000

_DEADLINE: ContextVar[int | None] = ContextVar("ttft_exporter_deadline", default=None)

#: Reads the inbound deadline of OpenTelemetry's current context: set once
#: `DeadlinePropagator.extract` put a deadline in one (the only writer of its key); until then
#: no context holds one, and `current()` skips looking.
inbound: list[Callable[[], Any] | None] = [None]


def current() -> int | None:
    """The deadline in force here (perf_counter_ns), or None."""
    found = _DEADLINE.get()
    if found is None:
        read_inbound = inbound[0]
        if read_inbound is None:
            return None  # (OpenTelemetry's context lookup is three Python calls)
        found = read_inbound()
    return found if found.__class__ is int else None


def own() -> int | None:
    """The deadline this context put in force itself (a task's, an inbound request's), without
    one an OpenTelemetry context carries."""
    return _DEADLINE.get()


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

