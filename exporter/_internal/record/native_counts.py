"""A series' counts in Prometheus native buckets, kept beside its HDR counts by the readers.

Converting a histogram's HDR counts to native buckets at every protobuf scrape walks all its
stored HDR buckets (~500 for a series whose values span five octaves), most of them empty: it
was half the protobuf render's cost per series. The native counts are instead kept up to date
where values reach the HDR counts on a reader's side: the fold of the pending values when a
reader takes the series (the scrape), and the aggregator's merge of a worker's delta. Each
update costs a step per non-empty HDR bucket of what was added, not per stored bucket.

The caller's thread never touches them: a fold there (a full pending batch, a new window
slice, a stream's inter-token gaps) leaves them behind the HDR counts, and so does a push
worker's take, which gives the series a new histogram. Kept counts know the histogram and the
count they reflect, so a reader finds that out and drops them; the next protobuf scrape
converts that series from its HDR counts again and keeps the result (`seed`).

The index math is Prometheus' (expose/native.py describes the conversion and its error).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from array import array
from operator import sub
from typing import Iterable, NamedTuple

from .histogram import Batch, Histogram, Layout

MIN_SCHEMA, MAX_SCHEMA = -4, 8


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


_TABLES: dict[tuple[Layout, int, int], list[int]] = {}


def native_table(layout: Layout, scale: int, schema: int) -> list[int]:
    """HDR index -> native index of its bucket's midpoint in the family's unit (index 0 holds
    only the value 0, the zero bucket: its entry is unused). One list per layout, unit scale
    and schema, shared: kept counts and a converter agree when their tables are the same."""
    if not MIN_SCHEMA <= schema <= MAX_SCHEMA:
        raise ValueError(f"native schema must be between {MIN_SCHEMA} and {MAX_SCHEMA}")
    key = (layout, scale, schema)
    found = _TABLES.get(key)
    if found is None:
        found = _TABLES[key] = [0] + [
            native_index((layout.lowest_equivalent(i) + layout.highest_equivalent(i)) / 2 /
                         scale, schema) for i in range(1, layout.counts_len)]
    return found


class Frozen(NamedTuple):
    """A reader's copy of a series' native counts (NativeCounts.frozen): equal copies are equal
    counts, so a reader can key what it derives from them on the copy itself."""

    table: list[int]
    zero: int
    #: The populated native buckets' indices (int32, ascending) and counts, as array bytes.
    keys: bytes
    counts: bytes
    #: The counts' array typecode ("I", or "Q" past 4e9 values).
    typecode: str

    def lists(self) -> tuple[list[int], list[int]]:
        """The indices and the counts as lists."""
        return array("i", self.keys).tolist(), array(self.typecode, self.counts).tolist()


class NativeCounts:
    """One series' HDR counts summed per native bucket (of `table`'s schema), as of `count`
    values of `hist`, its live histogram. Changed only under the store's lock.

    The populated native buckets are kept as two arrays in index order: their indices (32-bit)
    and their counts (32-bit counters, 64-bit past 4e9 values as the HDR counts): 8 bytes per
    populated bucket, which the render reads with two `tolist` calls (a dict cost ~70 bytes a
    bucket, a dense array a walk over the empty buckets between the populated ones).

    Made empty-handed (`counts` None) under the lock when a protobuf reader takes a series
    that has none; that reader converts its copy of the histogram and hands the result over
    with `seed`, outside the lock. Until then the counts cannot follow an addition, and a
    reader that folds one in drops them.
    """

    __slots__ = ("table", "hist", "count", "zero", "keys", "counts")

    def __init__(self, table: list[int], hist: Histogram | None, count: int, zero: int = 0,
                 keys: "array[int] | None" = None, counts: "array[int] | None" = None):
        self.table = table
        self.hist = hist
        self.count = count
        #: Values of 0 (HDR index 0): the zero bucket.
        self.zero = zero
        #: The populated native buckets' indices, ascending, and their counts (None until
        #: seeded).
        self.keys = keys
        self.counts = counts

    def seed(self, zero: int, keys: list[int], sums: list[int]) -> "Frozen":
        """Hand over the counts converted from a copy of `hist` at `count` values: the
        populated native buckets' ascending indices and counts; what a reader's copy of them
        is now. `counts` is set last: a reader under the lock that sees it sees the rest
        too."""
        key_array, counts = array("i", keys), array("Q" if self.count > _WIDE else "I", sums)
        seeded = Frozen(self.table, zero, key_array.tobytes(), counts.tobytes(),
                        counts.typecode)
        self.zero, self.keys = zero, key_array
        self.counts = counts
        return seeded

    def frozen(self) -> "Frozen":
        """A reader's private copy of seeded counts: their arrays' bytes (a copy each, no
        object per bucket, nothing for the garbage collector to track)."""
        counts = self.counts
        assert counts is not None and self.keys is not None
        return Frozen(self.table, self.zero, self.keys.tobytes(), counts.tobytes(),
                      counts.typecode)

    def current(self, hist: Histogram) -> bool:
        """Whether these counts are `hist`'s as it is now (or will be once seeded)."""
        return self.hist is hist and self.count == hist.count

    def follow_batch(self, hist: Histogram, batch: Batch | None) -> bool:
        """After `batch` (or nothing) was folded into `hist`: add it; False when these counts
        do not reflect `hist` just before it (they are then to be dropped)."""
        if batch is None:
            return self.current(hist)
        ends = batch.ends
        return self.follow(hist, zip(batch.indices, map(sub, ends, [0, *ends[:-1]])),
                           len(batch.ordered))

    def follow(self, hist: Histogram, pairs: Iterable[tuple[int, int]], count: int) -> bool:
        """After (HDR index, count) `pairs`, `count` values in all, were added to `hist`: add
        them; False when these counts do not reflect `hist` just before it."""
        counts, keys = self.counts, self.keys
        if counts is None or keys is None or self.hist is not hist or \
                self.count + count != hist.count:
            return False
        if hist.count > _WIDE and counts.typecode == "I":
            counts = self.counts = array("Q", counts)
        table = self.table
        for i, c in pairs:
            if not i:  # HDR index 0 holds the value 0: the zero bucket
                self.zero += c
                continue
            k = table[i]
            at = bisect_left(keys, k)
            if at < len(keys) and keys[at] == k:
                counts[at] += c
            else:
                keys.insert(at, k)
                counts.insert(at, c)
        self.count = hist.count
        return True


#: Past this many values a native bucket could overflow a 32-bit counter: 64-bit ones.
_WIDE = 0xFFFFFFFF
