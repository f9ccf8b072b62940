"""A series' debut: each scraper sees every new series at zero first, and the debut is used up
only once that scraper got the body.

Prometheus's `rate()` and `increase()` count what a counter gained between two samples, so the
value a series first appears with is never counted: the first call of every new (model, route,
tenant) is missing from every rate, dashboard and rule. They are not a random sample: a tenant's
first call has no prompt cache yet, so it is among the slowest (on the demo's first 40 s, a
third of the calls and half of deepseek-r1's summary TTFT were missing). The cure Prometheus
recommends is a series that exists at zero before its first event; an exporter cannot know a
tenant before its first call, so it shows the series at zero to a scraper's first scrape after
its birth and the real value from that scraper's next scrape on (a scrape interval later,
nothing lost). Prometheus 2.50+ can do without it (created timestamps, docs/metrics.md).

Only scrapers take part: a request with the header Prometheus (and every scraper built on its
code) sends on each scrape. A person's `curl` sees the real values and uses up nothing. A
scraper is its address, and the `scraper` query parameter when it sends one (`params:` in a
scrape config: Prometheus replicas behind one address). Every series and counter row gets a
birth number when first rendered; each scraper has a watermark, the birth number of the last
body delivered to it (`delivered`, called by the server once the body is written): a body
shows at zero what was born after its scraper's watermark. A scrape that fails after
rendering, or a protobuf render that falls back to text, moves no watermark.

Series present when the renderer is built (an aggregator's state restored from its snapshot)
continue where they were: a zero would read as a counter reset and count them twice. A process's
own renderer, built at its first scrape, starts as of its recorder's creation instead (text.py,
`at_birth`): what the process recorded before that scrape debuts like the rest. A scraper
first seen after another one got a body starts at the highest watermark: it sees at zero only
what is born from then on (a series born earlier counts from its second value there, as
without a debut; a late replica would otherwise count every series' whole history at once).
At most MAX_SCRAPERS scrapers are remembered, the least recently seen forgotten first.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Iterable, NamedTuple

from prometheus_client.core import Metric

from ..record.series import Series

#: Sent by Prometheus (and scrapers on its code: Grafana Agent/Alloy, the OpenTelemetry
#: Collector's prometheus receiver, vmagent) with every scrape.
SCRAPER_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
#: Scrapers remembered (an HA pair, a few agents; a forgotten one starts afresh).
MAX_SCRAPERS = 16

#: The watermark of a request that is no scrape: it sees every value as it is.
SEEN_ALL = sys.maxsize

#: A counter row: (sample name, label values).
_Row = tuple[str, tuple[str, ...]]


class Delivery(NamedTuple):
    """What one body showed its scraper: everything born up to `births`."""

    scraper: str
    births: int


class Debuts:
    """Birth numbers and the scrapers' watermarks. Not thread-safe: the renderer's lock covers
    every call."""

    def __init__(self, known: Iterable[Series], counters: list[Metric]):
        """`known`: the series present at the start, and `counters` the counter rows (both
        continue where they are)."""
        self.births = 0
        self._known: set[Series] | None = set(known)
        self._rows: dict[_Row, int] = {row_key(sample): 0 for family in counters
                                       if family.type == "counter"
                                       for sample in family.samples}
        self._watermarks: OrderedDict[str, int] = OrderedDict()
        self._highest = 0

    def born(self, series: Series) -> int:
        """`series` is rendered for the first time: its birth number (0 when it predates the
        renderer: it never debuts)."""
        known = self._known
        if known is not None and series in known:
            known.discard(series)
            if not known:
                self._known = None
            return 0
        self.births += 1
        return self.births

    def forget(self, series: set[Series], counters: list[Metric]) -> None:
        """Only these series and counter rows exist now (the others' labels expired): one that
        comes back is born again."""
        if self._known is not None:
            self._known &= series
        current = {row_key(sample) for family in counters if family.type == "counter"
                   for sample in family.samples}
        self._rows = {row: born for row, born in self._rows.items() if row in current}

    def watermark(self, scraper: str) -> int:
        """What `scraper` got already; a new one starts at the highest watermark any scraper
        ever had (0 before any delivery), so a forgotten one that comes back never sees at zero
        what it saw with its value (a counter reset to Prometheus)."""
        marks = self._watermarks
        mark = marks.get(scraper)
        if mark is None:
            mark = marks[scraper] = self._highest
            if len(marks) > MAX_SCRAPERS:
                marks.popitem(last=False)
        marks.move_to_end(scraper)
        return mark

    def delivered(self, delivery: Delivery) -> None:
        """The body reached its scraper: what it showed at zero has debuted there."""
        marks = self._watermarks
        scraper, births = delivery
        if births > marks.get(scraper, -1):
            marks[scraper] = births
            marks.move_to_end(scraper)
            if len(marks) > MAX_SCRAPERS:
                marks.popitem(last=False)
            self._highest = max(self._highest, births)

    def zero_new_rows(self, families: list[Metric], watermark: int) -> None:
        """Number the counter rows seen for the first time; show those born after `watermark`
        at zero (in place).

        Counter rows are removed only by label expiry, after which `forget` drops them here
        first, so as many rows as numbered means none is new: a scrape without new rows, by a
        scraper that got them all, costs a count per family, not a lookup per row.
        """
        rows = self._rows
        counters = [family for family in families if family.type == "counter"]
        if (sum(len(family.samples) for family in counters) == len(rows)
                and watermark >= self.births):
            return
        for family in counters:
            samples = family.samples
            for i, sample in enumerate(samples):
                row = row_key(sample)
                born = rows.get(row)
                if born is None:
                    self.births += 1
                    born = rows[row] = self.births
                if born > watermark:
                    samples[i] = sample._replace(value=0.0)


def row_key(sample: object) -> _Row:
    """A counter sample's row: its name and label values."""
    return sample.name, tuple(sample.labels.values())  # type: ignore[attr-defined]
