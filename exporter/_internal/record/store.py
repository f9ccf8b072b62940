"""The store every process role shares: one HDR histogram per (family, label set), the counter
rows of names.COUNTERS, the label guard, and the one lock over all of them.

Three roles write it: the caller's hot path (record/recorder.py), the push worker's `take` and
the aggregator's `merge` (both here: fleet/ only carries what they take and give). Readers get
snapshots: the renderer takes the changed series with private copies of their histograms
("lock then swap") and renders outside the lock, keeping its caches to itself. Nothing here
raises into a caller; a value or label that cannot be recorded is a counted drop
(`ttft_exporter_dropped_total`, always counted under the lock).

A call can end inside a garbage-collector finaliser (an abandoned stream), which can run on any
thread at any allocation, including one made while this very thread holds the (non-reentrant)
lock. Such work is queued (`defer`) and done by whoever takes the lock next, a scrape included,
so nothing waits for the next call.

Memory bound (docs/metrics.md): every series holds at most `counts_len × 8` bytes of counters
(32-bit until a bucket passes 4e9), in practice the span of octaves its values cover × 128 × 4
bytes; windowed families hold up to `window.slices` slices of raw values (at most 256 each) or
HDR counters; a series scraped as protobuf keeps its native counts too (native_counts.py: 8
bytes per populated native bucket). The number of series is capped by `labels.max_series`, and so is each counter's
number of rows; tenants by `labels.max_tenants` per (model, route).

Label expiry (`labels.expire_seconds`): every reader's or other role's lock (`held`) first
checks the clock; at most every `expire_seconds / guard.EPOCHS` it starts a new epoch of the
guard (`expire_labels`), whose freed values take their series and counter rows with them (as
Prometheus marks a series stale once it is gone: a value that comes back starts from zero,
which `rate()` reads as a counter reset). Zero gauge rows go too; a call in flight keeps its.
"""

from __future__ import annotations

import threading
from array import array
from collections import deque
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from .. import names
from ..config.settings import Config
from .clock import SYSTEM, Clock
from . import exemplar
from .exemplar import Exemplar
from .guard import EPOCHS, Expired, LabelGuard
from .histogram import Histogram, WindowPart
from .native_counts import Frozen, NativeCounts, native_table
from .schema import Schema
from .series import FamilyState, Series

#: Values a series holds before it folds them into its histogram in the caller's thread.
PENDING_MAX = 64

#: Label values of a counter row, in its counter's label order.
Row = tuple[str, ...]
#: Every counter's rows, by counter name (names.COUNTERS).
Rows = dict[str, dict[Row, int]]
#: A series across processes: (family name, label values in the family's sorted label order).
SeriesKey = tuple[str, tuple[str, ...]]


class Taken(NamedTuple):
    """What a push worker's store held since its previous take."""

    histograms: dict[SeriesKey, Histogram]
    #: same keys -> `le` bucket position -> latest exemplar of that bucket
    exemplars: dict[SeriesKey, dict[int, Exemplar]]
    #: every counter's rows; a gauge's are its current values
    rows: Rows

class Snapshot(NamedTuple):
    """A series with private copies of its histogram and exemplars (a reader's snapshot)."""

    series: Series
    hist: Histogram
    exemplars: dict[int, Exemplar] | None
    #: For a protobuf reader: a copy of the kept native counts, or counts to seed (`counts`
    #: None) from `hist`; None for the other readers.
    native: Frozen | NativeCounts | None = None


class Counts(NamedTuple):
    """A consistent copy of the counter rows and the series count."""

    rows: Rows
    series: int

    def value(self, counter: names.Counter, *labels: str) -> int:
        """One row's count (0 where it was never counted)."""
        return self.rows[counter.name].get(labels, 0)


def no_rows() -> Rows:
    return {counter.name: {} for counter in names.COUNTERS}


