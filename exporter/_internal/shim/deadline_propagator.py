"""`DeadlinePropagator`: the deadline in force as an OpenTelemetry propagator.

It sends `ttft-deadline-ms` with any call OpenTelemetry instruments, and reads it back where
OpenTelemetry's server instrumentation extracts the context (deadline.py says what the header
means). Apart from deadline.py, which every call reads, because it needs OpenTelemetry's API:
only an app that names it (`OTEL_PROPAGATORS=...,ttft_deadline`, or
`exporter.integrations.DeadlinePropagator()`) loads it.
"""

from __future__ import annotations

import functools
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import (CarrierT, Getter, Setter, TextMapPropagator,
                                               default_getter, default_setter)

from . import deadline
from .deadline import HEADER, header_value, parse

#: Where `extract` leaves an inbound deadline in an OpenTelemetry context.
_OTEL_KEY = otel_context.create_key("ttft-exporter-deadline")


class DeadlinePropagator(TextMapPropagator):
    """OpenTelemetry propagator of the `ttft-deadline-ms` header (inject and extract)."""

    def extract(self, carrier: CarrierT, context: Any = None,
                getter: Getter[CarrierT] = default_getter) -> Any:
        base = context if context is not None else otel_context.get_current()
        try:
            values = getter.get(carrier, HEADER)
            found = parse(values[0]) if values else None
        except Exception:
            found = None
        if found is None:
            return base
        if deadline.inbound[0] is None:  # from now on `deadline.current()` looks there too
            deadline.inbound[0] = functools.partial(otel_context.get_value, _OTEL_KEY)
        return otel_context.set_value(_OTEL_KEY, found, base)

    def inject(self, carrier: CarrierT, context: Any = None,
               setter: Setter[CarrierT] = default_setter) -> None:
        found = deadline.own()
        if found is None:
            carried = otel_context.get_value(_OTEL_KEY, context)
            found = carried if carried.__class__ is int else None
        if found is not None:
            setter.set(carrier, HEADER, header_value(found))

    @property
    def fields(self) -> set[str]:
        return {HEADER}
