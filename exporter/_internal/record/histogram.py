"""A compact HDR histogram: HdrHistogram's log-linear bucket layout, stored sparsely.

Why not `hdrh.histogram.HdrHistogram` itself: its `record_value` costs ~2.1 µs and one empty
histogram at 1 µs–1 h, 2 digits, allocates 28 KB. This class uses the very same index math
(lowest discernible value 1, `significant_digits` of precision), so every count lands in the
bucket HdrHistogram would use and `to_hdrh()`/`from_hdrh()` convert exactly (for encoding and
for checks against the reference); but it only stores the contiguous index range that holds
values, as 32-bit counters, and records in ~0.2 µs.

Classic Prometheus buckets are derived at scrape time. An `le` boundary usually falls inside an
HDR bucket, which would make the SLO count off by up to 1/2^(digits bits); `Layout` knows those
straddling buckets and the histogram keeps, for each, how many values were at or under the
boundary, so `le` counts are exact at every configured boundary.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate, chain
from operator import add, sub
from typing import Any, Iterable, NamedTuple, Sequence, Union

from hdrh.histogram import HdrHistogram

#: From this many values a batch is grouped by bisection rather than value by value.
BISECT_BATCH = 256

#: `bucketize`'s grouping in one C pass (_hotrecord.c; setup.py builds it where a compiler is
#: found), or None: the Python loops below run.
bucket_groups: Any
try:
    from ._hotrecord import bucket_groups
except ImportError:
    bucket_groups = None


class Batch(NamedTuple):
    """Values sorted and grouped by HDR bucket: `indices[k]` holds ordered[ends[k-1]:ends[k]]."""

    indices: list[int]
    ends: list[int]
    ordered: list[int]
    total: int  # the exact sum of the values as given (before any clamping)


class Layout:
    """Bucket layout shared by every histogram of one family (so each histogram stays small)."""

    __slots__ = ("digits", "highest", "half_magnitude", "half_count", "mask", "shift",
                 "boundaries", "straddles", "straddle_index", "full_end", "counts_len",
                 "_bucket_bounds")

    def __init__(self, highest: int, digits: int, boundaries: Sequence[int] = ()):
        if not 1 <= digits <= 3:
            raise ValueError("significant digits must be 1, 2 or 3")
        if highest < 2:
            raise ValueError("highest trackable value must be at least 2")
        self.digits = digits
        self.highest = highest
        largest_single_unit = 2 * 10 ** digits
        sub_bucket_count_magnitude = math.ceil(math.log2(largest_single_unit))
        self.half_magnitude = max(sub_bucket_count_magnitude - 1, 0)
        self.half_count = 1 << self.half_magnitude
        self.mask = (1 << (self.half_magnitude + 1)) - 1
        self.shift = self.half_magnitude + 1
        self.boundaries: tuple[int, ...] = tuple(sorted(set(int(b) for b in boundaries)))
        # HDR index -> positions (into boundaries) of boundaries that fall strictly inside it.
        self.straddles: dict[int, tuple[int, ...]] = {}
        # Per boundary: one past the last HDR index whose values are all <= the boundary.
        full_end = []
        for pos, boundary in enumerate(self.boundaries):
            i = self.index(boundary)
            if self.highest_equivalent(i) != boundary:
                self.straddles[i] = self.straddles.get(i, ()) + (pos,)
                full_end.append(i)
            else:
                full_end.append(i + 1)
        self.full_end: tuple[int, ...] = tuple(full_end)
        #: boundary position -> the HDR index it falls inside, for straddling boundaries.
        self.straddle_index: dict[int, int] = {
            pos: i for i, poss in self.straddles.items() for pos in poss}
        #: Length of HdrHistogram's full counts array for this layout.
        self.counts_len = self.index(self.highest) + 1
        self._bucket_bounds: tuple[list[int], list[int]] | None = None

    def index(self, value: int) -> int:
        """HdrHistogram's counts index for a non-negative integer value."""
        b = (value | self.mask).bit_length() - self.shift
        return ((b + 1) << self.half_magnitude) + (value >> b) - self.half_count

    def lowest_equivalent(self, index: int) -> int:
        bucket = (index >> self.half_magnitude) - 1
        sub = (index & (self.half_count - 1)) + self.half_count
        if bucket < 0:
            sub -= self.half_count
            bucket = 0
        return sub << bucket

    def highest_equivalent(self, index: int) -> int:
        bucket = max((index >> self.half_magnitude) - 1, 0)
        return self.lowest_equivalent(index) + (1 << bucket) - 1

    def bucketize(self, values: Sequence[int]) -> "Batch":
        """Sort a batch and count it per HDR bucket: one C pass (`bucket_groups`) where it is
        built, else one Python step per value or per distinct bucket.

        In Python: a call's inter-token gaps are hundreds of values in a few hundred buckets;
        sorting (in C) and bisecting each bucket's end costs ~70-100 ns a value, against ~250 ns
        for indexing and counting the values one by one, which stays the better way for small
        batches.
        """
        total = sum(values)
        ordered = sorted(values)
        if ordered[-1] > self.highest:
            ordered = [min(v, self.highest) for v in ordered]
        mask, shift, half_mag, half = self.mask, self.shift, self.half_magnitude, self.half_count
        if bucket_groups is not None:
            groups = bucket_groups(ordered, mask, shift, half_mag, half)
            if groups is not None:
                return Batch(groups[0], groups[1], ordered, total)
        indices: list[int] = []
        ends: list[int] = []
        n = len(ordered)
        if n < BISECT_BATCH:  # few values, mostly in distinct buckets: index each one
            last = -1
            for k, v in enumerate(ordered):
                b = (v | mask).bit_length() - shift
                i = ((b + 1) << half_mag) + (v >> b) - half
                if i == last:
                    ends[-1] = k + 1
                else:
                    indices.append(i)
                    ends.append(k + 1)
                    last = i
            return Batch(indices, ends, ordered, total)
        i = 0
        while i < n:  # many values, many per bucket: one bisection to each bucket's end
            v = ordered[i]
            b = (v | mask).bit_length() - shift
            sub = v >> b
            i = bisect_left(ordered, (sub + 1) << b, i + 1)
            indices.append(((b + 1) << half_mag) + sub - half)
            ends.append(i)
        return Batch(indices, ends, ordered, total)

    def bucket_bounds(self) -> tuple[list[int], list[int]]:
        """Per HDR index: the lowest value of its bucket, and the bucket's width - 1 (built once,
        on first use: the push decoder checks sums against them)."""
        if self._bucket_bounds is None:
            lowest = [self.lowest_equivalent(i) for i in range(self.counts_len)]
            width = [self.highest_equivalent(i) - low for i, low in enumerate(lowest)]
            self._bucket_bounds = (lowest, width)
        return self._bucket_bounds


