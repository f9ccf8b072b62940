"""A series' debut: a scraper sees every new series at zero first.

Prometheus's `rate()` and `increase()` count what a counter gained between two samples, so the
value a series first appears with is never counted: the first call of every new (model, route,
tenant) is missing from every rate, dashboard and rule. They are not a random sample: a tenant's
first call has no prompt cache yet, so it is among the slowest (on the demo's first 40 s, a
third of the calls and half of deepseek-r1's summary TTFT were missing). The cure Prometheus
recommends is a series that exists at zero before its first event; an exporter cannot know a
tenant before its first call, so it shows the series at zero to the first scrape after its
birth and the real value from the next scrape on (a scrape interval later, nothing lost).

Only scrapers take part: a request with the header Prometheus (and every scraper built on its
code) sends on each scrape. A person's `curl` sees the real values and does not use up a debut.
Series present when the renderer is built (an aggregator's state restored from its snapshot)
continue where they were: a zero would read as a counter reset and count them twice.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from ..record.series import Series
from ..record.store import Store

#: Sent by Prometheus (and scrapers on its code: Grafana Agent/Alloy, the OpenTelemetry
#: Collector's prometheus receiver, vmagent) with every scrape.
SCRAPER_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"

#: A counter row: (sample name, label values).
_Row = tuple[str, tuple[str, ...]]


class Debuts:
    """The series and counter rows born since the renderer was built and not yet shown to a
    scraper. Not thread-safe: the renderer's lock covers every call."""

    def __init__(self, recorder: Store, counters: list[Metric]):
        self._known: set[Series] | None = set(recorder.all_series())
        self._unserved: set[Series] = set()
        self._served_rows: set[_Row] = {_row(sample) for family in counters
                                        if family.type == "counter"
                                        for sample in family.samples}

    def born(self, series: Series) -> None:
        """`series` is rendered for the first time: it debuts unless it predates the renderer."""
        known = self._known
        if known is not None and series in known:
            known.discard(series)
            if not known:
                self._known = None
            return
        self._unserved.add(series)

    def take(self, series_list: list[Series]) -> set[Series]:
        """Those of `series_list` no scraper has seen: this scrape shows them at zero (once)."""
        unserved = self._unserved
        if not unserved:
            return set()
        debut = unserved.intersection(series_list)
        unserved -= debut
        return debut

    def zero_new_rows(self, families: list[Metric]) -> None:
        """Show the counter rows this scrape sees for the first time at zero (in place).

        The recorder's counter rows are never removed, so as many rows as were served means
        none is new: a scrape without new rows costs a count per family, not a lookup per row.
        """
        served = self._served_rows
        counters = [family for family in families if family.type == "counter"]
        if sum(len(family.samples) for family in counters) == len(served):
            return
        for family in counters:
            samples = family.samples
            for i, sample in enumerate(samples):
                row = _row(sample)
                if row not in served:
                    served.add(row)
                    samples[i] = sample._replace(value=0.0)


def _row(sample: object) -> _Row:
    return sample.name, tuple(sample.labels.values())  # type: ignore[attr-defined]
