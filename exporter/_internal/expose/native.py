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

from itertools import compress
from typing import NamedTuple

from ..record.histogram import Histogram, Layout
from ..record.native_counts import (MAX_SCHEMA, MIN_SCHEMA, Frozen, NativeCounts, native_index,
                                    native_table)

__all__ = ["MAX_SCHEMA", "MIN_SCHEMA", "ZERO_THRESHOLD", "Converter", "NativeBuckets",
           "error_bound", "native_index"]

#: Breadth of the zero bucket: client_golang's default (2^-128). Non-zero, so that Prometheus
#: 2.42 takes even an empty histogram for a native one (it ignores the no-op span).
ZERO_THRESHOLD = 2.0 ** -128


class NativeBuckets(NamedTuple):
    """The native part of one histogram: schema, zero bucket and positive spans/deltas."""

    schema: int
    zero_count: int
    spans: list[tuple[int, int]]  # (offset from the previous span's end, or first index; length)
    deltas: list[int]  # each bucket's count minus the previous bucket's (the first: minus 0)


def error_bound(schema: int, layout: Layout) -> float:
    """Relative error bound of a quantile estimated from converted counts (module docstring)."""
    return 2.0 ** (2.0 ** -schema) - 1 + 1 / layout.half_count


class Converter:
    """HDR counts of one layout and unit scale -> native buckets of one schema.

    The native index of every HDR bucket's midpoint is computed once per layout, scale and
    schema (native_counts.native_table, a few thousand entries). A series' native counts are
    usually kept beside its HDR counts (native_counts.py) and only read here (native_fields.py
    encodes them); converting a histogram from scratch walks its stored HDR buckets in C and
    its non-empty ones in Python.
    """

    def __init__(self, layout: Layout, scale: int, schema: int, max_buckets: int):
        self.schema = schema
        self.max_buckets = max_buckets
        #: HDR index -> native index of its midpoint (index 0 holds only the value 0: unused).
        self.table = native_table(layout, scale, schema)

    def convert(self, hist: Histogram, kept: Frozen | NativeCounts | None = None
                ) -> NativeBuckets:
        """`hist`'s native buckets (`counts` says where from)."""
        return self.encode(*self.counts(hist, kept)[1:])

    def counts(self, hist: Histogram, kept: Frozen | NativeCounts | None
               ) -> tuple[Frozen | None, int, list[int], list[int]]:
        """`hist`'s zero count and populated native buckets (ascending indices, counts): read
        from `kept`, a copy of its native counts, when they were kept at this converter's
        schema; else converted from its HDR counts, seeding `kept` if it asks for it. First
        the copy of the kept counts they are (None when there are none)."""
        if kept is not None and kept.table is self.table:
            if isinstance(kept, Frozen):
                return (kept, kept.zero, *kept.lists())
            zero, keys, sums = self._walk(hist)
            return kept.seed(zero, keys, sums), zero, keys, sums
        return (None, *self._walk(hist))

    def _walk(self, hist: Histogram) -> tuple[int, list[int], list[int]]:
        """The zero count, and the populated native buckets' indices (ascending) and counts."""
        lo, counts = hist.stored()
        zero = 0
        if lo == 0 and counts:  # index 0 holds the value 0: the zero bucket
            zero, lo, counts = counts[0], 1, counts[1:]
        # the native index of each non-empty HDR bucket (the table's slice, selected in C:
        # no integer object made per stored bucket), and its count
        native = compress(self.table[lo:lo + len(counts)], counts)
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
        return zero, keys, sums

    def encode(self, zero: int, keys: list[int], sums: list[int]) -> NativeBuckets:
        """Native buckets of populated `keys` with counts `sums`, coarser past max_buckets."""
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
