"""The caller's hot path: a finished call, or agent task, into the store.

Recording happens in the caller's thread at the end of each call: derive the values (outside
the lock), then one lock acquisition to count the call and append each value to its series'
small pending batch. The HDR bucket indexing of a batch (the costly part, ~0.15 µs a value in
Python) runs when a reader takes the series, or in the caller's thread only once a batch is
full or its window slice ended. Nothing here raises into the caller: a failure is a counted
drop. The per-call families are those of `names.HISTOGRAMS` with a `per_call` field: each is
recorded from that field of `timeline.Derived`.

The other roles write the same store through its own operations (`Store.take`, `Store.merge`);
which role a process plays is decided in runtime.py, not here.
"""

from __future__ import annotations

from bisect import bisect_left
from threading import get_ident
from typing import Any

from .. import names
from ..config.settings import Config
from .clock import SYSTEM, Clock
from .series import Series
from .store import PENDING_MAX, Store
from .tasks import TaskSummary
from .timeline import CallTimeline, Derived, derive

US_PER_SECOND = names.US_PER_SECOND

#: (model, provider, route): the key of the in-flight gauge.
InFlightKey = tuple[str, str, str]
_UNKNOWN_KEY: InFlightKey = (names.UNKNOWN, names.UNKNOWN, names.UNKNOWN)
_FINISH_REASONS = names.FINISH_REASONS_TOTAL.name
_USAGE = ((names.USAGE_INPUT_TOKENS, Derived._fields.index("input_tokens")),
          (names.USAGE_CACHED_INPUT_TOKENS, Derived._fields.index("cached_input_tokens")))

#: The per-value loop's common case in C (_hotrecord.c; setup.py builds it where a compiler is
#: found), or None: `_record_locked` then runs it in Python.
append_in_c: Any
try:
    from ._hotrecord import append as append_in_c
except ImportError:
    append_in_c = None


