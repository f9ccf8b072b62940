"""The HDR histogram against HdrHistogram itself. Every test runs twice: with a batch's
bucket grouping in C (_hotrecord.c, which `make test` builds) and in Python."""

import random

import pytest
from hdrh.histogram import HdrHistogram

from exporter._internal.record import histogram as histogram_module
from exporter._internal.record.histogram import BISECT_BATCH, Histogram, Layout, quantiles_of
from tests.support.c_parts import built_in_c


@pytest.fixture(autouse=True, params=["c", "python"])
def grouping(request, monkeypatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(histogram_module, "bucket_groups", None)
    elif not built_in_c("_hotrecord.bucket_groups", histogram_module.bucket_groups is not None):
        pytest.skip("no C compiler here: the package runs the Python grouping")
    return request.param

HOUR_US = 3_600_000_000
QS = [0.0001, 0.5, 0.9, 0.99, 0.999, 1.0]


def reference(values, digits=2):
    ref = HdrHistogram(1, HOUR_US, digits)
    for v in values:
        ref.record_value(v)
    return ref


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_same_buckets_and_quantiles_as_hdrhistogram(digits):
    rng = random.Random(digits)
    values = [int(rng.lognormvariate(12, 1.2)) for _ in range(5000)] + [0, 1, 255, 256, HOUR_US]
    layout = Layout(HOUR_US, digits)
    h = Histogram(layout)
    for v in values:
        h.record(v)
    ref = reference(values, digits)
    assert h.quantiles(QS) == [ref.get_value_at_percentile(q * 100) for q in QS]
    assert dict(h.nonzero()) == {i: c for i, c in enumerate(ref.counts) if c}
    assert h.count == len(values) and h.total == sum(values)


def test_record_many_equals_record_one_by_one():
    rng = random.Random(7)
    values = [int(rng.expovariate(1 / 30000)) for _ in range(3000)]
    layout = Layout(HOUR_US, 2, [10_000, 25_000, 2_000_000])
    one, many = Histogram(layout), Histogram(layout)
    for v in values:
        one.record(v)
    many.record(values[0])
    many.record_many(values[1:])
    assert list(one.nonzero()) == list(many.nonzero())
    assert one.cumulative_at() == many.cumulative_at()
    assert (one.count, one.total) == (many.count, many.total)


def test_le_counts_are_exact_at_boundaries_inside_a_bucket():
    # 2 s = 2,000,000 us falls inside the HDR bucket [1,998,848, 2,007,039]: exactness there
    # comes from the straddle counters, not from the bucket.
    layout = Layout(HOUR_US, 2, [2_000_000])
    assert 2_000_000 not in (layout.lowest_equivalent(layout.index(2_000_000)),
                             layout.highest_equivalent(layout.index(2_000_000)))
    h = Histogram(layout)
    for v in (1_999_000, 2_000_000, 2_000_001, 2_005_000, 5):
        h.record(v)
    assert h.cumulative_at() == [3]
    h.record_many([1_999_999, 2_000_002])
    assert h.cumulative_at() == [4]


def test_boundary_exactly_on_bucket_edge_needs_no_straddle():
    layout = Layout(HOUR_US, 2, [255, 2047])
    assert not layout.straddles
    h = Histogram(layout)
    for v in (255, 256, 2047, 2048):
        h.record(v)
    assert h.cumulative_at() == [1, 3]


def test_values_above_highest_saturate_into_top_bucket():
    layout = Layout(1_000_000, 2, [500_000])
    h = Histogram(layout)
    h.record(5_000_000)
    assert h.count == 1 and h.total == 5_000_000 and h.cumulative_at() == [0]
    assert h.quantiles([0.5]) == [layout.highest_equivalent(layout.index(1_000_000))]


def test_merge_is_exact_and_matches_window_quantiles():
    rng = random.Random(3)
    layout = Layout(HOUR_US, 2, [2_000_000])
    parts = [Histogram(layout) for _ in range(3)]
    everything = []
    for k, h in enumerate(parts):
        values = [int(rng.lognormvariate(10 + 2 * k, 0.5)) for _ in range(1000)]
        everything += values
        h.record_many(values)
    merged = Histogram(layout)
    for h in parts:
        merged.add(h)
    ref = reference(everything)
    expected = [ref.get_value_at_percentile(q * 100) for q in QS]
    assert merged.quantiles(QS) == expected
    assert quantiles_of(parts, QS, layout) == expected
    assert merged.cumulative_at() == [sum(1 for v in everything if v <= 2_000_000)]


def test_window_quantiles_from_raw_slices_match_hdr_semantics():
    """Quiet window slices keep raw values; their quantiles are HdrHistogram's, exactly."""
    from array import array

    rng = random.Random(9)
    layout = Layout(HOUR_US, 2, [2_000_000])
    raw = [array("q", [int(rng.lognormvariate(12, 1)) for _ in range(n)]) for n in (5, 50, 1)]
    everything = [v for part in raw for v in part] + [HOUR_US * 2]  # one above the range
    raw[1].append(HOUR_US * 2)
    ref = reference([min(v, HOUR_US) for v in everything])
    expected = [ref.get_value_at_percentile(q * 100) for q in QS]
    assert quantiles_of(raw, QS, layout) == expected
    busy = Histogram(layout)
    busy.record_many(raw[1])
    assert quantiles_of([raw[0], busy, raw[2]], QS, layout) == expected


def test_hdrh_round_trip_and_encoding():
    layout = Layout(HOUR_US, 2)
    h = Histogram(layout)
    h.record_many([100, 2000, 2000, 3_000_000])
    hdr = h.to_hdrh()
    decoded = HdrHistogram.decode(hdr.encode())
    back = Histogram.from_hdrh(layout, decoded)
    assert list(back.nonzero()) == list(h.nonzero())
    assert back.quantiles(QS) == h.quantiles(QS)


def test_merge_refuses_other_layouts():
    with pytest.raises(ValueError):
        Histogram(Layout(HOUR_US, 2)).add(_one(Layout(HOUR_US, 3)))


def test_counters_widen_instead_of_overflowing():
    h = Histogram(Layout(HOUR_US, 2))
    h.record(10)
    h._counts[0] = h.count = 2**32 - 1  # as if recorded 4e9 times
    h.record(10)
    assert h._counts[0] == 2**32 and h._counts.typecode == "Q"
    other = Histogram(h.layout)
    other.record(10)
    other.add(h)
    assert other._counts[0] == 2**32 + 1 and other._counts.typecode == "Q"


def test_storage_is_sparse():
    h = Histogram(Layout(HOUR_US, 2))
    h.record_many(range(1_000_000, 1_500_000, 997))  # within one octave
    assert h.nbytes <= 130 * 4 * 2


def _one(layout):
    h = Histogram(layout)
    h.record(1)
    return h


def test_c_grouping_is_the_python_grouping(grouping, monkeypatch):
    # any batch, small (value by value in Python) or large (bisection), any layout, values at
    # 0, at the highest and beyond it (clamped), mostly in shared buckets or all apart
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    if grouping == "python":
        pytest.skip("compares the two groupings: runs once, under the C parameter")
    c_grouping = histogram_module.bucket_groups
    layouts = [Layout(HOUR_US, digits) for digits in (1, 2, 3)] + [Layout(1000, 2), Layout(2, 1)]
    special = [0, 1, HOUR_US, 2**62 - 1, 2**62, 2**70]
    value = st.one_of(st.integers(0, 3000), st.integers(0, 2 * HOUR_US), st.sampled_from(special))

    @st.composite
    def large_batch(draw):
        """Past BISECT_BATCH: the size, the mix of the three kinds of value (near, far apart,
        the edges) and a seed drawn, the values from the seeded generator (drawn value by
        value, hypothesis took ~100x longer than the comparison it feeds)."""
        size = draw(st.integers(BISECT_BATCH, BISECT_BATCH + 300))
        weights = draw(st.tuples(*(st.integers(0, 3) for _ in range(3))).filter(any))
        rng = random.Random(draw(st.integers(0, 2**32)))
        kinds = (lambda: rng.randint(0, 3000), lambda: rng.randint(0, 2 * HOUR_US),
                 lambda: rng.choice(special))
        return [kind() for kind in rng.choices(kinds, weights, k=size)]

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.sampled_from(layouts),
           st.one_of(st.lists(value, min_size=1, max_size=40), large_batch()))
    def check(layout, values):
        monkeypatch.setattr(histogram_module, "bucket_groups", None)
        expected = layout.bucketize(values)
        monkeypatch.setattr(histogram_module, "bucket_groups", c_grouping)
        assert layout.bucketize(values) == expected

    check()
