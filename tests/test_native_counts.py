"""The native counts the store keeps beside each series' HDR counts (record/native_counts.py)
must serve exactly what a conversion of those HDR counts from scratch serves, whatever reached
them: readers' folds, folds in the caller's thread (a full pending batch, a new window slice,
a stream's gap batch), a push worker's take (a new histogram), the aggregator's merges of
deltas (local histograms, and validated pushes as received), at every schema, with the bucket
limit coarsening them, with values of 0 (the zero bucket: its threshold is fixed at 2^-128,
so it holds exactly HDR index 0) and values clamped at the top."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.expose.sample import sample
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import validate, wire
from exporter._internal.fleet.codec import Sparse
from exporter._internal.fleet.take import take
from exporter._internal.record.native_counts import NativeCounts
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.store import PENDING_MAX, Store

FAMILIES = [names.TTFT, names.OUTPUT_TOKENS]  # microseconds served as seconds; tokens


def config(schema: int, max_buckets: int) -> Config:
    base = Config()
    return replace(base, histograms=replace(base.histograms, native_schema=schema,
                                            native_max_buckets=max_buckets))


def value(rng: random.Random, fam: names.Family) -> int:
    """Mostly lognormal, some 0 (the zero bucket), some past the layout's top (clamped)."""
    roll = rng.random()
    if roll < 0.05:
        return 0
    if roll < 0.07:
        return 10 ** 13
    scale = 1e6 if fam is names.TTFT else 1e2
    return int(rng.lognormvariate(0, 1.5) * scale)


def record(store: Store, rng: random.Random, series_keys: list[tuple[str, ...]],
           slice_id: int) -> None:
    """A round of values through the store's own paths, as the recorder makes them."""
    with store.held:
        for fam in FAMILIES:
            state = store.families[fam.name]
            for values in rng.sample(series_keys, len(series_keys) // 2):
                values = values[:len(state.label_names)]
                roll = rng.random()
                n = PENDING_MAX + 6 if roll < 0.1 else rng.randrange(1, 12)
                for _ in range(n):  # past PENDING_MAX: folded in the caller's thread
                    store.observe(state, values, value(rng, fam), slice_id)
                if roll > 0.9:  # a stream's gaps: a batch folded at once in the caller's thread
                    series = store.series(state, values)
                    assert series is not None
                    series.pending.extend(value(rng, fam) for _ in range(rng.randrange(1, 300)))
                    series.fold(store.keep)


def check(store: Store, renderer: Renderer) -> int:
    """Scrape in protobuf; every series' served message and native buckets must be those of
    its HDR counts converted from scratch. Returns how many series had kept counts."""
    renderer.render_protobuf()
    encoder = renderer.encoder
    kept_used = 0
    every = [s for state in store.families.values() for s in state.series.values()]
    for series, hist, exemplars, native in store.snapshot_of(every, native=True):
        fam = series.state.family
        converter = encoder._converters[fam.name]
        if native is not None and native.counts is not None:
            kept_used += 1
        assert converter.convert(hist, native) == converter.convert(hist)
        cached = renderer._cache.get(series)
        if cached is not None and cached.protobuf is not None:
            assert cached.protobuf == encoder.histogram(fam, cached.pairs, sample(
                fam, hist, cached.exemplars), cached.created)
    return kept_used


def keys(n: int) -> list[tuple[str, ...]]:
    # TTFT's labels (model, provider, route, tenant); the token family's are the first three
    return [(f"m{i % 3}", "p", f"r{i % 2}", f"t{i}") for i in range(n)]


@pytest.mark.parametrize("schema, max_buckets", [(5, 320), (8, 40), (0, 320), (-4, 320),
                                                 (3, 6)])
def test_kept_counts_equal_a_conversion_from_scratch(schema: int, max_buckets: int) -> None:
    rng = random.Random(schema * 1000 + max_buckets)
    store = Recorder(config(schema, max_buckets))
    renderer = Renderer(store)
    series_keys = keys(12)
    kept_used = 0
    slice_id = 0
    for round_ in range(40):
        if rng.random() < 0.2:  # a new window slice: the next value folds in the caller's thread
            slice_id += 1
        record(store, rng, series_keys, slice_id)
        if round_ % 7 == 3:  # a text scrape's fold in between: the kept counts follow it
            renderer.render()
        if round_ % 11 == 5:  # a push worker's take: every changed series a new histogram
            take(store)
            # (the renderer is not told of a take: it renders every series again)
            store.dirty.update(s for st in store.families.values() for s in st.series.values())
        kept_used += check(store, renderer)
    assert kept_used > 100  # the kept counts were served, not only reseeded


def test_the_aggregators_merges_keep_them_exact() -> None:
    rng = random.Random(7)
    cfg = config(5, 320)
    aggregator = Recorder(cfg)
    renderer = Renderer(aggregator)
    worker = Recorder(cfg)
    series_keys = keys(10)
    kept_used = 0
    for round_ in range(40):
        record(worker, rng, series_keys, round_ // 4)
        delta = take(worker)
        if round_ % 2:  # as received: validated from the wire, sparse histograms
            delta.worker, delta.seq = "w", round_
            delta = validate.decode(wire.encode(delta, worker.schema.layouts()),
                                    aggregator.schema)
        aggregator.merge(delta.histograms, delta.exemplars, delta.rows)
        kept_used += check(aggregator, renderer)
    assert kept_used > 100


def test_counts_that_fell_behind_are_dropped_not_served() -> None:
    store = Recorder(config(5, 320))
    state = store.families[names.TTFT.name]
    values = ("m", "p", "r", "t")
    with store.held:
        store.observe(state, values, 500_000, 0)
    (snap,) = store.snapshot_of(list(state.series.values()), native=True)
    series = snap.series
    assert snap.native is series.native and snap.native.counts is None  # to seed: this reader
    Renderer(store).encoder._converters[names.TTFT.name].convert(snap.hist, snap.native)
    assert series.native is not None and series.native.counts is not None and sum(series.native.counts) == 1
    with store.held:
        for _ in range(PENDING_MAX):  # folded in the caller's thread: the kept counts lag
            store.observe(state, values, 700_000, 0)
        series.read_fold(store.keep)
    assert series.native is None
    with store.held:
        store.observe(state, values, 700_000, 0)
    (snap,) = store.snapshot_of([series], native=True)
    assert isinstance(snap.native, NativeCounts) and snap.native.counts is None


def test_counts_past_32_bits_widen_as_the_hdr_counts_do() -> None:
    store = Recorder(config(5, 320))
    renderer = Renderer(store)
    state = store.families[names.TTFT.name]
    layout = state.layout
    values = ("m", "p", "r", "t")
    for i, n in ((layout.index(500_000), 3_000_000_000), (layout.index(90_000), 2_000_000_000),
                 (layout.index(500_000), 3_000_000_000), (layout.index(7_000_000), 5)):
        store.merge({(state.family.name, values): Sparse(
            layout, [i], [n], n, n * layout.lowest_equivalent(i))}, {}, {})
        assert check(store, renderer) == 1  # kept (seeded at the first), then followed
    native = state.series[values].native
    assert native is not None and native.counts is not None
    assert native.counts.typecode == "Q" and max(native.counts) == 6_000_000_000
