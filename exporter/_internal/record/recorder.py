"""The keyed store: one HDR histogram per (family, label set), counters, and the label guard.

Recording happens in the caller's thread at the end of each call: derive the values (outside
the lock), then one lock acquisition to append them to each series' small pending batch. The
HDR bucket indexing of a batch (the costly part, ~0.15 µs a value in Python) runs when a reader
takes the series, or in the caller's thread only once a batch is full or its window slice
ended. Nothing here raises into the caller; a value or label that cannot be recorded is a
counted drop (`ttft_exporter_dropped_total`, always counted under the lock).

Readers get snapshots: the renderer takes the changed series with private copies of their
histograms ("lock then swap") and renders outside the lock, keeping its caches to itself. The
two process roles beyond the in-process exporter use two store operations: a push worker
`take()`s everything recorded since its previous take, an aggregator `absorb()`s a validated
delta. Which role a process plays is decided in runtime.py, not here.

A call can end inside a garbage-collector finaliser (an abandoned stream), which can run on any
thread at any allocation, including one made while this very thread holds the (non-reentrant)
lock. Such a call, or drop, is queued and recorded by whoever takes the lock next, a scrape
included, so nothing waits for the next call.

Memory bound (docs/metrics.md): every series holds at most `counts_len × 8` bytes of counters
(32-bit until a bucket passes 4e9), in practice the span of octaves its values cover × 128 × 4
bytes; windowed families hold up to `window.slices` slices of raw values (at most 256 each) or
HDR counters. The number of series is capped by `labels.max_series`; tenants by
`labels.max_tenants` per (model, route).
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections import deque
from threading import get_ident
from typing import Iterable, NamedTuple, Union

from .. import names
from ..config.settings import Config
from ..fleet.wire import Delta
from . import exemplar
from .clock import SYSTEM, Clock
from .exemplar import Exemplar
from .guard import CAPPED, LabelGuard
from .histogram import Histogram, WindowPart
from .schema import Schema
from .series import FamilyState, Series
from .tasks import TaskSummary
from .timeline import CallTimeline, Derived, derive

US_PER_SECOND = names.US_PER_SECOND

#: Values a series holds before it folds them into its histogram in the caller's thread.
PENDING_MAX = 64

#: (model, provider, route): the key of the in-flight gauge.
InFlightKey = tuple[str, str, str]
#: (model, provider, route, tenant): the key of the usage counters.
UsageKey = tuple[str, str, str, str]
#: (address, fingerprint, model, provider, region): the key of the upstream counter.
UpstreamKey = tuple[str, str, str, str, str]


class Counters(NamedTuple):
    """A consistent copy of the recorder's counters and gauges."""

    requests: dict[tuple[str, str, str, str, str], int]  # model, outcome, provider, route, tenant
    in_flight: dict[tuple[str, str, str], int]  # model, provider, route
    drops: dict[str, int]  # reason -> count
    folds: dict[tuple[str, str], int]  # (model, route) -> calls whose tenant folded
    series: int
    label_folds: dict[str, int]  # label -> calls whose model, route, provider... folded
    input_tokens: dict[UsageKey, int]  # provider usage per tenant
    cached_tokens: dict[UsageKey, int]
    upstreams: dict[UpstreamKey, int]  # calls per upstream identity
    counts: dict[str, dict[tuple[str, ...], int]]  # names.COUNTERS: name -> row -> count


class Taken(NamedTuple):
    """Everything recorded since the previous `take()` (a push worker's delta)."""

    histograms: dict[tuple[str, tuple[str, ...]], Histogram]
    exemplars: dict[tuple[str, tuple[str, ...]], dict[int, Exemplar]]
    requests: dict[tuple[str, str, str, str, str], int]
    in_flight: dict[tuple[str, str, str], int]  # current values: a gauge
    folds: dict[tuple[str, str], int]
    drops: dict[str, int]
    label_folds: dict[str, int]
    input_tokens: dict[UsageKey, int]
    cached_tokens: dict[UsageKey, int]
    upstreams: dict[UpstreamKey, int]
    counts: dict[str, dict[tuple[str, ...], int]]


