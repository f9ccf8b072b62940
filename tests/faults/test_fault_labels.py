"""Faults: hostile or unbounded label values. Nothing unbounded, every call still counted."""

from __future__ import annotations

import gc
import tracemalloc

import exporter
from exporter._internal import names, runtime
from exporter._internal.config.loader import load
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.guard import INVALID
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

LIMITS = {"labels": {"max_series": 500, "max_models": 10, "max_routes": 20,
                     "max_providers": 4, "max_tenants": 5}}


class Unprintable:
    """A label value whose str() raises (a lazy object, a broken __str__)."""

    def __str__(self) -> str:
        raise RuntimeError("no string for you")


def test_a_label_whose_str_raises_is_replaced_and_the_call_counted():
    with exporter.labels(route=Unprintable(), tenant=Unprintable()):  # type: ignore[arg-type]
        with exporter.track(model="m", provider="p") as call:
            call.token()
    counters = runtime.state().recorder.counts()
    assert counters.rows[names.REQUESTS_TOTAL] == {("m", names.OK, "p", INVALID, INVALID): 1}
    assert counters.value(names.DROPPED, names.DROP_BAD_LABEL) == 2
    assert counters.value(names.DROPPED, names.DROP_INTERNAL) == 0


def call(rec: Recorder, i: int, model: str, route: str, tenant: str, provider: str = "p"):
    key = rec.started(model, provider, route)
    t = CallTimeline(start=0, model=model, provider=provider, route=route, tenant=tenant,
                     input_tokens=1000, cached_input_tokens=i % 1000,
                     upstream_address=f"10.{i % 250}.0.{i % 7}:443", fingerprint=f"fp_{i}")
    t.token(1_000_000 + i)
    t.end = 2_000_000
    t.outcome = names.OK
    rec.record_call(t, key)


def assert_bounded(rec: Recorder) -> None:
    """The bounds of docs/metrics.md ("Memory and scrape bounds")."""
    lab = rec.config.labels
    counters = rec.counts()
    assert counters.series <= lab.max_series
    assert sum(len(s.series) for s in rec.families.values()) == counters.series
    assert len(counters.rows[names.REQUESTS_TOTAL]) <= lab.max_series + len(names.OUTCOMES)
    assert len(counters.rows[names.REQUESTS_IN_FLIGHT]) <= lab.max_series + 1
    for rows in (counters.rows[names.USAGE_INPUT_TOKENS],
                 counters.rows[names.USAGE_CACHED_INPUT_TOKENS],
                 counters.rows[names.UPSTREAM_REQUESTS]):
        assert len(rows) <= lab.max_series + 1
    identity = [names.UPSTREAM_LABELS.index(label)
                for label in (names.ADDRESS, names.FINGERPRINT, names.REGION)]
    assert len({tuple(k[i] for i in identity) for k in counters.rows[names.UPSTREAM_REQUESTS]}
               ) <= (lab.max_models + 1) * lab.max_upstreams + 1
    assert len({k[0] for k in counters.rows[names.REQUESTS_TOTAL]}) <= lab.max_models + 1
    assert len({k[3] for k in counters.rows[names.REQUESTS_TOTAL]}) <= lab.max_routes + 1
    assert len({k[2] for k in counters.rows[names.REQUESTS_TOTAL]}) <= lab.max_providers + 1
    assert len(counters.rows[names.SELF_TENANT_FOLDS]) <= \
        (lab.max_models + 1) * (lab.max_routes + 1)
    guard = rec.guard
    assert sum(len(v) for v in guard._seen.values()) <= \
        lab.max_models + lab.max_routes + lab.max_providers
    assert sum(len(v) for v in guard._tenants.values()) <= lab.max_series


def memory_bound(rec: Recorder) -> int:
    """docs/metrics.md, "Memory and scrape bounds": the worst case of every part."""
    lab, window = rec.config.labels, rec.config.window
    counts_len = max(s.layout.counts_len for s in rec.families.values())
    per_series = (1 + window.slices) * counts_len * 4 + 1024  # counters, slices, key, object
    rows = 5 * lab.max_series + len(names.OUTCOMES) + 4
    values = lab.max_series + lab.max_models + lab.max_routes + lab.max_providers
    upstreams = (lab.max_models + 1) * lab.max_upstreams * 450
    return lab.max_series * per_series + rows * 300 + values * 2 * 150 + upstreams + 2**20


def test_hundreds_of_thousands_of_routes_models_and_tenants_stay_bounded():
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rec = Recorder(load(LIMITS))
    for i in range(50_000):  # every call a new model, route and tenant (a hostile provider)
        call(rec, i, f"model-{i}", f"/route/{i}", f"tenant-{i}", provider=f"p{i % 9}")
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held <= memory_bound(rec), (held, memory_bound(rec))
    assert_bounded(rec)
    counters = rec.counts()
    # every call counted, none dropped
    assert sum(counters.rows[names.REQUESTS_TOTAL].values()) == 50_000
    assert counters.value(names.FOLDS_BY_LABEL, names.MODEL) == 50_000 - 10
    assert counters.value(names.FOLDS_BY_LABEL, names.ROUTE) > 0
    assert counters.value(names.FOLDS_BY_LABEL, names.PROVIDER) > 0
    assert counters.value(names.FOLDS_BY_LABEL, names.FOLD_UPSTREAM) > 0
    assert sum(counters.rows[names.UPSTREAM_REQUESTS].values()) == 50_000
    body = Renderer(rec).render()
    assert len(body) < 4 * 2**20  # a bounded scrape (docs/metrics.md: a few MB at most)


def test_the_aggregator_bounds_the_union_of_its_workers():
    config = load(LIMITS)
    agg = Aggregator(config)
    for w in range(6):  # each worker within its own caps, their union far beyond them
        worker = Recorder(config)
        for i in range(300):
            call(worker, i, f"w{w}m{i % 10}", f"w{w}r{i % 20}", f"w{w}t{i}")
        worker.started(f"w{w}m0", "p", f"w{w}r0")  # a call in flight at each worker
        delta = take(worker)
        delta.worker, delta.seq, delta.interval = f"w{w}", 1, 5.0
        status, _ = agg.accept(wire.encode(delta, worker.schema.layouts()))
        assert status == 200
    assert_bounded(agg.recorder)
    counters = agg.recorder.counts()
    assert sum(counters.rows[names.REQUESTS_TOTAL].values()) == 6 * 300
    assert sum(counters.rows[names.REQUESTS_IN_FLIGHT].values()) == 6
