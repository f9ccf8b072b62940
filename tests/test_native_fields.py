"""The renderer keeps each series' native fields between protobuf scrapes (expose/native_fields.py):
reused whole when its counts did not change, their layout reused when only the counts did.
Whatever changed the counts in between (readers' folds, folds in the caller's thread, a push
worker's take, the aggregator's merges of deltas as received, a journal's restore), the served
message must be byte for byte the one encoded from scratch from the series' HDR counts."""

from __future__ import annotations

import random
from dataclasses import replace

from exporter._internal import names
from exporter._internal.config.settings import AggregatorConfig
from exporter._internal.expose.native_fields import NativeFields, fields
from exporter._internal.expose.sample import sample
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.store import PENDING_MAX, Store
from tests.test_native_counts import FAMILIES, config, keys


class Paths:
    """How each series' native fields were last served: reused whole, from a kept layout."""

    def __init__(self) -> None:
        self.reused = self.layout = self.checked = 0


def record(store: Store, rng: random.Random, series_keys: list[tuple[str, ...]],
           slice_id: int) -> None:
    """Values on some series: mostly few distinct ones (their buckets stay populated: the
    kept layout serves them), some anywhere (new buckets), some past PENDING_MAX or a new
    window slice (folded in the caller's thread: the kept counts are dropped and reseeded)."""
    with store.held:
        for fam in FAMILIES:
            state = store.families[fam.name]
            scale = 1_000_000 if fam is names.TTFT else 100
            for i, values in enumerate(rng.sample(series_keys, len(series_keys) // 2)):
                values = values[:len(state.label_names)]
                steady = [int(scale * 1.3 ** j) for j in range(i % 5, i % 5 + 4)]
                roll = rng.random()
                n = PENDING_MAX + 3 if roll < 0.05 else rng.randrange(1, 6)
                for _ in range(n):
                    value = rng.choice(steady) if rng.random() < 0.9 else \
                        int(rng.lognormvariate(0, 1.5) * scale)
                    store.observe(state, values, 0 if rng.random() < 0.03 else value, slice_id)


def check(store: Store, renderer: Renderer, paths: Paths) -> None:
    """A protobuf scrape; every series' served message and native fields must be those
    encoded from scratch from its HDR counts."""
    before = {series: cached.native.body for series, cached in renderer._cache.items()
              if cached.native is not None}
    renderer.render_protobuf()
    encoder = renderer.encoder
    every = [s for state in store.families.values() for s in state.series.values()]
    for series, hist, _, _ in store.snapshot_of(every):
        cached = renderer._cache[series]
        native = cached.native
        assert native is not None and cached.protobuf is not None
        fam = series.state.family
        assert native.body == fields(encoder._converters[fam.name].convert(hist))
        assert cached.protobuf == encoder.histogram(fam, cached.pairs, sample(
            fam, hist, cached.exemplars), cached.created)
        assert cached.protobuf == encoder.histogram(fam, cached.pairs, sample(
            fam, hist, cached.exemplars), cached.created, NativeFields())
        paths.checked += 1
        paths.reused += native.body is before.get(series)
        paths.layout += native.layout is not None


def test_kept_fields_equal_fields_from_scratch_through_folds_and_takes() -> None:
    for schema, max_buckets in ((5, 320), (8, 40), (0, 320), (3, 6)):
        rng = random.Random(schema)
        store = Recorder(config(schema, max_buckets))
        renderer = Renderer(store)
        series_keys = keys(10)
        paths = Paths()
        slice_id = 0
        for round_ in range(60):
            if rng.random() < 0.1:  # a new window slice: the next value folds in the caller's
                slice_id += 1
            if rng.random() < 0.8:
                record(store, rng, series_keys, slice_id)
            if rng.random() < 0.2:  # a text scrape's fold in between: the kept counts follow
                renderer.render()
            if rng.random() < 0.05:  # a push worker's take: every series a new histogram
                take(store)
            # every series rendered again, changed or not
            store.dirty.update(s for st in store.families.values() for s in st.series.values())
            check(store, renderer, paths)
        assert paths.reused > 100, (schema, vars(paths))
        # (past the bucket limit the fields are coarsened and encoded afresh: no layout kept)
        assert paths.layout > 100 or max_buckets < 10, (schema, vars(paths))


def test_kept_fields_follow_the_aggregators_merges_and_a_journal_restore(tmp_path) -> None:
    rng = random.Random(11)
    cfg = replace(config(5, 320),
                  aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state.snap")))
    target = Recorder(cfg)
    aggregator = Aggregator(cfg, target)
    renderer = Renderer(target)
    worker = Recorder(cfg)
    series_keys = keys(10)
    paths = Paths()
    for round_ in range(50):
        record(worker, rng, series_keys, round_ // 4)
        delta = take(worker)
        delta.worker, delta.seq = "w", round_ + 1
        # as received (validated from the wire: sparse histograms) and journalled
        assert aggregator.accept(wire.encode(delta, worker.schema.layouts()))[0] == 200
        if round_ == 20:
            aggregator.snapshot()
        if round_ == 30:  # a SIGKILL: the snapshot and the journal restored by a new process
            target = Recorder(cfg)
            aggregator = Aggregator(cfg, target)
            renderer = Renderer(target)
        target.dirty.update(s for st in target.families.values() for s in st.series.values())
        check(target, renderer, paths)
    assert paths.reused > 50 and paths.layout > 50, vars(paths)
