"""The keyed store: one HDR histogram per (family, label set), counters, and the label guard.

Recording happens in the caller's thread at the end of each call: derive the values (outside
the lock), then one lock acquisition to append them to each series' small pending batch. The
HDR bucket indexing of a batch (the costly part, ~0.15 µs a value in Python) runs when a scrape
takes the series, or in the caller's thread only once a batch is full or its window slice
ended. Nothing here raises into the caller; a value or label that cannot be recorded is a
counted drop (`ttft_exporter_dropped_total`). Scrapes take the lock only to fold the pending
batches of the changed series and copy their histograms ("lock then swap"), and render
outside it.

Memory bound (docs/metrics.md): every series holds at most `counts_len × 8` bytes of counters
(32-bit until a bucket passes 4e9), in practice the span of octaves its values cover × 128 × 4
bytes; windowed families hold up to `window.slices` slices of raw values (at most 256 each) or
HDR counters. The number of series is capped by `labels.max_series`; tenants by
`labels.max_tenants` per (model, route).
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple

from . import names
from .config import Config
from .guard import LabelGuard
from .histogram import RAW_SLICE_MAX, Histogram, Layout, WindowPart
from .timeline import CallTimeline, Derived, derive

US_PER_SECOND = names.US_PER_SECOND

#: (trace id, value in the family's unit, Unix time) of the latest traced call in a bucket.
Exemplar = tuple[str, float, float]


#: Values a series holds before it folds them into its histogram in the caller's thread.
PENDING_MAX = 64


class Series:
    """One histogram series: cumulative counts, window slices, and its cached exposition text."""

    __slots__ = ("state", "values", "hist", "slices", "pending", "pending_slice", "exemplars",
                 "label_text", "text", "openmetrics_text", "window_text", "window_key")

    def __init__(self, state: "FamilyState", values: tuple[str, ...]):
        self.state = state
        self.values = values
        self.hist = Histogram(state.layout)
        #: (slice id, raw values or histogram) of the sliding window, oldest first.
        self.slices: list[tuple[int, WindowPart]] | None = None
        #: Values recorded but not yet folded into `hist` (and the window slice pending_slice).
        self.pending: list[int] = []
        self.pending_slice = 0
        #: `le` bucket position (len(boundaries) = +Inf) -> latest exemplar; None until traced.
        self.exemplars: dict[int, Exemplar] | None = None
        #: Exposition caches, owned by the renderer: sorted label pairs, lines (OpenMetrics
        #: lines differ only when the series has exemplars), window lines.
        self.label_text = ""
        self.text = ""
        self.openmetrics_text = ""
        self.window_text = ""
        self.window_key = -1

    def fold(self, keep_slices: int) -> None:
        """Move the pending values into the histogram and their window slice (under the lock)."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        batch = self.state.layout.bucketize(pending)
        self.hist.record_batch(batch)
        if self.state.windowed:
            slices = self.slices
            if slices is None:
                slices = self.slices = []
            if not slices or slices[-1][0] != self.pending_slice:
                slices.append((self.pending_slice, array("q")))
                del slices[:-keep_slices]
            part = slices[-1][1]
            if isinstance(part, Histogram):
                part.record_batch(batch)
            else:
                part.extend(pending)
                if len(part) > RAW_SLICE_MAX:
                    busy = Histogram(self.state.layout)
                    busy.record_many(part)
                    slices[-1] = (self.pending_slice, busy)


@dataclass
class FamilyState:
    family: names.Family
    layout: Layout
    #: Label names of the series key, sorted (the order Prometheus text uses).
    label_names: tuple[str, ...]
    has_tenant: bool
    windowed: bool
    series: dict[tuple[str, ...], Series] = field(default_factory=dict)


class Counters(NamedTuple):
    """A consistent copy of the recorder's counters and gauges."""

    requests: dict[tuple[str, str, str, str, str], int]  # model, outcome, provider, route, tenant
    in_flight: dict[tuple[str, str, str], int]  # model, provider, route
    drops: dict[str, int]  # reason -> count
    folds: dict[tuple[str, str], int]  # (model, route) -> calls folded into __other__
    series: int