class Histogram:
    """Counts of integer values in HDR buckets; not thread-safe (the recorder owns the lock)."""

    __slots__ = ("layout", "_counts", "_lo", "count", "total", "_at_or_below")

    def __init__(self, layout: Layout):
        self.layout = layout
        self._counts = array("I")
        self._lo = 0
        self.count = 0
        self.total = 0  # sum of recorded values, exact (Python int)
        # boundary position -> values recorded in its straddling bucket that are <= the boundary
        self._at_or_below: dict[int, int] | None = None

    def record(self, value: int) -> None:
        """Record one value >= 0. Values above `layout.highest` land in the top bucket."""
        self.record_many((value,))

    def record_many(self, values: Sequence[int]) -> None:
        """Record values >= 0 (values above `layout.highest` land in the top bucket)."""
        if values:
            self.record_batch(self.layout.bucketize(values))

    def record_batch(self, batch: "Batch") -> None:
        """Record a bucketized batch (one `bucketize`, as many histograms as need it)."""
        indices, ends = batch.indices, batch.ends
        self.add_counts(indices, map(sub, ends, [0, *ends[:-1]]), len(batch.ordered),
                        batch.total)
        straddles = self.layout.straddles
        if straddles:
            for k, i in enumerate(indices):
                if i in straddles:
                    self._note_straddles(i, batch.ordered, ends[k - 1] if k else 0, ends[k])

    def add_counts(self, indices: Sequence[int], counts: Iterable[int], count: int, total: int,
                   at_or_below: dict[int, int] | None = None) -> None:
        """Add `counts` at ascending HDR `indices` (their sum is `count`, their values' sum
        `total`), and straddle counts by boundary position: a batch, or a received histogram."""
        if not indices:
            return
        low, high = indices[0], indices[-1]
        buckets, lo = self._counts, self._lo
        if low < lo or high - lo >= len(buckets):  # (an empty histogram too)
            self._grow(low)
            self._grow(high)
            buckets, lo = self._counts, self._lo
        if self.count + count > 0xFFFFFFFF and buckets.typecode == "I":
            self._widen()  # no bucket can exceed the total count: widen before any overflow
            buckets = self._counts
        if low == high:  # one bucket: most received deltas of most series
            buckets[low - lo] += count
        else:
            for i, c in zip(indices, counts):
                buckets[i - lo] += c
        self.count += count
        self.total += total
        if at_or_below:
            below = self._at_or_below
            if below is None:
                below = self._at_or_below = {}
            for pos, c in at_or_below.items():
                below[pos] = below.get(pos, 0) + c

    def _note_straddles(self, index: int, ordered: list[int], start: int, end: int) -> None:
        """Count the values of bucket `index` (ordered[start:end]) at or under its boundaries."""
        below = self._at_or_below
        if below is None:
            below = self._at_or_below = {}
        for pos in self.layout.straddles[index]:
            c = bisect_right(ordered, self.layout.boundaries[pos], start, end) - start
            if c:
                below[pos] = below.get(pos, 0) + c

    def _grow(self, index: int) -> None:
        """Extend the stored range to include `index`, a half-octave block at a time."""
        if not self._counts:
            self._lo = index
            self._counts = array(self._counts.typecode, bytes(self._counts.itemsize))
            return
        lo, hi = self._lo, self._lo + len(self._counts)
        block = self.layout.half_count // 2 or 1
        if index < lo:
            new_lo = max(index - block, 0)
            self._counts = array(self._counts.typecode,
                                 bytes((lo - new_lo) * self._counts.itemsize)) + self._counts
            self._lo = new_lo
        elif index >= hi:
            extra = index - hi + 1 + block
            self._counts.extend(array(self._counts.typecode, bytes(extra * self._counts.itemsize)))

    def _widen(self) -> None:
        """A 32-bit counter could overflow: switch to 64-bit counters (after ~4e9 values)."""
        self._counts = array("Q", self._counts)

    # --- reading ------------------------------------------------------------------------------

    def stored(self) -> tuple[int, "array[int]"]:
        """(first stored HDR index, the counts from there on): every bucket outside is empty.

        The array is the histogram's own (read it, do not change it): the codec walks it
        without a copy.
        """
        return self._lo, self._counts

    @property
    def at_or_below(self) -> dict[int, int]:
        """Boundary position -> values of its straddling bucket at or under the boundary."""
        return self._at_or_below or {}

    def copy(self) -> "Histogram":
        other = Histogram(self.layout)
        other._counts = array(self._counts.typecode, self._counts)
        other._lo, other.count, other.total = self._lo, self.count, self.total
        other._at_or_below = dict(self._at_or_below) if self._at_or_below else None
        return other

    def add(self, other: "Histogram") -> None:
        """Merge `other` (same layout) into this histogram, exactly."""
        if other.layout is not self.layout and (
                other.layout.highest, other.layout.digits, other.layout.boundaries) != (
                self.layout.highest, self.layout.digits, self.layout.boundaries):
            raise ValueError("cannot merge histograms of different layouts")
        if other.count:
            indices, counts = zip(*other.nonzero())
            self.add_counts(indices, counts, other.count, other.total, other._at_or_below)

    def add_to(self, hist: "Histogram") -> None:
        """`hist.add(self)`: what every histogram a series can be given answers (a worker's
        received one too, whose class lives with the wire format)."""
        hist.add(self)

    def nonzero(self) -> Iterable[tuple[int, int]]:
        """(HDR index, count) of every non-empty bucket, in value order."""
        lo = self._lo
        return ((lo + j, c) for j, c in enumerate(self._counts) if c)

    def cumulative_at(self) -> list[int]:
        """Exact count of values <= each `layout.boundaries` value (cumulative, as `le`)."""
        layout = self.layout
        if self.count == 0:
            return [0] * len(layout.boundaries)
        running = [0, *accumulate(self._counts)]  # running[k] = sum of counts[:k]
        lo, full_end = self._lo, layout.full_end
        # boundaries wholly below the stored range count 0, wholly above it count everything
        first = bisect_right(full_end, lo)
        last = bisect_left(full_end, lo + len(running) - 1, first)
        out = [0] * first + [running[end - lo] for end in full_end[first:last]] + \
            [running[-1]] * (len(full_end) - last)
        for pos, c in (self._at_or_below or {}).items():
            out[pos] += c
        return out

    def quantiles(self, qs: Sequence[float]) -> list[int]:
        """HdrHistogram's `get_value_at_percentile(100*q)` for each q."""
        return quantiles_of([self], qs, self.layout)

    @property
    def nbytes(self) -> int:
        """Bytes held by the counters (the per-histogram part that grows with the data)."""
        return self._counts.buffer_info()[1] * self._counts.itemsize

    # --- interchange with the reference implementation -----------------------------------------

    def to_hdrh(self) -> HdrHistogram:
        """An `hdrh` HdrHistogram with identical counts (for its V2 encoding, or checks)."""
        layout = self.layout
        h = HdrHistogram(1, layout.highest, layout.digits)
        pairs = list(self.nonzero())
        for i, c in pairs:
            h.counts[i] += c
        if pairs:
            h.set_internal_tacking_values(pairs[0][0], pairs[-1][0], self.count)
        return h

    @classmethod
    def from_hdrh(cls, layout: Layout, hdr: HdrHistogram) -> "Histogram":
        """Rebuild from an `hdrh` histogram of the same layout; sum is approximated by mid-points.

        Straddling-boundary counts are not part of the HDR format, so callers that need exact
        `le` counts across processes ship them alongside (see push).
        """
        if (hdr.highest_trackable_value, hdr.significant_figures) != (layout.highest,
                                                                      layout.digits):
            raise ValueError("hdr histogram layout differs")
        counts = hdr.counts
        indices = [i for i in range(min(hdr.counts_len, layout.counts_len)) if counts[i]]
        found = [counts[i] for i in indices]
        total = sum(c * ((layout.lowest_equivalent(i) + layout.highest_equivalent(i)) // 2)
                    for i, c in zip(indices, found))
        out = cls(layout)
        out.add_counts(indices, found, sum(found), total)
        return out


#: A window slice holds its raw values (8 bytes each) until it has this many, then becomes a
#: Histogram: a quiet series' slice costs bytes per value, a busy one HDR's fixed size.
RAW_SLICE_MAX = 256

#: A window slice: raw values (`array("q")`) or, past RAW_SLICE_MAX values, a Histogram.
WindowPart = Union[Histogram, "array[int]"]


def part_count(part: WindowPart) -> int:
    return part.count if isinstance(part, Histogram) else len(part)


def quantiles_of(parts: Sequence[WindowPart], qs: Sequence[float], layout: Layout
                 ) -> list[int]:
    """HdrHistogram's `get_value_at_percentile(100*q)` of the merge of `parts`, per q.

    Used for the sliding window, merged at every scrape. Raw parts alone are sorted (the
    target order statistic's HDR bucket is exactly the one HdrHistogram would return);
    histogram parts are aligned and summed with C-level `map`, and each quantile is a
    bisection of the running total.
    """
    raw = [p for p in parts if not isinstance(p, Histogram) and len(p)]
    live = [p for p in parts if isinstance(p, Histogram) and p.count]
    if not raw and not live:
        return [0] * len(qs)
    if not live:
        ordered = sorted(chain.from_iterable(raw))
        n = len(ordered)
        return [layout.highest_equivalent(layout.index(min(
            ordered[max(int(q * n + 0.5), 1) - 1], layout.highest))) for q in qs]
    if raw:
        extra = Histogram(layout)
        extra.record_many(list(chain.from_iterable(raw)))
        live.append(extra)
    lo = min(h._lo for h in live)
    hi = max(h._lo + len(h._counts) for h in live)
    merged: Iterable[int] | None = None
    for h in live:
        before, after = h._lo - lo, hi - h._lo - len(h._counts)
        padded = array("Q", bytes(before * 8)) + array("Q", h._counts) + array("Q", bytes(after * 8)) \
            if before or after or h._counts.typecode != "Q" else h._counts
        merged = padded if merged is None else map(add, merged, padded)
    running = list(accumulate(merged))  # type: ignore[arg-type]
    total = running[-1]
    out = []
    for q in qs:
        target = max(int(q * total + 0.5), 1)
        out.append(layout.highest_equivalent(lo + bisect_left(running, target)))
    return out