#: A call, task or drop queued because its thread held the lock: (timeline, in-flight key,
#: derived), a task's summary, or a drop reason.
_Deferred = Union[tuple[CallTimeline, Union[InFlightKey, None], Derived], TaskSummary, str]


def _no_counts() -> dict[str, dict[tuple[str, ...], int]]:
    return {counter.name: {} for counter in names.COUNTERS}


class _Held:
    """`with recorder._held:` for the readers (which a finaliser never re-enters)."""

    __slots__ = ("recorder",)

    def __init__(self, recorder: "Recorder"):
        self.recorder = recorder

    def __enter__(self) -> None:
        if not self.recorder._acquire():
            raise RuntimeError("the recorder's lock was re-entered by a reader")

    def __exit__(self, *exc: object) -> None:
        self.recorder._release()


class Recorder:
    """All metric state of one process (or, in the aggregator, of all pushing workers)."""

    def __init__(self, config: Config | None = None, clock: Clock = SYSTEM):
        self.config = config = config or Config()
        self.clock = clock
        self.schema = Schema(config)
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding the lock
        self._deferred: deque[_Deferred] = deque()
        self._held = _Held(self)
        self.guard = LabelGuard(config.labels)
        self.families: dict[str, FamilyState] = {
            name: FamilyState(spec) for name, spec in self.schema.families.items()}
        self._keep = config.window.slices
        self.slice_ns = int(config.window.seconds / config.window.slices * 1e9)
        self.series_count = 0
        self.requests: dict[tuple[str, str, str, str, str], int] = {}  # model,outcome,prov,route,ten
        self.in_flight: dict[InFlightKey, int] = {}  # model, provider, route
        self.drops: dict[str, int] = {reason: 0 for reason in names.DROP_REASONS}
        self.input_tokens: dict[UsageKey, int] = {}
        self.cached_tokens: dict[UsageKey, int] = {}
        self.upstreams: dict[UpstreamKey, int] = {}
        #: names.COUNTERS by name: label values (the counter's label order) -> count.
        self.counts: dict[str, dict[tuple[str, ...], int]] = _no_counts()
        self._dirty: set[Series] = set()
        self._gauge_keys: set[InFlightKey] = set()  # aggregator: in-flight keys of all workers
        #: (model, provider, route) triples the guard keeps as they are (clean, within the
        #: caps): a set lookup per call instead of six guard calls. Only values whose guard
        #: calls have no effect are here (never a folded, replaced or counted value).
        self._kept: set[tuple[str, str, str]] = set()
        #: The families every call records, in the order `_record_locked` reads its values.
        self._call_states = tuple(self.families[fam.name] for fam in (
            names.TTFT, names.FIRST_ANSWER, names.TPOT, names.STALL, names.DURATION,
            names.INPUT_TOKENS, names.OUTPUT_TOKENS, names.CACHED_INPUT_TOKENS,
            names.REQUESTED_MAX_TOKENS, names.MAX_TOKENS_HEADROOM))

    # --- the lock -----------------------------------------------------------------------------

    def _acquire(self) -> bool:
        """Take the lock, or return False when this thread already holds it (a finaliser ran
        inside our own locked section: the caller defers its work instead of deadlocking)."""
        me = threading.get_ident()
        if self._owner == me:
            return False
        self._lock.acquire()
        self._owner = me
        if self._deferred:
            self._run_deferred()
        return True

    def _release(self) -> None:
        if self._deferred:  # queued by a finaliser while we held the lock
            self._run_deferred()
        self._owner = None
        self._lock.release()

    def _run_deferred(self) -> None:
        while self._deferred:
            try:
                item = self._deferred.popleft()
            except IndexError:
                return
            if isinstance(item, str):
                self.drops[item] = self.drops.get(item, 0) + 1
                continue
            try:
                if isinstance(item, TaskSummary):
                    self._task_locked(item)
                else:
                    self._finish_locked(*item)
            except Exception:
                self.drops[names.DROP_INTERNAL] += 1

    def reset_after_fork(self) -> None:
        """In a forked child only the forking thread survives: a lock another thread held at
        fork time would never be released, and the calls other threads had in flight never
        end here. The recorded data stays (as prometheus_client's single-process mode keeps
        it); the lock is new and the in-flight gauge starts at 0."""
        self._lock = threading.Lock()
        self._owner = None
        self._deferred.clear()
        self.in_flight = {key: 0 for key in self.in_flight}

    # --- recording (caller's thread; never raises) -----------------------------------------

    def started(self, model: str, provider: str, route: str) -> InFlightKey:
        """Count a call in flight; returns the key to pass back to `record_call`."""
        try:
            # `_acquire()` / `_release()` written out (here and in `record_call`): these two
            # run on every call, in the caller's thread.
            me = get_ident()
            if self._owner == me:
                return (names.UNKNOWN, names.UNKNOWN, names.UNKNOWN)
            lock = self._lock
            lock.acquire()
            self._owner = me
            try:
                if self._deferred:
                    self._run_deferred()
                key = (model, provider, route)
                if key not in self._kept:
                    guard = self.guard
                    key = self._keep_if_same(key, (
                        guard.known(names.MODEL, model), guard.known(names.PROVIDER, provider),
                        guard.known(names.ROUTE, route)))
                in_flight = self.in_flight
                if key not in in_flight:
                    key = self._row(in_flight, key, (names.OTHER_TENANT,) * 3)  # type: ignore
                in_flight[key] = in_flight.get(key, 0) + 1
                return key
            finally:
                if self._deferred:
                    self._run_deferred()
                self._owner = None
                lock.release()
        except Exception:
            self.count_drop(names.DROP_INTERNAL)
            return (names.UNKNOWN, names.UNKNOWN, names.UNKNOWN)

    def record_call(self, t: CallTimeline, in_flight_key: InFlightKey | None = None,
                    derived: Derived | None = None) -> None:
        """Record every metric of one finished call (`derived`: `derive(t)`, if already done)."""
        try:
            if derived is None:
                derived = derive(t)
            me = get_ident()
            if self._owner == me:
                self._deferred.append((t, in_flight_key, derived))
                return
            lock = self._lock
            lock.acquire()
            self._owner = me
            try:
                if self._deferred:
                    self._run_deferred()
                self._finish_locked(t, in_flight_key, derived)
            finally:
                if self._deferred:
                    self._run_deferred()
                self._owner = None
                lock.release()
        except Exception:
            self.count_drop(names.DROP_INTERNAL)

    def record_task(self, summary: TaskSummary) -> None:
        """Record every metric of one finished agent task (tasks.summarize), under one lock."""
        try:
            if not self._acquire():
                self._deferred.append(summary)
                return
            try:
                self._task_locked(summary)
            finally:
                self._release()
        except Exception:
            self.count_drop(names.DROP_INTERNAL)

    def count_drop(self, reason: str) -> None:
        """Count one value, series or call not recorded (never raises, never deadlocks)."""
        try:
            if not self._acquire():
                self._deferred.append(reason)
                return
            try:
                self.drops[reason] = self.drops.get(reason, 0) + 1
            finally:
                self._release()
        except Exception:  # pragma: no cover - the lock itself is broken
            pass

    def _finish_locked(self, t: CallTimeline, in_flight_key: InFlightKey | None,
                       d: Derived) -> None:
        if in_flight_key is not None and self.in_flight.get(in_flight_key, 0) > 0:
            self.in_flight[in_flight_key] -= 1  # an idle row stays, at 0 (its rows are bounded)
        self._record_locked(t, d)

    def _keep_if_same(self, raw: tuple[str, str, str], labels: tuple[str, str, str]
                      ) -> tuple[str, str, str]:
        """`labels` (the guard's answer for `raw`); remembered in `_kept` when it is `raw`
        itself, so the next call with these values skips the guard (which would do nothing)."""
        if labels[0] is raw[0] and labels[1] is raw[1] and labels[2] is raw[2] \
                and raw[0].__class__ is str and raw[1].__class__ is str \
                and raw[2].__class__ is str and names.OTHER_TENANT not in raw \
                and len(self._kept) < self.config.labels.max_series:
            self._kept.add(raw)
        return labels

    def _record_locked(self, t: CallTimeline, d: Derived) -> None:
        guard = self.guard
        model, provider, route = base = (t.model, t.provider, t.route)
        if base not in self._kept:
            model, provider, route = base = self._keep_if_same(base, (
                guard.value(names.MODEL, model), guard.value(names.PROVIDER, provider),
                guard.value(names.ROUTE, route)))
        raw_tenant = t.tenant
        tenant = names.UNKNOWN if raw_tenant is None or raw_tenant == "" else \
            guard.tenant(model, route, raw_tenant)
        outcome = t.outcome if t.outcome in names.OUTCOMES else names.ERROR
        requests = self.requests
        key = (model, outcome, provider, route, tenant)
        if key not in requests:
            other = names.OTHER_TENANT
            key = self._row(requests, key, (other, outcome, other, other, other))
        requests[key] = requests.get(key, 0) + 1
        if t.finish_reason is not None:
            self._add(names.FINISH_REASONS_TOTAL,
                      (names.finish_reason(t.finish_reason), model, provider, route))
        max_tokens, headroom = t.max_tokens, None
        if max_tokens is not None and t.output_tokens is not None:
            headroom = max(0, max_tokens - t.output_tokens)
        if t.input_tokens is not None or t.cached_input_tokens is not None:
            self._usage(key, t.input_tokens, t.cached_input_tokens)
        if t.upstream_address or t.upstream_region or t.fingerprint:
            self._upstream(model, provider, t.upstream_address, t.upstream_region,
                           t.fingerprint)
        end = t.end if t.end is not None else self.clock.monotonic_ns()
        slice_id = end // self.slice_ns
        with_tenant = (model, provider, route, tenant)
        observe = self._observe
        dirty = self._dirty
        trace_id = t.trace_id
        for state, value in zip(self._call_states, (
                d.ttft, d.first_answer, d.tpot, d.stall, d.duration, t.input_tokens,
                t.output_tokens, t.cached_input_tokens, max_tokens, headroom)):
            if value is None:
                continue
            values = with_tenant if state.has_tenant else base
            series = state.series.get(values)
            if series is not None and value.__class__ is int and value >= 0 \
                    and slice_id <= series.pending_slice:
                # `_observe`'s common case inline (a valid value, a known series, the same
                # window slice): one Python call less per value
                dirty.add(series)
                pending = series.pending
                pending.append(value)
                if len(pending) >= PENDING_MAX:
                    series.fold(self._keep)
            else:
                series = observe(state, values, value, slice_id)
            if trace_id and series is not None and state.windowed:
                self._exemplar(series, value, trace_id)
        if d.gaps:  # already a batch: fold it at once
            state = self.families[names.ITL.name]
            series = self._series(state, with_tenant if state.has_tenant else base)
            if series is not None:
                series.pending.extend(d.gaps)
                series.fold(self._keep)
        if d.phases:
            state = self.families[names.PHASE_FAMILY.name]
            has_tenant = state.has_tenant
            all_series = state.series
            for phase, value in d.phases.items():
                # label order (model, phase, provider, route[, tenant]) is the sorted order
                values = (model, phase, provider, route, tenant) if has_tenant else \
                    (model, phase, provider, route)
                series = all_series.get(values)
                if series is not None and value.__class__ is int and value >= 0 \
                        and slice_id <= series.pending_slice:  # as above
                    dirty.add(series)
                    pending = series.pending
                    pending.append(value)
                    if len(pending) >= PENDING_MAX:
                        series.fold(self._keep)
                else:
                    observe(state, values, value, slice_id)

    def _task_locked(self, s: TaskSummary) -> None:
        task = self.guard.value(names.TASK, s.name)
        slice_id = s.end // self.slice_ns
        families, observe, key = self.families, self._observe, (task,)
        for fam, value in ((names.TASK_DURATION, s.duration), (names.TASK_STEPS, s.steps),
                           (names.TASK_CRITICAL_PATH, s.critical_path)):
            observe(families[fam.name], key, value, slice_id)
        state = families[names.TASK_TIME.name]
        for kind, value in s.kinds.items():
            observe(state, (kind, task), value, slice_id)  # (kind, task): sorted label order
        outcome = s.outcome if s.outcome in names.OUTCOMES else names.ERROR
        self._add(names.TASKS_TOTAL, (s.deadline, outcome, task))
        self._add(names.TASK_WATERFALL_CALLS, key, s.waterfall_calls)
        if s.deadline != names.DEADLINE_NONE:  # rows at 0 too: "no late call" is an answer
            self._add(names.TASK_LATE_CALLS, key, s.late_calls)
            self._add(names.TASK_ORPHAN_TOKENS, key, s.orphan_tokens)

    def _add(self, counter: names.Counter, key: tuple[str, ...], n: int = 1,
             folds: int = 1) -> None:
        """Add `n` to a counter's row; past `max_series` rows, to its overflow row."""
        rows = self.counts[counter.name]
        if key not in rows:
            overflow = tuple(v if label in names.CLOSED_LABELS else names.OTHER_TENANT
                             for label, v in zip(counter.labels, key))
            key = self._row(rows, key, overflow, folds)
        rows[key] = rows.get(key, 0) + n

    def _usage(self, request_key: tuple[str, ...], input_tokens: int | None,
               cached: int | None) -> None:
        """Add a call's usage to its tenant's counters (the requests row's labels, so the rows
        fold exactly as the requests counter's do)."""
        model, _, provider, route, tenant = request_key
        for rows, value in ((self.input_tokens, input_tokens), (self.cached_tokens, cached)):
            if value.__class__ is int and value >= 0:  # type: ignore[operator]
                key = self._row(rows, (model, provider, route, tenant),
                                (names.OTHER_TENANT,) * 4, count=0)
                rows[key] = rows.get(key, 0) + value  # type: ignore[operator]

    def _upstream(self, model: str, provider: str, address: object, region: object,
                  fingerprint: object, n: int = 1, count: int = 1) -> None:
        """Count calls of `model` that reached this upstream (identities capped per model)."""
        unknown = names.UNKNOWN
        address, region, fingerprint = self.guard.upstream(
            model, address or unknown, region or unknown, fingerprint or unknown, count)
        key = self._row(self.upstreams, (address, fingerprint, model, provider, region),
                        (names.OTHER_TENANT,) * 5, count=count)
        self.upstreams[key] = self.upstreams.get(key, 0) + n

    def _row(self, rows: dict, key: tuple[str, ...], overflow: tuple[str, ...],
             count: int = 1) -> tuple[str, ...]:
        """`key`, or `overflow` when `key` would be a new row past `labels.max_series` rows
        (counted as a fold of the whole label set): every family stays bounded."""
        if key in rows or len(rows) < self.config.labels.max_series:
            return key
        folds = self.guard.label_folds
        folds[names.FOLD_SERIES] = folds.get(names.FOLD_SERIES, 0) + count
        return overflow

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
            series.fold(self._keep)
            series.pending_slice = slice_id
        series.pending.append(value)
        if len(series.pending) >= PENDING_MAX:
            series.fold(self._keep)
        return series

    def _exemplar(self, series: Series, value: int, trace_id: str) -> None:
        """Keep the call's trace id as the exemplar of the `le` bucket its value falls in."""
        layout = series.state.layout
        position = bisect_left(layout.boundaries, min(value, layout.highest))
        if series.exemplars is None:
            series.exemplars = {}
        series.exemplars[position] = (trace_id, series.state.family.to_unit(value),
                                      self.clock.time())

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

    # --- reading (scrapes: snapshots taken under the lock, used outside it) ---------------------

    def current_slice(self) -> int:
        """Id of the window slice now (slices are `window.seconds / window.slices` long)."""
        return self.clock.monotonic_ns() // self.slice_ns

    def take_changed(self) -> tuple[list[tuple[Series, Histogram, dict[int, Exemplar] | None]],
                                    int]:
        """The series changed since the previous call, each with a private copy of its
        histogram and exemplars, and the current window slice id."""
        with self._held:
            dirty, self._dirty = self._dirty, set()
            taken = []
            for series in dirty:
                series.fold(self._keep)
                exemplars = dict(series.exemplars) if series.exemplars else None
                taken.append((series, series.hist.copy(), exemplars))
            return taken, self.current_slice()

    def window_slices(self, series: Series, current_slice: int) -> list[WindowPart]:
        """Copies of the live window slices of a series."""
        oldest = current_slice - self._keep
        with self._held:
            series.fold(self._keep)
            return [part.copy() if isinstance(part, Histogram) else array("q", part)
                    for sid, part in (series.slices or ()) if sid > oldest]

    def snapshot(self, state: FamilyState
                 ) -> list[tuple[Series, Histogram, dict[int, Exemplar] | None]]:
        """Every series of a family with copies of its histogram and exemplars."""
        return self.snapshot_of(state.series.values())

    def snapshot_of(self, series_list: Iterable[Series]
                    ) -> list[tuple[Series, Histogram, dict[int, Exemplar] | None]]:
        """These series with copies of their histograms and exemplars."""
        with self._held:
            out = []
            for series in list(series_list):
                series.fold(self._keep)
                out.append((series, series.hist.copy(),
                            dict(series.exemplars) if series.exemplars else None))
            return out

    def all_series(self) -> list[Series]:
        """Every series of every family (not their histograms: see snapshot_of)."""
        with self._held:
            return [series for state in self.families.values()
                    for series in state.series.values()]

    def folded_copies(self, state: FamilyState) -> list[tuple[Series, Histogram]]:
        """Every series of a family with a copy of its up-to-date histogram."""
        return [(series, hist) for series, hist, _ in self.snapshot(state)]

    def counters(self) -> Counters:
        """Copies of the counters and gauges."""
        with self._held:
            drops = dict(self.drops)
            drops[names.DROP_BAD_LABEL] += self.guard.bad_labels
            return Counters(dict(self.requests), dict(self.in_flight), drops,
                            dict(self.guard.folds), self.series_count,
                            dict(self.guard.label_folds), dict(self.input_tokens),
                            dict(self.cached_tokens), dict(self.upstreams),
                            {name: dict(rows) for name, rows in self.counts.items()})

    # --- the store operations of the other process roles ----------------------------------------

    def take(self) -> Taken:
        """Push worker: everything recorded since the previous take, leaving zeros.

        The lock is held only for pointer swaps: each changed series gets a fresh histogram and
        the taken one, with its pending batch, is folded afterwards on the caller's (the push
        flusher's) thread. No window is kept: the aggregator windows what it receives.
        """
        with self._held:
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
            input_tokens, self.input_tokens = self.input_tokens, {}
            cached_tokens, self.cached_tokens = self.cached_tokens, {}
            upstreams, self.upstreams = self.upstreams, {}
            counts, self.counts = self.counts, _no_counts()
            in_flight = {key: n for key, n in self.in_flight.items() if n}
            drops = {reason: n for reason, n in self.drops.items() if n}
            for reason in drops:
                self.drops[reason] = 0
            folds, self.guard.folds = self.guard.folds, {}
            label_folds, self.guard.label_folds = self.guard.label_folds, {}
            bad_labels, self.guard.bad_labels = self.guard.bad_labels, 0
        if bad_labels:
            drops[names.DROP_BAD_LABEL] = drops.get(names.DROP_BAD_LABEL, 0) + bad_labels
        histograms: dict[tuple[str, tuple[str, ...]], Histogram] = {}
        exemplars_by_key: dict[tuple[str, tuple[str, ...]], dict[int, Exemplar]] = {}
        for series, hist, pending, exemplars in taken:
            hist.record_many(pending)
            key = (series.state.family.name, series.values)
            histograms[key] = hist
            if exemplars:
                exemplars_by_key[key] = exemplars
        return Taken(histograms, exemplars_by_key, requests, in_flight, folds, drops,
                     label_folds, input_tokens, cached_tokens, upstreams, counts)

    def absorb(self, delta: Delta, window: bool = True) -> None:
        """Aggregator: add a validated delta exactly (HDR add, straddles, sums, counters).

        Its label values pass this recorder's guard again (without the tenant policy, which the
        worker applied): each worker caps its own values, the aggregator caps their union. With
        `window`, the histograms also feed the current window slice (receive time). Series past
        `labels.max_series` are dropped and counted; counter rows past it fold.
        """
        slice_id = self.current_slice() if window else None
        with self._held:
            guard = self.guard
            for (name, values), hist in delta.histograms.items():
                state = self.families[name]
                series = self._series(state, self._relabel(state.label_names, values))
                if series is None:
                    continue
                series.add(hist, slice_id, self._keep)
                theirs = delta.exemplars.get((name, values))
                if theirs:
                    if series.exemplars is None:
                        series.exemplars = {}
                    exemplar.merge(series.exemplars, theirs)
            other = names.OTHER_TENANT
            for (model, outcome, provider, route, tenant), n in delta.requests.items():
                model, provider = guard.value(names.MODEL, model, n), \
                    guard.value(names.PROVIDER, provider, n)
                route = guard.value(names.ROUTE, route, n)
                tenant = guard.tenant(model, route, tenant, policy=False, count=n)
                key = self._row(self.requests, (model, outcome, provider, route, tenant),
                                (other, outcome, other, other, other), n)
                self.requests[key] = self.requests.get(key, 0) + n
            for rows, theirs in ((self.input_tokens, delta.input_tokens),
                                 (self.cached_tokens, delta.cached_tokens)):
                for (model, provider, route, tenant), n in theirs.items():
                    model, provider = guard.known(names.MODEL, model), \
                        guard.known(names.PROVIDER, provider)
                    route = guard.known(names.ROUTE, route)
                    tenant = guard.tenant(model, route, tenant, policy=False, count=0)
                    key = self._row(rows, (model, provider, route, tenant),
                                    (other,) * 4, count=0)
                    rows[key] = rows.get(key, 0) + n
            for (address, fingerprint, model, provider, region), n in delta.upstreams.items():
                self._upstream(guard.known(names.MODEL, model),
                               guard.known(names.PROVIDER, provider), address, region,
                               fingerprint, n, count=n)
            for name, rows in delta.counters.items():
                counter = names.COUNTERS_BY_NAME[name]
                for values, n in rows.items():
                    self._add(counter, self._relabel(counter.labels, values), n, folds=0)
            for (model, route), n in delta.tenant_folds.items():
                key = (guard.known(names.MODEL, model), guard.known(names.ROUTE, route))
                guard.folds[key] = guard.folds.get(key, 0) + n
            for label, n in delta.label_folds.items():
                guard.label_folds[label] = guard.label_folds.get(label, 0) + n
            for reason, n in delta.dropped.items():
                self.drops[reason] = self.drops.get(reason, 0) + n

    def _relabel(self, label_names: tuple[str, ...], values: tuple[str, ...]
                 ) -> tuple[str, ...]:
        """A worker's label values through this guard (folds counted with the calls)."""
        labels = dict(zip(label_names, values))
        guard = self.guard
        for label in CAPPED:
            if label in labels:
                labels[label] = guard.known(label, labels[label])
        if names.TENANT in labels:
            labels[names.TENANT] = guard.tenant(labels[names.MODEL], labels[names.ROUTE],
                                                labels[names.TENANT], policy=False, count=0)
        return tuple(labels[label] for label in label_names)

    def in_flight_rows(self, rows: dict[tuple[str, ...], int]) -> dict[InFlightKey, int]:
        """Aggregator: a worker's in-flight rows through this guard, at most `max_series`
        distinct keys in all (the rest in one overflow row)."""
        out: dict[InFlightKey, int] = {}
        with self._held:
            guard, keys = self.guard, self._gauge_keys
            for (model, provider, route), n in rows.items():
                key = (guard.known(names.MODEL, model), guard.known(names.PROVIDER, provider),
                       guard.known(names.ROUTE, route))
                if key not in keys:
                    if len(keys) < self.config.labels.max_series:
                        keys.add(key)
                    else:
                        key = (names.OTHER_TENANT,) * 3  # type: ignore[assignment]
                out[key] = out.get(key, 0) + n
        return out

    def set_in_flight(self, totals: dict[InFlightKey, int]) -> None:
        """Aggregator: the in-flight gauge is the sum of the live workers' latest values."""
        with self._held:
            self.in_flight = dict(totals)