class Recorder:
    """All metric state of one process (or, in the aggregator, of all pushing workers)."""

    def __init__(self, config: Config | None = None):
        self.config = config = config or Config()
        self._lock = threading.Lock()
        self.guard = LabelGuard(config.labels)
        digits = config.histograms.significant_digits
        seconds_layout = Layout(int(config.histograms.max_seconds * US_PER_SECOND), digits,
                                [round(b * US_PER_SECOND) for b in config.seconds_buckets()])
        tokens_layout = Layout(config.histograms.max_tokens, digits,
                               [int(b) for b in config.histograms.token_buckets])
        self.families: dict[str, FamilyState] = {}
        for fam in names.HISTOGRAMS:
            has_tenant = config.family_has_tenant(fam)
            label_names = [names.MODEL, names.PROVIDER, names.ROUTE]
            if has_tenant:
                label_names.append(names.TENANT)
            if fam.extra_label:
                label_names.append(fam.extra_label)
            self.families[fam.name] = FamilyState(
                fam, seconds_layout if fam.unit == "seconds" else tokens_layout,
                tuple(sorted(label_names)), has_tenant, fam.windowed)
        self.slice_ns = int(config.window.seconds / config.window.slices * 1e9)
        self.series_count = 0
        self.requests: dict[tuple[str, str, str, str, str], int] = {}  # model,outcome,prov,route,ten
        self.in_flight: dict[tuple[str, str, str], int] = {}  # model, provider, route
        self.drops: dict[str, int] = {reason: 0 for reason in names.DROP_REASONS}
        self.last_scrape_seconds = 0.0
        self._dirty: set[Series] = set()

    # --- recording (caller's thread; never raises) -----------------------------------------

    def started(self, model: str, provider: str, route: str) -> tuple[str, str, str]:
        """Count a call in flight; returns the key to pass back to `record_call`."""
        try:
            with self._lock:
                key = (self.guard.clean(model), self.guard.clean(provider),
                       self.guard.clean(route))
                self.in_flight[key] = self.in_flight.get(key, 0) + 1
                return key
        except Exception:
            self.drops[names.DROP_INTERNAL] += 1
            return (names.UNKNOWN, names.UNKNOWN, names.UNKNOWN)

    def record_call(self, t: CallTimeline, in_flight_key: tuple[str, str, str] | None = None,
                    derived: Derived | None = None) -> None:
        """Record every metric of one finished call (`derived`: `derive(t)`, if already done)."""
        try:
            if derived is None:
                derived = derive(t)
            with self._lock:
                if in_flight_key is not None and self.in_flight.get(in_flight_key, 0) > 0:
                    self.in_flight[in_flight_key] -= 1
                self._record_locked(t, derived)
        except Exception:
            self.drops[names.DROP_INTERNAL] += 1

    def _record_locked(self, t: CallTimeline, d: Derived) -> None:
        guard = self.guard
        model, provider, route = guard.clean(t.model), guard.clean(t.provider), \
            guard.clean(t.route)
        tenant = guard.tenant(model, route, t.tenant)
        outcome = t.outcome if t.outcome in names.OUTCOMES else names.ERROR
        key = (model, outcome, provider, route, tenant)
        self.requests[key] = self.requests.get(key, 0) + 1
        slice_id = (t.end if t.end is not None else time.perf_counter_ns()) // self.slice_ns
        base = (model, provider, route)
        with_tenant = (model, provider, route, tenant)
        observe = self._observe
        trace_id = t.trace_id
        for fam, value in ((names.TTFT, d.ttft), (names.FIRST_ANSWER, d.first_answer),
                           (names.TPOT, d.tpot), (names.STALL, d.stall),
                           (names.DURATION, d.duration), (names.INPUT_TOKENS, t.input_tokens),
                           (names.OUTPUT_TOKENS, t.output_tokens),
                           (names.CACHED_INPUT_TOKENS, t.cached_input_tokens)):
            if value is not None:
                state = self.families[fam.name]
                series = observe(state, with_tenant if state.has_tenant else base, value,
                                 slice_id)
                if trace_id and series is not None and state.windowed:
                    self._exemplar(series, value, trace_id)
        if d.gaps:  # already a batch: fold it at once
            state = self.families[names.ITL.name]
            series = self._series(state, with_tenant if state.has_tenant else base)
            if series is not None:
                series.pending.extend(d.gaps)
                series.fold(self.config.window.slices)
        state = self.families[names.PHASE_FAMILY.name]
        for phase, value in d.phases.items():
            # label order (model, phase, provider, route[, tenant]) is the sorted order
            values = (model, phase, provider, route, tenant) if state.has_tenant else \
                (model, phase, provider, route)
            observe(state, values, value, slice_id)

    def _observe(self, state: FamilyState, values: tuple[str, ...], value: int,
                 slice_id: int) -> Series | None:
        """Append one value to its series' pending batch: the per-value hot path."""
        if value.__class__ is not int or value < 0:
            self.drops[names.DROP_BAD_VALUE] += 1
            return None
        series = state.series.get(values)
        if series is None:
            series = self._series(state, values)
            if series is None:
                return None
        else:
            self._dirty.add(series)
        if slice_id > series.pending_slice:
            # (a call that ended just before a newer one took the lock joins the newer slice)
            series.fold(self.config.window.slices)
            series.pending_slice = slice_id
        series.pending.append(value)
        if len(series.pending) >= PENDING_MAX:
            series.fold(self.config.window.slices)
        return series

    @staticmethod
    def _exemplar(series: Series, value: int, trace_id: str) -> None:
        """Keep the call's trace id as the exemplar of the `le` bucket its value falls in."""
        layout = series.state.layout
        position = bisect_left(layout.boundaries, min(value, layout.highest))
        scaled = series.state.family.to_unit(value)
        if series.exemplars is None:
            series.exemplars = {}
        series.exemplars[position] = (trace_id, scaled, time.time())

    def _series(self, state: FamilyState, values: tuple[str, ...]) -> Series | None:
        series = state.series.get(values)
        if series is None:
            if self.series_count >= self.config.labels.max_series:
                self.drops[names.DROP_SERIES_LIMIT] += 1
                return None
            series = state.series[values] = Series(state, values)
            self.series_count += 1
        self._dirty.add(series)
        return series

    # --- reading (scrape thread) ---------------------------------------------------------------

    def swap_dirty(self) -> tuple[list[tuple[Series, Histogram, dict[int, Exemplar] | None]],
                                  int]:
        """Under the lock: take the changed series with a private copy of their histograms.

        Returns those and the current window slice id; rendering then runs without the lock.
        """
        keep = self.config.window.slices
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            taken = []
            for series in dirty:
                series.fold(keep)
                exemplars = dict(series.exemplars) if series.exemplars else None
                taken.append((series, series.hist.copy(), exemplars))
            return taken, time.perf_counter_ns() // self.slice_ns

    def window_slices(self, series: Series, current_slice: int) -> list[WindowPart]:
        """Copies of the live window slices of a series (under the lock)."""
        keep = self.config.window.slices
        oldest = current_slice - keep
        with self._lock:
            series.fold(keep)
            return [part.copy() if isinstance(part, Histogram) else array("q", part)
                    for sid, part in (series.slices or ()) if sid > oldest]

    def folded_copies(self, state: FamilyState) -> list[tuple[Series, Histogram]]:
        """Every series of a family with a copy of its up-to-date histogram (under the lock)."""
        return [(series, hist) for series, hist, _ in self.snapshot(state)]

    def snapshot(self, state: FamilyState
                 ) -> list[tuple[Series, Histogram, dict[int, Exemplar] | None]]:
        """Every series of a family with copies of its histogram and exemplars (under the lock)."""
        keep = self.config.window.slices
        with self._lock:
            out = []
            for series in state.series.values():
                series.fold(keep)
                out.append((series, series.hist.copy(),
                            dict(series.exemplars) if series.exemplars else None))
            return out

    def counters(self) -> Counters:
        """Copies of the counters and gauges, taken under the lock."""
        with self._lock:
            drops = dict(self.drops)
            drops[names.DROP_BAD_LABEL] += self.guard.bad_labels
            return Counters(dict(self.requests), dict(self.in_flight), drops,
                            dict(self.guard.folds), self.series_count)

    # --- multi-process push: worker drain, aggregator merge (exporter/push.py, aggregator.py) ----

    def drain(self):  # -> push.Delta
        """Worker side: take everything recorded since the previous drain, leaving zeros.

        In push mode this recorder is a delta store (scrape the aggregator, not the worker). The
        lock is held only for pointer swaps: each changed series gets a fresh histogram and the
        taken one, with its pending batch, is folded afterwards on the caller's (the flusher's)
        thread. The worker keeps no window slices: the aggregator windows what it receives.
        """
        from .push import Delta

        with self._lock:
            dirty, self._dirty = self._dirty, set()
            taken = []
            for series in dirty:
                hist, pending, exemplars = series.hist, series.pending, series.exemplars
                if pending or hist.count:
                    series.hist = Histogram(series.state.layout)
                    series.pending = []
                    series.exemplars = None
                    taken.append((series, hist, pending, exemplars))
                series.slices = None
            requests, self.requests = self.requests, {}
            in_flight = {key: n for key, n in self.in_flight.items() if n}
            dropped = {reason: n for reason, n in self.drops.items() if n}
            for reason in dropped:
                self.drops[reason] = 0
            folds, self.guard.folds = self.guard.folds, {}
            bad_labels, self.guard.bad_labels = self.guard.bad_labels, 0
        if bad_labels:
            dropped[names.DROP_BAD_LABEL] = dropped.get(names.DROP_BAD_LABEL, 0) + bad_labels
        delta = Delta(requests=requests, in_flight=in_flight, tenant_folds=folds,
                      dropped=dropped)
        for series, hist, pending, exemplars in taken:
            hist.record_many(pending)
            key = (series.state.family.name, series.values)
            delta.histograms[key] = hist
            if exemplars:
                delta.exemplars[key] = exemplars
        return delta

    def merge(self, delta, window: bool = True) -> None:  # delta: push.Delta
        """Aggregator side: add a validated delta exactly (HDR add, straddles, sums, counters).

        With `window`, the histograms also feed the current window slice (receive time). Gauges
        are not touched here: the aggregator sums each worker's latest (`replace_in_flight`).
        Series and counter rows beyond `labels.max_series` are dropped and counted.
        """
        keep = self.config.window.slices
        slice_id = time.perf_counter_ns() // self.slice_ns
        with self._lock:
            dirty = self._dirty
            for (name, values), hist in delta.histograms.items():
                state = self.families[name]
                series = state.series.get(values)
                if series is None:
                    series = self._series(state, values)
                    if series is None:
                        continue
                else:
                    dirty.add(series)
                if series.pending:
                    series.fold(keep)
                # a received histogram (push.Sparse) adds itself, bucket by non-empty bucket
                add_to = getattr(hist, "add_to", None)
                if add_to is None:
                    add_to = (lambda target, h=hist: target.add(h))
                add_to(series.hist)
                if window and state.windowed:
                    slices = series.slices
                    if slices is None:
                        slices = series.slices = []
                    if not slices or slices[-1][0] < slice_id:
                        slices.append((slice_id, Histogram(state.layout)))
                        del slices[:-keep]
                    part = slices[-1][1]
                    if not isinstance(part, Histogram):  # raw values: make it a histogram
                        raw, part = part, Histogram(state.layout)
                        part.record_many(raw)
                        slices[-1] = (slices[-1][0], part)
                    add_to(part)
                exemplars = delta.exemplars.get((name, values)) if delta.exemplars else None
                if exemplars:
                    mine = series.exemplars
                    if mine is None:
                        mine = series.exemplars = {}
                    for position, exemplar in exemplars.items():
                        if position not in mine or mine[position][2] <= exemplar[2]:
                            mine[position] = exemplar
            requests = self.requests
            for key, n in delta.requests.items():
                if key in requests:
                    requests[key] += n
                elif len(requests) < self.config.labels.max_series:
                    requests[key] = n
                else:
                    self.drops[names.DROP_SERIES_LIMIT] += 1
            folds = self.guard.folds
            for key, n in delta.tenant_folds.items():
                if key in folds or len(folds) < self.config.labels.max_series:
                    folds[key] = folds.get(key, 0) + n
            for reason, n in delta.dropped.items():
                self.drops[reason] = self.drops.get(reason, 0) + n

    def replace_in_flight(self, totals: dict[tuple[str, str, str], int]) -> None:
        """Aggregator side: the in-flight gauge is the sum of the live workers' latest values."""
        with self._lock:
            self.in_flight = dict(totals)
