"""The aggregator's store operation: merge a worker's validated delta.

A delta is added exactly (HDR add with the straddle counts, exact sums, counter rows). Its label
values pass the aggregator's guard again (without the tenant policy, which the worker applied):
each worker caps its own values, the aggregator caps their union; a fold is counted on the
counter that counts the events' folds (`names.Counter.counts_folds`), once. Series past
`labels.max_series` are dropped and counted; counter rows past it fold. A gauge (the calls in
flight) is not added: each worker's latest value is kept by the aggregator, which serves their
sum (gauges.py).
"""

from __future__ import annotations

from .. import names
from ..record import exemplar
from ..record.store import Store
from .wire import Delta


def absorb(store: Store, delta: Delta, window: bool = True) -> None:
    """Add a validated delta; with `window`, its histograms also feed the current window slice
    (receive time)."""
    slice_id = store.current_slice() if window else None
    with store.held:
        guard = store.guard
        for (name, values), hist in delta.histograms.items():
            state = store.families[name]
            series = store.series(state, guard.relabel(state.label_names, values))
            if series is None:
                continue
            series.add(hist, slice_id, store.keep)
            theirs = delta.exemplars.get((name, values))
            if theirs:
                if series.exemplars is None:
                    series.exemplars = {}
                exemplar.merge(series.exemplars, theirs)
        for counter in names.COUNTERS:
            rows = delta.rows.get(counter.name)
            if counter.gauge or not rows:
                continue
            for values, n in rows.items():
                row = guard.relabel(counter.labels, values, n, counter.counts_folds)
                store.add_row(counter, row, n)
