"""HDR counts -> native buckets: index math, exact counts, schema reduction, the error bound."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bench.accuracy import native_buckets, native_histogram_quantile
from exporter._internal.expose.native import (MAX_SCHEMA, MIN_SCHEMA, Converter, error_bound,
                                              native_index)
from exporter._internal.record.histogram import Histogram, Layout

HOUR_US = 3_600_000_000
US = 1_000_000


@pytest.mark.parametrize("schema", range(MIN_SCHEMA, MAX_SCHEMA + 1))
def test_index_matches_the_bucket_definition(schema: int) -> None:
    """Bucket k holds (2^((k-1)/2^s), 2^(k/2^s)]: powers of two are upper bounds."""
    rng = random.Random(schema)
    width = 2.0 ** -schema
    for _ in range(2000):
        value = math.exp(rng.uniform(-14, 14))
        k = native_index(value, schema)
        assert 2 ** ((k - 1) * width) < value * (1 + 1e-12)
        assert value <= 2 ** (k * width) * (1 + 1e-12)
    for e in range(-10, 11):
        assert native_index(2.0 ** e, schema) == (e << schema if schema >= 0 else
                                                  -((-e) >> -schema) if e < 0 else
                                                  (e + (1 << -schema) - 1) >> -schema)


def convert(values: list[int], schema: int, max_buckets: int = 10_000, scale: int = US):
    layout = Layout(HOUR_US, 2)
    hist = Histogram(layout)
    hist.record_many(values)
    return hist, Converter(layout, scale, schema, max_buckets).convert(hist)


def test_counts_are_exact_and_each_value_lands_within_one_hdr_bucket() -> None:
    rng = random.Random(3)
    values = [int(rng.lognormvariate(13, 1.5)) for _ in range(20_000)] + [0, 0, 1, 255]
    hist, nb = convert(values, 5)
    buckets = native_buckets(nb)
    assert nb.schema == 5 and nb.zero_count == 2
    assert sum(c for *_, c in buckets) == hist.count == len(values)
    # every native bucket's count equals the values inside it, give or take the values of the
    # HDR buckets straddling its two boundaries (each within 2^-7 of the boundary)
    ordered = np.sort(np.array(values, dtype=float) / US)
    for lower, upper, count in buckets[1:]:
        inside = np.searchsorted(ordered, upper, "right") - np.searchsorted(ordered, lower, "right")
        slack = (np.searchsorted(ordered, upper * (1 + 2 ** -7), "right")
                 - np.searchsorted(ordered, upper * (1 - 2 ** -7), "right")
                 + np.searchsorted(ordered, lower * (1 + 2 ** -7), "right")
                 - np.searchsorted(ordered, lower * (1 - 2 ** -7), "right"))
        assert abs(count - inside) <= slack, (lower, upper)


@pytest.mark.parametrize("schema", [3, 5, 6, 8])
def test_quantiles_within_the_documented_bound(schema: int) -> None:
    """Against the exact order statistics, for smooth and for lumpy (few distinct) values."""
    rng = random.Random(schema)
    smooth = [int(rng.lognormvariate(13, 0.8)) for _ in range(50_000)]
    lumpy = [rng.choice((180_000, 181_500, 640_000, 2_003_000)) for _ in range(5_000)]
    for values in (smooth, lumpy):
        hist, nb = convert(values, schema)
        exact = np.quantile(np.array(values) / US, [0.5, 0.9, 0.99, 0.999],
                            method="inverted_cdf")
        bound = error_bound(schema, hist.layout)
        for q, e in zip((0.5, 0.9, 0.99, 0.999), exact):
            estimate = native_histogram_quantile(q, nb)
            assert abs(estimate - e) / e <= bound, (schema, q, estimate, e, bound)


def test_bound_values() -> None:
    layout = Layout(HOUR_US, 2)
    assert error_bound(5, layout) == pytest.approx(0.0297, abs=1e-4)
    assert error_bound(6, layout) == pytest.approx(0.0187, abs=1e-4)


def test_too_many_buckets_reduce_the_schema_and_keep_the_counts() -> None:
    rng = random.Random(5)
    values = [int(rng.lognormvariate(13, 2)) for _ in range(20_000)]
    _, fine = convert(values, 6)
    populated = len([b for b in native_buckets(fine) if b[0] > 0])
    hist, nb = convert(values, 6, max_buckets=populated // 3)
    assert nb.schema == 4  # two halvings bring it under a third
    coarse = native_buckets(nb)
    assert len(coarse) <= populated // 3 and sum(c for *_, c in coarse) == len(values)
    # each coarse bucket holds exactly the fine buckets inside it (pairs merged twice)
    for lower, upper, count in coarse:
        inner = sum(c for lo, hi, c in native_buckets(fine)
                    if lo >= lower * (1 - 1e-9) and hi <= upper * (1 + 1e-9))
        assert inner == count


def test_gaps_of_up_to_two_buckets_are_zeros_and_longer_ones_new_spans() -> None:
    # values in native buckets k, k+2 (gap 1), k+6 (gap 3) at schema 0: 1, 4, 64 tokens
    _, nb = convert([1, 1, 4, 64], 0, scale=1)
    assert nb.spans == [(0, 3), (3, 1)]
    assert nb.deltas == [2, -2, 1, 0]


def test_tokens_and_an_empty_histogram() -> None:
    _, nb = convert([300, 300, 5000], 3, scale=1)
    assert [(round(lo), round(hi), c) for lo, hi, c in native_buckets(nb)] == [
        (279, 304, 2), (4871, 5312, 1)]  # 2^(65/8) < 300 <= 2^(66/8), 2^(98/8) < 5000
    layout = Layout(HOUR_US, 2)
    empty = Converter(layout, US, 5, 100).convert(Histogram(layout))
    assert empty.spans == [] and empty.deltas == [] and empty.zero_count == 0
