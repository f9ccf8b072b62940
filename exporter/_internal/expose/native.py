"""Prometheus native histogram buckets (exponential schema) derived from HDR counts.

A native bucket of schema `s` with index `k` holds the values in (2^((k-1)/2^s), 2^(k/2^s)]
(in the family's unit: seconds or tokens); every bucket is 2^(2^-s) times as wide as the one
below it. Prometheus merges native histograms of one schema exactly (`sum(rate(...))` over
pods) and reduces a finer schema to a coarser one by merging bucket pairs.

Conversion: each HDR bucket [low, high] (integer microseconds or tokens) goes whole into the
native bucket holding its midpoint. Where an HDR bucket straddles a native boundary, its values
on the far side of the boundary are counted one native bucket off, by less than one HDR bucket
width (2^-7 of the value at 2 significant digits). `histogram_quantile` interpolates inside the
native bucket that holds the rank, so a quantile from converted counts is within
    (2^(2^-s) - 1) + 1 / half_count     of the exact value (relative),
the native bucket's width plus one HDR bucket's (half_count = 128 at 2 digits): 1.87 % at schema
6, 2.97 % at schema 5 (`error_bound`; tests/test_native.py checks it against exact quantiles).
Counts, sums and the zero bucket are exact. Values of 0 go to the zero bucket.

A histogram holding more than `max_buckets` populated buckets is served at a coarser schema,
one step at a time (each step merges bucket pairs), as client_golang's bucket limit does.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import compress
from typing import NamedTuple

from ..record.histogram import Histogram, Layout

MIN_SCHEMA, MAX_SCHEMA = -4, 8
#: Breadth of the zero bucket: client_golang's default (2^-128). Non-zero, so that Prometheus
#: 2.42 takes even an empty histogram for a native one (it ignores the no-op span).
ZERO_THRESHOLD = 2.0 ** -128


class NativeBuckets(NamedTuple):
    """The native part of one histogram: schema, zero bucket and positive spans/deltas."""

    schema: int
    zero_count: int
    spans: list[tuple[int, int]]  # (offset from the previous span's end, or first index; length)
    deltas: list[int]  # each bucket's count minus the previous bucket's (the first: minus 0)


def native_index(value: float, schema: int) -> int:
    """Index of the native bucket holding `value` > 0 (upper bounds inclusive), as Prometheus
    computes it: from the value's binary exponent, exact at powers of two."""
    frac, exp = math.frexp(value)
    if schema > 0:
        return bisect_left(_frac_bounds(schema), frac) + ((exp - 1) << schema)
    key = exp - 1 if frac == 0.5 else exp
    return (key + (1 << -schema) - 1) >> -schema


_FRAC_BOUNDS: dict[int, list[float]] = {}


def _frac_bounds(schema: int) -> list[float]:
    """Upper bounds of the native buckets of one octave as mantissas in [0.5, 1)."""
    found = _FRAC_BOUNDS.get(schema)
    if found is None:
        n = 1 << schema
        found = _FRAC_BOUNDS[schema] = [2.0 ** (j / n - 1) for j in range(n)]
    return found


def error_bound(schema: int, layout: Layout) -> float:
    """Relative error bound of a quantile estimated from converted counts (module docstring)."""
    return 2.0 ** (2.0 ** -schema) - 1 + 1 / layout.half_count


class Converter:
    """HDR counts of one layout and unit scale -> native buckets of one schema.

    The native index of every HDR bucket's midpoint is computed once per converter (a few
    thousand entries); converting a histogram is then a walk over its non-empty HDR buckets.
    """

    def __init__(self, layout: Layout, scale: int, schema: int, max_buckets: int):
        if not MIN_SCHEMA <= schema <= MAX_SCHEMA:
            raise ValueError(f"native schema must be between {MIN_SCHEMA} and {MAX_SCHEMA}")
        self.schema = schema
        self.max_buckets = max_buckets
        #: HDR index -> native index of its midpoint (index 0 holds only the value 0: unused).
        self.table = [0] + [
            native_index((layout.lowest_equivalent(i) + layout.highest_equivalent(i)) / 2 / scale,
                         schema) for i in range(1, layout.counts_len)]

    def convert(self, hist: Histogram) -> NativeBuckets:
        lo, counts = hist.stored()
        zero = 0
        if lo == 0 and counts:  # index 0 holds the value 0: the zero bucket
            zero, lo, counts = counts[0], 1, counts[1:]
        # the native index of each non-empty HDR bucket, and its count (both walked in C)
        native = map(self.table.__getitem__, compress(range(lo, lo + len(counts)), counts))
        keys: list[int] = []
        sums: list[int] = []
        last = None
        for k, c in zip(native, filter(None, counts)):
            if k == last:
                sums[-1] += c
            else:
                keys.append(k)
                sums.append(c)
                last = k
        schema = self.schema
        while len(keys) > self.max_buckets and schema > MIN_SCHEMA:
            keys, sums = _coarser(keys, sums)
            schema -= 1
        spans, deltas = _spans(keys, sums)
        return NativeBuckets(schema, zero, spans, deltas)


def _coarser(keys: list[int], sums: list[int]) -> tuple[list[int], list[int]]:
    """The same counts one schema lower: buckets 2j-1 and 2j become bucket j."""
    out_keys: list[int] = []
    out_sums: list[int] = []
    for k, c in zip(keys, sums):
        j = (k + 1) >> 1
        if out_keys and out_keys[-1] == j:
            out_sums[-1] += c
        else:
            out_keys.append(j)
            out_sums.append(c)
    return out_keys, out_sums


#: Up to this many empty buckets between two populated ones are sent as zero counts rather
#: than as a new span (a span costs more bytes than two zero deltas), as client_golang does.
MAX_GAP = 2


def _spans(keys: list[int], sums: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Spans and delta-encoded counts of populated buckets at ascending `keys`."""
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    if not keys:
        return spans, deltas
    append = deltas.append
    offset, length = keys[0], 0  # the span being built
    previous_key, previous = keys[0] - 1, 0
    for k, c in zip(keys, sums):
        gap = k - previous_key - 1
        if gap > MAX_GAP:
            spans.append((offset, length))
            offset, length = gap, 1
        else:
            length += gap + 1
            if gap:  # empty buckets sent as zeros: the count drops to 0, then rises
                append(-previous)
                deltas += [0] * (gap - 1)
                previous = 0
        append(c - previous)
        previous, previous_key = c, k
    spans.append((offset, length))
    return spans, deltas
