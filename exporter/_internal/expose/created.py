"""Created timestamps: when each counter row and histogram series started from zero.

Served as OpenMetrics `_created` lines and protobuf `created_timestamp` (not in the 0.0.4 text
format, which has no such thing). Prometheus 2.50+ with
`--enable-feature=created-timestamp-zero-ingestion` (3.x: start timestamps) stores a zero at
that time before a new series' first sample, so `rate()` counts its first value in every
replica, without the debut (debut.py); older versions ignore them.

A created timestamp must be at or before the series' real birth and before the sample time of
the first scrape that shows it, and never change. The store keeps no series' birth time, so the
renderer gives a series it sees for the first time the Unix time at which the previous render
started reading the state (for the first render, the renderer's build, or the recorder's
creation, `Store.born`, for a renderer built `at_birth`): the series was absent from that read,
so it was born after it. Series and rows present when the renderer is built have none (an
aggregator's restored state: a later time than their real birth would make Prometheus count
them again), except counter rows still at zero then (they were zero then).
Window summaries carry none.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from .debut import row_key

#: A counter row: (sample name, label values).
_Row = tuple[str, tuple[str, ...]]


class CreatedTimes:
    """The read times renders start at, and each counter row's created timestamp. Not
    thread-safe: the renderer's lock covers every call."""

    def __init__(self, counters: list[Metric], now: float):
        #: When the latest render (or the build) started reading the state.
        self.last_read = now
        #: When the render before the current one started reading: what the current one sees
        #: for the first time was born after it.
        self.previous_read = now
        self._rows: dict[_Row, float | None] = {
            row_key(sample): (now if sample.value == 0 else None)
            for family in counters if family.type == "counter" for sample in family.samples}

    def reading(self, now: float) -> None:
        """A render starts reading the state at `now` (Unix time)."""
        self.previous_read, self.last_read = self.last_read, now

    def forget(self, counters: list[Metric]) -> None:
        """Only these counter rows exist now (the others' labels expired): one that comes back
        is dated again."""
        current = {row_key(sample) for family in counters if family.type == "counter"
                   for sample in family.samples}
        self._rows = {row: at for row, at in self._rows.items() if row in current}

    def note_rows(self, families: list[Metric]) -> None:
        """Date the counter rows seen for the first time (rows are removed only by label
        expiry, which `forget`s them here first: as many rows as dated means none is new, a
        count per family)."""
        rows = self._rows
        counters = [family for family in families if family.type == "counter"]
        if sum(len(family.samples) for family in counters) == len(rows):
            return
        for family in counters:
            for sample in family.samples:
                rows.setdefault(row_key(sample), self.previous_read)

    def with_created(self, families: list[Metric]) -> None:
        """Add each counter row's `_created` sample after its value (in place; dated rows)."""
        rows = self._rows
        for family in families:
            if family.type != "counter":
                continue
            name = family.name + "_created"
            samples = []
            for sample in family.samples:
                samples.append(sample)
                created = rows.get(row_key(sample))
                if created is not None:
                    samples.append(sample._replace(name=name, value=created))
            family.samples = samples
