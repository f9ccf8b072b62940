"""The push worker's store operation: take everything recorded since the previous take.

The lock is held only for pointer swaps: each changed series gets a fresh histogram and the
taken one, with its pending batch, is folded afterwards on the caller's (the push flusher's)
thread; each counter's rows are swapped for empty ones (a gauge's are copied: they are current
values). No window is kept: the aggregator windows what it receives.
"""

from __future__ import annotations

from .. import names
from ..record.histogram import Histogram
from ..record.store import Store
from .wire import Delta


def take(store: Store) -> Delta:
    """Everything `store` holds since the previous take, as a delta (zeros left behind)."""
    with store.held:
        dirty, store.dirty = store.dirty, set()
        taken = []
        for series in dirty:
            hist, pending, exemplars = series.hist, series.pending, series.exemplars
            if pending or hist.count:
                series.hist = Histogram(series.state.layout)
                series.pending = []
                series.exemplars = None
                taken.append((series, hist, pending, exemplars))
            series.slices = None
        rows = {}
        for counter in names.COUNTERS:
            mine = store.rows[counter.name]
            if counter.gauge:
                rows[counter.name] = {row: n for row, n in mine.items() if n}
            else:
                rows[counter.name], store.rows[counter.name] = mine, {}
    delta = Delta(rows=rows)
    for series, hist, pending, exemplars in taken:
        hist.record_many(pending)
        key = (series.state.family.name, series.values)
        delta.histograms[key] = hist
        if exemplars:
            delta.exemplars[key] = exemplars
    return delta