class _Held:
    """`with store.held:` for the readers and the other roles (which a finaliser never
    re-enters)."""

    __slots__ = ("store",)

    def __init__(self, store: "Store"):
        self.store = store

    def __enter__(self) -> None:
        store = self.store
        if not store._acquire():
            raise RuntimeError("the store's lock was re-entered by a reader")
        if store.epoch_ns and store.clock.monotonic_ns() >= store.next_epoch_ns:
            try:
                store.expire_labels()
            except Exception:  # (never fails the reader: counted)
                store._drop_locked(names.DROP_INTERNAL)

    def __exit__(self, *exc: object) -> None:
        self.store._release()


class Store:
    """All metric state of one process (or, in the aggregator, of all pushing workers)."""

    def __init__(self, config: Config | None = None, clock: Clock = SYSTEM):
        self.config = config = config or Config()
        self.clock = clock
        self.schema = Schema(config)
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding the lock
        #: Work queued because its thread held the lock: (function, arguments).
        self._deferred: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self.held = _Held(self)
        self.rows: Rows = no_rows()
        self.guard = LabelGuard(config.labels, self.rows)
        self.families: dict[str, FamilyState] = {
            name: FamilyState(spec) for name, spec in self.schema.families.items()}
        self.keep = config.window.slices
        self.slice_ns = int(config.window.seconds / config.window.slices * 1e9)
        self.series_count = 0
        #: Series changed since a reader last took them.
        self.dirty: set[Series] = set()
        #: The guard's epochs (0: labels never expire), and when the next one starts.
        self.epoch_ns = int(config.labels.expire_seconds * 1e9 / EPOCHS)
        self.next_epoch_ns = clock.monotonic_ns() + self.epoch_ns
        #: How many times series or rows were removed (readers with caches compare it).
        self.removals = 0
        #: When it was created, empty (Unix time): a renderer built later (at a process's first
        #: scrape) dates the debuts and created timestamps of what it finds from here.
        self.born = clock.time()

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

    def locked(self, work: Callable[..., None], *args: Any) -> None:
        """Run `work(*args)` under the lock, or queue it when this thread holds the lock
        already (a finaliser); a failure is a counted drop, never raised."""
        try:
            if not self._acquire():
                self._deferred.append((work, args))
                return
            try:
                work(*args)
            finally:
                self._release()
        except Exception:
            self.count_drop(names.DROP_INTERNAL)

    def _run_deferred(self) -> None:
        while self._deferred:
            try:
                work, args = self._deferred.popleft()
            except IndexError:
                return
            try:
                work(*args)
            except Exception:
                self._drop_locked(names.DROP_INTERNAL)

    def reset_after_fork(self) -> None:
        """In a forked child only the forking thread survives: a lock another thread held at
        fork time would never be released, and the calls other threads had in flight never
        end here. The recorded data stays (as prometheus_client's single-process mode keeps
        it); the lock is new and the gauges start at 0."""
        self._lock = threading.Lock()
        self._owner = None
        self._deferred.clear()
        for counter in names.COUNTERS:
            if counter.gauge:
                rows = self.rows[counter.name]
                for row in rows:
                    rows[row] = 0

    # --- writing (under the lock) ---------------------------------------------------------

    def count_drop(self, reason: str) -> None:
        """Count one value, series or call not recorded (never raises, never deadlocks)."""
        try:
            if not self._acquire():
                self._deferred.append((self._drop_locked, (reason,)))
                return
            try:
                self._drop_locked(reason)
            finally:
                self._release()
        except Exception:  # pragma: no cover - the lock itself is broken
            pass

    def _drop_locked(self, reason: str) -> None:
        drops = self.rows[names.SELF_DROPS]
        drops[(reason,)] = drops.get((reason,), 0) + 1

    def add_row(self, counter: names.Counter, row: Row, n: int = 1) -> Row:
        """Add `n` to a counter's row (its overflow row when it would be a new row past
        `labels.max_series` rows: every counter stays bounded); the row it went to."""
        rows = self.rows[counter.name]
        if row not in rows and len(rows) >= self.config.labels.max_series:
            self.guard.fold(names.FOLD_SERIES, n if counter.counts_folds else 0)
            row = counter.overflow(row)
        rows[row] = rows.get(row, 0) + n
        return row

    def expire_labels(self) -> None:
        """A new epoch of the guard (under the lock): the series and counter rows of the
        values it freed are dropped; the caches of what the guard answered are forgotten, so
        every value in use passes the guard, and is seen, in each epoch."""
        self.next_epoch_ns = self.clock.monotonic_ns() + self.epoch_ns
        expired = self.guard.expire()
        self.forget_label_answers()
        if expired:
            self._drop_expired(expired)

    def forget_label_answers(self) -> None:
        """Forget any cache of the guard's answers (a role that keeps one overrides this)."""

    def _drop_expired(self, expired: Expired) -> None:
        """Drop the series and counter rows carrying a value the guard freed."""
        for state in self.families.values():
            covered = expired.matcher(state.label_names)
            gone = [values for values in state.series if covered(values)]
            for values in gone:
                self.dirty.discard(state.series.pop(values))
            self.series_count -= len(gone)
        for counter in names.COUNTERS:
            rows, covered = self.rows[counter.name], expired.matcher(counter.labels)
            for row in [row for row, n in rows.items()
                        if (n == 0 or not counter.gauge) and covered(row)]:
                del rows[row]
        self.removals += 1

    def series(self, state: FamilyState, values: tuple[str, ...]) -> Series | None:
        """The series of these label values, created (and marked changed) if new; None past
        `labels.max_series` series (a counted drop)."""
        series = state.series.get(values)
        if series is None:
            if self.series_count >= self.config.labels.max_series:
                self._drop_locked(names.DROP_SERIES_LIMIT)
                return None
            series = state.series[values] = Series(state, values)
            self.series_count += 1
        self.dirty.add(series)
        return series

    def observe(self, state: FamilyState, values: tuple[str, ...], value: int,
                slice_id: int) -> Series | None:
        """Append one value to its series' pending batch: the per-value path."""
        if value.__class__ is not int or value < 0:
            self._drop_locked(names.DROP_BAD_VALUE)
            return None
        series = state.series.get(values)
        if series is None:
            series = self.series(state, values)
            if series is None:
                return None
        else:
            self.dirty.add(series)
        if slice_id > series.pending_slice:
            # (a call that ended just before a newer one took the lock joins the newer slice)
            series.fold(self.keep)
            series.pending_slice = slice_id
        series.pending.append(value)
        if len(series.pending) >= PENDING_MAX:
            series.fold(self.keep)
        return series

    # --- the other roles: a push worker's take, the aggregator's merge ------------------------

    def take(self) -> Taken:
        """Everything recorded since the previous take (zeros left behind). The lock is held
        only for pointer swaps: each changed series gets a fresh histogram and the taken one,
        with its pending batch, is folded after it; each counter's rows are swapped for empty
        ones (a gauge's are copied: they are current values). No window is kept: the
        aggregator windows what it receives."""
        with self.held:
            dirty, self.dirty = self.dirty, set()
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
                mine = self.rows[counter.name]
                if counter.gauge:
                    rows[counter.name] = {row: n for row, n in mine.items() if n}
                else:
                    rows[counter.name], self.rows[counter.name] = mine, {}
        out = Taken({}, {}, rows)
        for series, hist, pending, exemplars in taken:
            hist.record_many(pending)
            key = (series.state.family.name, series.values)
            out.histograms[key] = hist
            if exemplars:
                out.exemplars[key] = exemplars
        return out

    def merge(self, histograms: Mapping[SeriesKey, Any],
              exemplars: Mapping[SeriesKey, dict[int, Exemplar]], rows: Rows,
              window: bool = True) -> None:
        """Add what workers took, exactly (HDR add with the straddle counts, exact sums,
        counter rows); with `window`, the histograms also feed the current window slice
        (receive time). Label values pass this store's guard again (without the tenant policy,
        which the worker applied): each worker caps its own values, the aggregator caps their
        union; a fold is counted on the counter that counts the events' folds
        (`names.Counter.counts_folds`), once. Series past `labels.max_series` are dropped and
        counted; counter rows past it fold. A gauge is not added: the aggregator keeps each
        worker's latest value and serves their sum (fleet/gauges.py)."""
        slice_id = self.current_slice() if window else None
        with self.held:
            guard = self.guard
            for (name, values), hist in histograms.items():
                state = self.families[name]
                series = self.series(state, guard.relabel(state.label_names, values))
                if series is None:
                    continue
                series.add(hist, slice_id, self.keep)
                theirs = exemplars.get((name, values))
                if theirs:
                    if series.exemplars is None:
                        series.exemplars = {}
                    exemplar.merge(series.exemplars, theirs)
            for counter in names.COUNTERS:
                counted = rows.get(counter.name)
                if counter.gauge or not counted:
                    continue
                for values, n in counted.items():
                    self.add_row(counter, guard.relabel(counter.labels, values, n,
                                                        counter.counts_folds), n)

    def set_gauge_rows(self, counter: names.Counter, rows: dict[Row, int]) -> None:
        """Replace a gauge family's rows (the aggregator's sum of its live workers' in-flight
        values, fleet/gauges.py): a gauge is set, never added."""
        assert counter.gauge, counter.name
        with self.held:
            self.rows[counter.name] = dict(rows)

    # --- reading (snapshots taken under the lock, used outside it) -----------------------------

    def current_slice(self) -> int:
        """Id of the window slice now (slices are `window.seconds / window.slices` long)."""
        return self.clock.monotonic_ns() // self.slice_ns

    def take_changed(self, native: bool = False) -> tuple[list[Snapshot], int]:
        """The series changed since the previous call, each with private copies of its
        histogram and exemplars (and with `native`, of its native counts), and the current
        window slice id."""
        with self.held:
            dirty, self.dirty = self.dirty, set()
            return self._copies(dirty, native), self.current_slice()

    def window_slices(self, series: Series, current_slice: int) -> list[WindowPart]:
        """Copies of the live window slices of a series."""
        oldest = current_slice - self.keep
        with self.held:
            series.read_fold(self.keep)
            return [part.copy() if isinstance(part, Histogram) else array("q", part)
                    for sid, part in (series.slices or ()) if sid > oldest]

    def snapshot(self, state: FamilyState) -> list[Snapshot]:
        """Every series of a family with copies of its histogram and exemplars."""
        with self.held:
            return self._copies(list(state.series.values()))

    def snapshot_of(self, series_list: Iterable[Series], native: bool = False
                    ) -> list[Snapshot]:
        """These series with copies of their histograms and exemplars (and with `native`, of
        their native counts)."""
        with self.held:
            return self._copies(list(series_list), native)

    def _copies(self, series_list: Iterable[Series], native: bool = False) -> list[Snapshot]:
        """Each series folded and copied; for a protobuf reader (`native`) with a copy of its
        kept native counts, or, where it has none, new ones for this reader alone to seed."""
        out = []
        keep = self.keep
        for series in series_list:
            series.read_fold(keep)
            hist = series.hist
            kept = None
            if native:
                kept = series.native
                if kept is None or kept.counts is None:  # (one reader seeds each)
                    state = series.state
                    table = state.native_table
                    if table is None:
                        table = state.native_table = native_table(
                            state.layout, state.family.scale,
                            self.config.histograms.native_schema)
                    kept = series.native = NativeCounts(table, hist, hist.count)
                else:
                    kept = kept.frozen()
            out.append(Snapshot(series, hist.copy(),
                                dict(series.exemplars) if series.exemplars else None, kept))
        return out

    def series_of(self, state: FamilyState) -> list[Series]:
        """A family's series, in the order they were created (not their histograms)."""
        with self.held:
            return list(state.series.values())

    def all_series(self) -> list[Series]:
        """Every series of every family (not their histograms: see snapshot_of)."""
        with self.held:
            return [series for state in self.families.values()
                    for series in state.series.values()]

    def folded_copies(self, state: FamilyState) -> list[tuple[Series, Histogram]]:
        """Every series of a family with a copy of its up-to-date histogram."""
        return [(taken.series, taken.hist) for taken in self.snapshot(state)]

    def counts(self) -> Counts:
        """Copies of the counter rows and the series count."""
        with self.held:
            return Counts({name: dict(rows) for name, rows in self.rows.items()},
                          self.series_count)
