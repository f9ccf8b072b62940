"""One series' native histogram fields in the wire format, kept by the renderer between scrapes.

Turning a series' native counts into spans and deltas (native.py) and those into field bytes is
a Python step per populated native bucket: about half the protobuf message's cost. A
series' set of populated native buckets rarely changes between two scrapes (a new value usually
lands in a bucket already populated), so its span fields, and where the empty buckets sent as
zeros go between its counts, are kept: only the deltas are computed again, each step in C (a
`map` over the counts, the field bytes looked up). When the counts did not change either (a
series rendered again with nothing new), the fields are reused whole.

What is kept is keyed on the reader's copy of the counts itself (native_counts.Frozen, compared
byte for byte): every path that changes a series' counts (a fold, an aggregator's merge, a
push worker's take, a journal's restore) shows as a different copy, so there is nothing to
invalidate. The bytes are the ones protobuf.py wrote from `Converter.convert` before
(tests/test_native_fields.py compares them over many folds, merges and takes).
"""

from __future__ import annotations

from array import array
from functools import lru_cache
from itertools import chain
from operator import itemgetter, sub
from typing import Callable

from ..record.histogram import Histogram
from ..record.native_counts import Frozen, NativeCounts
from . import protowire as wire
from .native import MAX_GAP, ZERO_THRESHOLD, Converter, NativeBuckets

#: Histogram field 6, the zero bucket's breadth: the same for every histogram.
_ZERO_THRESHOLD = b"\x31" + wire.double(ZERO_THRESHOLD)
#: The no-op span: marks a native histogram without observations for parsers that look for it.
_NO_OP_SPAN = [(0, 0)]


@lru_cache(maxsize=4096)
def _span_field(span: tuple[int, int]) -> bytes:
    """A `positive_span` field (12): BucketSpan offset (1, sint32), length (2). Histograms of
    one family share most of their spans: the recent ones are kept."""
    offset, length = span
    return wire.field(b"\x62", b"\x08" + wire.zigzag(offset) + b"\x10" + wire.varint(length))


def _delta_field(delta: int) -> bytes:
    """A `positive_delta` field (13, sint64)."""
    return b"\x68" + wire.zigzag(delta)


#: The fields of the small deltas most are, looked up rather than built.
_DELTAS = {d: _delta_field(d) for d in range(-2048, 2048)}


def _delta_fields(deltas: list[int]) -> bytes:
    """The `positive_delta` fields of these deltas."""
    try:
        return b"".join(map(_DELTAS.__getitem__, deltas))
    except KeyError:  # a delta past the table
        return b"".join(map(_delta_field, deltas))


@lru_cache(maxsize=None)
def head(schema: int) -> bytes:
    """The schema (5, sint32) and zero threshold (6) fields, and the zero count's key (7)."""
    return b"\x28" + wire.zigzag(schema) + _ZERO_THRESHOLD + b"\x38"


def fields(native: NativeBuckets) -> bytes:
    """Fields 5 to 13 of a histogram's native buckets (no spans: the no-op span)."""
    return b"".join((head(native.schema), wire.varint(native.zero_count),
                     *map(_span_field, native.spans or _NO_OP_SPAN),
                     _delta_fields(native.deltas)))


class _Layout:
    """The fields of one set of populated native buckets that its counts do not change: the
    head, the span fields, and which count each bucket sent is (`pick`: None when every bucket
    sent is populated; else a getter over the counts followed by a 0, for the empty ones)."""

    __slots__ = ("table", "keys", "head", "spans", "pick")

    def __init__(self, frozen: Frozen, native: NativeBuckets, populated: list[int]):
        """The layout of `native`, whose populated buckets are `populated` (`frozen`'s)."""
        self.table, self.keys = frozen.table, frozen.keys
        self.head = head(native.schema)
        self.spans = b"".join(map(_span_field, native.spans or _NO_OP_SPAN))
        sources: list[int] = []  # the index into the counts of each bucket sent
        empty = len(populated)  # (the 0 appended to the counts)
        for j, k in enumerate(populated):
            gap = k - populated[j - 1] - 1 if j else 0
            if 0 < gap <= MAX_GAP:  # sent as zeros, as native.py's _spans does
                sources += [empty] * gap
            sources.append(j)
        self.pick: Callable[[list[int]], tuple[int, ...]] | None = (
            itemgetter(*sources) if len(sources) > len(populated) else None)

    def fields(self, zero: int, sums: list[int]) -> bytes:
        """Fields 5 to 13 for these counts of the layout's buckets."""
        pick = self.pick
        sent = sums if pick is None else pick(sums + [0])
        # each count minus the one before it
        deltas = _delta_fields(list(map(sub, sent, chain((0,), sent))))
        return b"".join((self.head, wire.varint(zero), self.spans, deltas))


class NativeFields:
    """One series' native fields as last encoded, with the copy of the counts they were
    encoded from and, once the same buckets were populated at two encodings in a row, their
    layout (built no sooner: where a new value keeps populating a new bucket it would not be
    used). Used by one renderer, under its lock."""

    __slots__ = ("counts", "layout", "body")

    def __init__(self) -> None:
        self.counts: Frozen | None = None
        self.layout: _Layout | None = None
        self.body = b""

    def encode(self, converter: Converter, hist: Histogram,
               native: Frozen | NativeCounts | None) -> bytes:
        """Fields 5 to 13 of `hist` (whose native counts `native` are: converter.counts)."""
        if isinstance(native, Frozen) and native.table is converter.table:
            last = self.counts
            if native == last:  # nothing changed
                return self.body
            layout = self.layout
            if layout is None and last is not None and last.keys == native.keys and \
                    last.table is native.table:  # the same buckets twice: keep their layout
                keys, sums = native.lists()
                buckets = converter.encode(native.zero, keys, sums)
                if buckets.schema == converter.schema:  # (coarsened: encoded afresh each time)
                    layout = self.layout = _Layout(native, buckets, keys)
            if layout is not None and layout.keys == native.keys and \
                    layout.table is native.table:  # only the counts changed
                body = self.body = layout.fields(
                    native.zero, array(native.typecode, native.counts).tolist())
                self.counts = native
                return body
        frozen, zero, keys, sums = converter.counts(hist, native)
        self.counts, self.layout = frozen, None
        body = self.body = fields(converter.encode(zero, keys, sums))
        return body