class Recorder(Store):
    """The store of one process, with the caller's recording operations."""

    def __init__(self, config: Config | None = None, clock: Clock = SYSTEM):
        super().__init__(config, clock)
        #: (model, provider, route) triples the guard keeps as they are (clean, within the
        #: caps): a set lookup per call instead of six guard calls. Only values whose guard
        #: calls have no effect are here (never a folded, replaced or counted value).
        self._kept: set[tuple[str, str, str]] = set()
        #: (model, provider, route, tenant) of a call -> the labels it records: the triple is
        #: in `_kept` and the guard keeps the tenant unchanged (raw or allow-listed, not hashed
        #: or folded; once it answered a value with itself, it always does), or the tenant is
        #: empty (recorded as `unknown`, the guard not asked).
        self._kept_calls: dict[tuple[str, str, str, str], tuple[str, str, str, str]] = {}
        #: Recorded (model, provider, route, tenant) -> the series of each of `_observations`
        #: (None until a value made it): no label tuple built and looked up per value. Series
        #: are removed only at the guard's epochs, which empty all three caches
        #: (`forget_label_answers`); bounded by `labels.max_series`.
        self._call_series: dict[tuple[str, str, str, str], list[Series | None]] = {}
        #: What a call observes, in one loop: (family state, index of its value in Derived,
        #: None) for every per-call family, then (the phase family's state, None, phase) for
        #: every phase.
        phase_state = self.families[names.PHASE_FAMILY.name]
        self._observations = tuple(
            (self.families[fam.name], Derived._fields.index(fam.per_call), None)
            for fam in names.HISTOGRAMS if fam.per_call) + tuple(
            (phase_state, None, phase) for phase in names.PHASES)
        #: Where each observation's value is, for the C loop: its index in Derived, or its phase.
        self._value_keys = tuple(phase if field is None else field
                                 for _, field, phase in self._observations)
        self._every_observation = range(len(self._observations))

    def forget_label_answers(self) -> None:
        """At each of the guard's epochs (under the lock): the next call of every label set asks
        the guard again, which sees its values in use, and finds its series anew."""
        self._kept.clear()
        self._kept_calls.clear()
        self._call_series.clear()

    # --- recording (caller's thread; never raises) -----------------------------------------

    def started(self, model: str, provider: str, route: str) -> InFlightKey:
        """Count a call in flight; returns the key to pass back to `record_call`. The lock is
        taken as `Store._acquire` takes it, inline (two Python calls less a call)."""
        try:
            me = get_ident()
            if self._owner == me:  # a finaliser inside this thread's locked section
                return _UNKNOWN_KEY
            self._lock.acquire()
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
                in_flight = self.rows[names.REQUESTS_IN_FLIGHT]
                if key in in_flight:
                    in_flight[key] += 1
                    return key
                return self.add_row(names.IN_FLIGHT, key)  # type: ignore[return-value]
            finally:
                if self._deferred:  # queued by a finaliser while we held the lock
                    self._run_deferred()
                self._owner = None
                self._lock.release()
        except Exception:
            self.count_drop(names.DROP_INTERNAL)
            return _UNKNOWN_KEY

    def record_call(self, t: CallTimeline, in_flight_key: InFlightKey | None = None,
                    derived: Derived | None = None) -> None:
        """Record every metric of one finished call (`derived`: `derive(t)`, if already done).
        The lock is taken as `Store.locked` takes it, inline (two Python calls less a call)."""
        try:
            if derived is None:
                derived = derive(t)
            me = get_ident()
            if self._owner == me:  # a finaliser inside this thread's locked section: queued
                self._deferred.append((self._finish_locked, (t, in_flight_key, derived)))
                return
            self._lock.acquire()
            self._owner = me
            try:
                if self._deferred:
                    self._run_deferred()
                in_flight = self.rows[names.REQUESTS_IN_FLIGHT]  # (`_finish_locked`, inline)
                if in_flight_key is not None and in_flight.get(in_flight_key, 0) > 0:
                    in_flight[in_flight_key] -= 1
                self._record_locked(t, derived)
            finally:
                if self._deferred:  # queued by a finaliser while we held the lock
                    self._run_deferred()
                self._owner = None
                self._lock.release()
        except Exception:
            self.count_drop(names.DROP_INTERNAL)

    def record_task(self, summary: TaskSummary) -> None:
        """Record every metric of one finished agent task (tasks.summarize), under one lock."""
        self.locked(self._task_locked, summary)

    def _finish_locked(self, t: CallTimeline, in_flight_key: InFlightKey | None,
                       d: Derived) -> None:
        in_flight = self.rows[names.REQUESTS_IN_FLIGHT]
        if in_flight_key is not None and in_flight.get(in_flight_key, 0) > 0:
            in_flight[in_flight_key] -= 1  # an idle row stays, at 0 (its rows are bounded)
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
        raw = (t.model, t.provider, t.route, t.tenant)
        with_tenant = self._kept_calls.get(raw)
        if with_tenant is not None:  # the guard would return every value as it is
            model, provider, route, tenant = with_tenant
            base = (model, provider, route)
        else:
            model, provider, route = base = raw[:3]
            if base not in self._kept:
                model, provider, route = base = self._keep_if_same(base, (
                    guard.value(names.MODEL, model), guard.value(names.PROVIDER, provider),
                    guard.value(names.ROUTE, route)))
            raw_tenant = raw[3]
            tenant = names.UNKNOWN if raw_tenant is None or raw_tenant == "" else \
                guard.tenant(model, route, raw_tenant)
            with_tenant = (model, provider, route, tenant)
            if (tenant is raw_tenant and raw_tenant.__class__ is str and
                    raw_tenant != names.OTHER_TENANT or raw_tenant is None or raw_tenant == "") \
                    and base == raw[:3] and base in self._kept \
                    and len(self._kept_calls) < self.config.labels.max_series:
                self._kept_calls[raw] = with_tenant  # type: ignore[index]
        outcome = t.outcome if t.outcome in names.OUTCOMES else names.ERROR
        rows = self.rows
        requests = rows[names.REQUESTS_TOTAL]
        key = (model, outcome, provider, route, tenant)
        if key in requests:
            requests[key] += 1
        else:
            key = self.add_row(names.REQUESTS, key)
        if t.finish_reason is not None:
            reasons = rows[_FINISH_REASONS]
            row = (names.finish_reason(t.finish_reason), model, provider, route)
            if row in reasons:  # (add_row's common case inline)
                reasons[row] += 1
            else:
                self.add_row(names.FINISH_REASONS_TOTAL, row)
        if t.retries:
            self._retries(t.retries, model, provider, route)
        if d.input_tokens is not None or d.cached_input_tokens is not None:
            self._usage(key, d)
        if t.upstream_address or t.upstream_region or t.fingerprint:
            unknown = names.UNKNOWN
            address, region, fingerprint = guard.upstream(
                model, t.upstream_address or unknown, t.upstream_region or unknown,
                t.fingerprint or unknown)
            self.add_row(names.UPSTREAMS, (address, fingerprint, model, provider, region, route))
        end = t.end if t.end is not None else self.clock.monotonic_ns()
        slice_id = end // self.slice_ns
        observe = self.observe
        dirty = self.dirty
        trace_id = t.trace_id
        phases = d.phases
        known = self._call_series.get(with_tenant)
        if known is None:
            known = [None] * len(self._observations)
            if len(self._call_series) < self.config.labels.max_series:
                self._call_series[with_tenant] = known
        observations = self._observations
        if append_in_c is None or trace_id:  # (an exemplar per value: the Python loop's)
            left = self._every_observation
        else:  # the values the C loop left: a new series or slice, a bad value
            left = append_in_c(self._value_keys, known, d, slice_id, dirty, self.keep,
                               PENDING_MAX) or ()
        for at in left:
            state, field, phase = observations[at]
            value = d[field] if phase is None else phases.get(phase)
            if value is None:
                continue
            series = known[at]
            if series is not None and value.__class__ is int and value >= 0 \
                    and slice_id <= series.pending_slice:
                # `observe`'s common case inline (a valid value, a known series, the same
                # window slice): one Python call less per value
                dirty.add(series)
                pending = series.pending
                pending.append(value)
                if len(pending) >= PENDING_MAX:
                    series.fold(self.keep)
            else:
                if phase is None:
                    values = with_tenant if state.has_tenant else base
                else:  # label order (model, phase, provider, route[, tenant]) is the sorted one
                    values = (model, phase, provider, route, tenant) if state.has_tenant else \
                        (model, phase, provider, route)
                series = observe(state, values, value, slice_id)
                if series is not None:
                    known[at] = series
            if trace_id and series is not None and state.windowed:
                self._exemplar(series, value, trace_id)
        if d.gaps:  # already a batch: fold it at once
            state = self.families[names.ITL.name]
            series = self.series(state, with_tenant if state.has_tenant else base)
            if series is not None:
                series.pending.extend(d.gaps)
                series.fold(self.keep)

    def _retries(self, retries: dict[str, int], model: str, provider: str, route: str) -> None:
        """Count a call's retried attempts by what ended them (the labels of its requests
        row, tenant aside)."""
        for reason, n in retries.items():
            if reason not in names.RETRY_REASONS:
                reason = names.RETRY_OTHER
            if n.__class__ is int and n > 0:
                self.add_row(names.RETRIES, (model, provider, reason, route), n)

    def _usage(self, request_key: tuple[str, ...], d: Derived) -> None:
        """Add a call's usage to its tenant's counters (the requests row's labels, so the rows
        fold exactly as the requests counter's do)."""
        model, _, provider, route, tenant = request_key
        rows = self.rows
        row = (model, provider, route, tenant)
        for name, field in _USAGE:
            value = d[field]
            if value.__class__ is int and value >= 0:
                usage = rows[name]
                if row in usage:
                    usage[row] += value
                else:
                    self.add_row(names.COUNTERS_BY_NAME[name], row, value)

    def _task_locked(self, s: TaskSummary) -> None:
        task = self.guard.value(names.TASK, s.name)
        slice_id = s.end // self.slice_ns
        families, observe, key = self.families, self.observe, (task,)
        for fam, value in ((names.TASK_DURATION, s.duration), (names.TASK_STEPS, s.steps),
                           (names.TASK_CRITICAL_PATH, s.critical_path)):
            observe(families[fam.name], key, value, slice_id)
        state = families[names.TASK_TIME.name]
        for kind, value in s.kinds.items():
            observe(state, (kind, task), value, slice_id)  # (kind, task): sorted label order
        outcome = s.outcome if s.outcome in names.OUTCOMES else names.ERROR
        self.add_row(names.TASKS_TOTAL, (s.deadline, outcome, task))
        self.add_row(names.TASK_WATERFALL_CALLS, key, s.waterfall_calls)
        if s.deadline != names.DEADLINE_NONE:  # rows at 0 too: "no late call" is an answer
            self.add_row(names.TASK_LATE_CALLS, key, s.late_calls)
            self.add_row(names.TASK_ORPHAN_TOKENS, key, s.orphan_tokens)

    def _exemplar(self, series: Series, value: int, trace_id: str) -> None:
        """Keep the call's trace id as the exemplar of the `le` bucket its value falls in."""
        layout = series.state.layout
        position = bisect_left(layout.boundaries, min(value, layout.highest))
        if series.exemplars is None:
            series.exemplars = {}
        series.exemplars[position] = (trace_id, series.state.family.to_unit(value),
                                      self.clock.time())

