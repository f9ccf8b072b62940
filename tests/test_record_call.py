"""`Recorder.record_call` takes shortcuts on the caller's path: label sets the guard keeps
unchanged skip it, and each recorded label set keeps its series per family and phase (no
label tuple built and looked up per value). What it records must be exactly what asking the
guard and `Store.observe` for every value records: the same series, counts, sums, pending
batches (so the same folds), rows and drops, across label sets past the caps, missing stamps,
new window slices and `labels.max_series` (past which a label set's series are not kept).
Every test runs twice: with the per-value loop's common case in C (_hotrecord.c, which
`make test` builds) and all in Python, as a build without a compiler runs it."""

from __future__ import annotations

import random

import pytest

from exporter._internal import names
from exporter._internal.config.settings import Config, LabelConfig
from exporter._internal.record import recorder as recorder_module
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.store import Store
from exporter._internal.record.timeline import CallTimeline, derive
from tests.support.c_parts import built_in_c


@pytest.fixture(autouse=True, params=["c", "python"])
def append_loop(request, monkeypatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(recorder_module, "append_in_c", None)
    elif not built_in_c("_hotrecord.append", recorder_module.append_in_c is not None):
        pytest.skip("no C compiler here: the package runs the Python loop")
    return request.param


def reference(store: Store, t: CallTimeline) -> None:
    """One call as the guard and observe record it, value by value."""
    guard = store.guard
    model, provider, route = (guard.value(names.MODEL, t.model),
                              guard.value(names.PROVIDER, t.provider),
                              guard.value(names.ROUTE, t.route))
    tenant = names.UNKNOWN if not t.tenant else guard.tenant(model, route, t.tenant)
    store.add_row(names.REQUESTS, (model, t.outcome, provider, route, tenant))
    for reason, n in (t.retries or {}).items():
        known = reason if reason in names.RETRY_REASONS else names.RETRY_OTHER
        store.add_row(names.RETRIES, (model, provider, known, route), n)
    d = derive(t)
    slice_id = t.end // store.slice_ns
    with store.held:
        for fam in names.HISTOGRAMS:
            if not fam.per_call or d[type(d)._fields.index(fam.per_call)] is None:
                continue
            state = store.families[fam.name]
            values = (model, provider, route, tenant)[:len(state.label_names)]
            store.observe(state, values, d[type(d)._fields.index(fam.per_call)], slice_id)
        state = store.families[names.PHASE_FAMILY.name]
        for phase in names.PHASES:
            if phase in d.phases:
                values = (model, phase, provider, route, tenant)[:len(state.label_names)]
                store.observe(state, values, d.phases[phase], slice_id)


def assert_same_series(recorder: Recorder, store: Store) -> None:
    """The same series in every family, with the same counts, sums and pending batches."""
    for name, state in recorder.families.items():
        theirs = store.families[name].series
        assert state.series.keys() == theirs.keys(), name
        for values, series in state.series.items():
            other = theirs[values]
            assert (series.hist.count, series.hist.total, series.pending) == \
                (other.hist.count, other.hist.total, other.pending), (name, values)


def test_record_call_records_what_observe_records_value_by_value() -> None:
    labels = LabelConfig(max_tenants=4, max_models=3, max_series=30)
    recorder, store = Recorder(Config(labels=labels)), Store(Config(labels=labels))
    rng = random.Random(4)
    now = 10**12
    for _ in range(3000):
        now += rng.randrange(1, 4) * 10**9  # window slices go by
        stamps = sorted(now + rng.randrange(0, 10**9) for _ in range(5))
        missing = rng.random()
        t = CallTimeline(
            start=now, model=rng.choice(["m1", "m2", "m3", "m4", "m\n5"]), provider="p",
            route=rng.choice(["/a", "/b"]),
            tenant=rng.choice(["t1", "t2", "t3", "t4", "t5", "t6", "", names.OTHER_TENANT]),
            dispatched=stamps[0], connected=None if missing < 0.3 else stamps[1],
            sent=stamps[2], headers=stamps[3], end=stamps[4],
            input_tokens=rng.choice([None, 0, 120]), output_tokens=rng.choice([None, 3, 40]),
            max_tokens=rng.choice([None, 256]), outcome=names.OK)
        recorder.record_call(t)
        reference(store, t)
    assert_same_series(recorder, store)
    assert recorder.rows[names.REQUESTS_TOTAL] == store.rows[names.REQUESTS_TOTAL]
    assert recorder.rows[names.SELF_DROPS] == store.rows[names.SELF_DROPS]
    assert recorder.series_count == store.series_count == 30  # past max_series: drops


def test_streamed_calls_with_every_value_present_or_absent() -> None:
    # streamed calls with reasoning, decode and inter-token gaps, the server's own queue and
    # prefill, next to calls missing any subset of the values, with and without a tenant,
    # record what the value-by-value
    # reference records; a trace id leaves its exemplar on the windowed families only
    labels = LabelConfig(max_tenants=4, max_models=3, max_series=400)
    recorder, store = Recorder(Config(labels=labels)), Store(Config(labels=labels))
    rng = random.Random(23)
    now = 10**12
    for i in range(2000):
        now += rng.randrange(1, 3) * 10**9
        stamps = sorted(now + rng.randrange(0, 10**9) for _ in range(9))
        t = CallTimeline(
            start=now, model=rng.choice(["m1", "m2"]), provider="p", route="/a",
            tenant=rng.choice(["t1", "t2", ""]),
            **{name: stamps[k] for k, name in enumerate(
                ("dispatched", "connected", "sent", "headers")) if rng.random() < 0.8},
            end=stamps[8], input_tokens=rng.choice([None, 0, 120]),
            output_tokens=rng.choice([None, 1, 40]), cached_input_tokens=rng.choice([None, 8]),
            max_tokens=rng.choice([None, 256]), outcome=names.OK,
            trace_id=f"{i:032x}" if rng.random() < 0.5 else None,
            server_queue=rng.choice([None, 0, 30 * 10**6]),
            server_prefill=rng.choice([None, 120 * 10**6, 2 * 10**9]))
        if rng.random() < 0.3:  # retried: failed attempts before the final one
            t.attempt_start = now + (stamps[0] - now) // 2
            t.retries = {names.RETRY_OVERLOADED: 1, rng.choice(["timeout", "bogus"]): 2}
        if rng.random() < 0.7:
            for at in stamps[4:4 + rng.randrange(1, 5)]:
                t.token(at, rng.choice([names.CONTENT, names.REASONING]))
        recorder.record_call(t)
        reference(store, t)
    windowed = {name for name, state in recorder.families.items() if state.windowed}
    for name, state in recorder.families.items():
        theirs = store.families[name].series
        if name == names.ITL.name:
            continue  # the gaps: a batch of their own, not in the reference
        assert state.series.keys() == theirs.keys(), name
        for values, series in state.series.items():
            other = theirs[values]
            assert (series.hist.count, series.hist.total, series.pending) == \
                (other.hist.count, other.hist.total, other.pending), (name, values)
            assert (series.exemplars is not None) <= (name in windowed), name
    assert any(s.exemplars for name in windowed for s in recorder.families[name].series.values())
    for family in (names.SERVER_QUEUE, names.SERVER_PREFILL, names.OUTSIDE_SERVER):
        assert recorder.families[family.name].series, family.name
    assert any(values[1] == "retry" for values in
               recorder.families[names.PHASE_FAMILY.name].series)
    assert recorder.rows[names.REQUESTS_TOTAL] == store.rows[names.REQUESTS_TOTAL]
    retried = recorder.rows[names.RETRIES.name]
    assert retried == store.rows[names.RETRIES.name]
    assert {reason for _, _, reason, _ in retried} == {"overloaded", "timeout", "other"}
    assert recorder.rows[names.SELF_DROPS] == store.rows[names.SELF_DROPS]


def test_a_full_batch_folds_on_the_callers_thread_as_observe_folds_it() -> None:
    # calls of one label set within one window slice: each series' batch fills up
    # (PENDING_MAX) and folds into its histogram before any reader takes it
    recorder, store = Recorder(Config()), Store(Config())
    now = 10**12
    for i in range(300):
        t = CallTimeline(start=now + i, model="m", provider="p", route="/a", tenant="t",
                         dispatched=now + i + 1000, sent=now + i + 9000,
                         headers=now + i + 10**6 + i, end=now + i + 2 * 10**6,
                         output_tokens=40, outcome=names.OK)
        recorder.record_call(t)
        reference(store, t)
    assert_same_series(recorder, store)
    server_phase = recorder.families[names.PHASE_FAMILY.name].series[("m", "server", "p", "/a")]
    assert server_phase.hist.count == 256 and len(server_phase.pending) == 300 - 256


def test_the_retry_reason_is_a_closed_label_on_the_wire() -> None:
    # a worker's retries reach the aggregator; a push with a reason of no known kind is refused
    from exporter._internal.fleet import wire
    from exporter._internal.fleet.take import take
    from exporter._internal.fleet.validate import PushError, decode

    worker = Recorder()
    t = CallTimeline(start=10**12, model="m", provider="p", route="/a", dispatched=10**12 + 9,
                     end=10**12 + 10**6, outcome=names.OK, attempt_start=10**12 + 5,
                     retries={names.RETRY_RATE_LIMITED: 2})
    worker.record_call(t)
    delta = take(worker)
    delta.worker, delta.seq = "w1", 1
    layouts, schema = worker.schema.layouts(), Recorder().schema
    row = ("m", "p", names.RETRY_RATE_LIMITED, "/a")
    assert decode(wire.encode(delta, layouts), schema).rows[names.RETRIES.name] == {row: 2}
    delta.rows[names.RETRIES.name] = {("m", "p", "teapot", "/a"): 1}
    with pytest.raises(PushError, match="unknown label value 'teapot'"):
        decode(wire.encode(delta, layouts), schema)
