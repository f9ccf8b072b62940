"""HdrHistogram's standard V2 encoding of a `Histogram`, and its decoding into `Sparse` counts.

The counts payload is ZigZag LEB128 with runs of zeros as negative numbers, as every
HdrHistogram library writes it; `v2_header()` + a counts payload is a standard V2 encoding any
of them reads (the tests decode it with `hdrh` both ways). The push wire format (wire.py) carries
the counts payload of each histogram and states the header once per unit.

A received histogram is kept as its non-empty buckets only (`Sparse`), so validating and adding
it costs in proportion to the buckets it touches, not to the range they span.
"""

from __future__ import annotations

import re
import struct
from itertools import accumulate, compress
from typing import Iterable, Sequence

from ..record.histogram import Histogram, Layout

#: HdrHistogram V2 encoding: cookie, payload length, normalizing index offset, significant
#: digits, lowest discernible value, highest trackable value, integer-to-double ratio.
V2_COOKIE = 0x1C849303
_V2_HEADER = struct.Struct(">IIiIqqd")


class MalformedHdr(ValueError):
    """The bytes are not a valid encoding (cut short, past the layout's range, a bad cookie)."""


class IncompatibleHdr(ValueError):
    """A valid encoding of another layout (digits, range, offset or unit)."""


# --- encoding ---------------------------------------------------------------------------------

def encode_counts(hist: Histogram) -> bytes:
    """The counts payload of HdrHistogram's V2 encoding: ZigZag LEB128, zero runs negative."""
    out = bytearray()
    put = _put_varint
    zeros, counts = hist.stored()  # everything below the stored range is zero
    for c in counts:
        if c:
            if zeros:
                put(out, -zeros)
                zeros = 0
            put(out, c)
        else:
            zeros += 1
    return bytes(out)


def v2_header(layout: Layout, payload_length: int) -> bytes:
    """The V2 header that turns a counts payload of `layout` into a standard HDR encoding."""
    return _V2_HEADER.pack(V2_COOKIE, payload_length, 0, layout.digits, 1, layout.highest, 1.0)


def encode_hist(hist: Histogram) -> bytes:
    """HdrHistogram's V2 encoding (uncompressed) of `hist`: header and counts payload."""
    counts = encode_counts(hist)
    return v2_header(hist.layout, len(counts)) + counts


def _put_varint(out: bytearray, value: int) -> None:
    """ZigZag LEB128 as HdrHistogram writes it: at most 9 bytes, the 9th holding 8 bits."""
    v = value << 1 if value >= 0 else ((-value) << 1) - 1
    for _ in range(8):
        if v < 0x80:
            out.append(v)
            return
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


# --- decoding ---------------------------------------------------------------------------------

class Sparse:
    """A received histogram: its non-empty buckets, count, exact sum and straddle counts."""

    __slots__ = ("layout", "indices", "counts", "count", "total", "below")

    def __init__(self, layout: Layout, indices: Sequence[int], counts: Sequence[int],
                 count: int, total: int = 0, below: dict[int, int] | None = None):
        self.layout = layout
        self.indices = indices  # ascending HDR indices (never mutated in place: may be shared)
        self.counts = counts  # their counts, all > 0
        self.count = count  # sum(counts)
        self.total = total
        self.below = below  # straddle counts, as Histogram.at_or_below

    @property
    def at_or_below(self) -> dict[int, int]:
        return self.below or {}

    def nonzero(self) -> Iterable[tuple[int, int]]:
        return zip(self.indices, self.counts)

    def add_to(self, hist: Histogram) -> None:
        """`hist.add(self.to_histogram())`, exactly, touching only the non-empty buckets."""
        hist.add_counts(self.indices, self.counts, self.count, self.total, self.below)

    def add(self, other: "Sparse") -> None:
        """Merge another received histogram of the same series into this one."""
        merged = dict(zip(self.indices, self.counts))
        for i, c in zip(other.indices, other.counts):
            merged[i] = merged.get(i, 0) + c
        self.indices = sorted(merged)
        self.counts = [merged[i] for i in self.indices]  # new lists: the old may be shared
        self.count += other.count
        self.total += other.total
        if other.below:
            below = self.below = dict(self.below or {})
            for pos, c in other.below.items():
                below[pos] = below.get(pos, 0) + c

    def to_histogram(self) -> Histogram:
        hist = Histogram(self.layout)
        self.add_to(hist)
        return hist


def decode_hist(layout: Layout, data: bytes) -> Sparse:
    """The counts of a full V2 encoding of `layout`; MalformedHdr / IncompatibleHdr otherwise."""
    if len(data) < _V2_HEADER.size:
        raise MalformedHdr("HDR encoding shorter than its header")
    cookie, length, offset, digits, lowest, highest, ratio = _V2_HEADER.unpack_from(data)
    if cookie & ~0xF0 != V2_COOKIE:
        raise MalformedHdr(f"not an HDR V2 encoding (cookie {cookie:#x})")
    if length != len(data) - _V2_HEADER.size:
        raise MalformedHdr("HDR payload length does not match (truncated?)")
    if offset != 0 or lowest != 1 or ratio != 1.0:
        raise IncompatibleHdr("HDR encoding with an offset, unit or ratio not used here")
    if digits != layout.digits or highest != layout.highest:
        raise IncompatibleHdr(f"HDR layout ({digits} digits, highest {highest}) differs from "
                              f"the aggregator's ({layout.digits}, {layout.highest})")
    indices, counts = decode_counts(layout, data[_V2_HEADER.size:])
    return Sparse(layout, indices, counts, sum(counts))


#: Bytes with the high bit set: a multi-byte varint (a count or zero run above 63).
_MULTI_BYTE = re.compile(rb"[\x80-\xff]")
#: For single-byte ZigZag tokens v: how far the index moves, whether v is a count, the count.
_STEP = bytes(((v + 1) >> 1 if v & 1 else 1) if v < 0x80 else 0 for v in range(256))
_IS_COUNT = bytes(1 if v < 0x80 and v and not v & 1 else 0 for v in range(256))
_HALF = bytes(v >> 1 for v in range(256))


def decode_counts(layout: Layout, data: bytes) -> tuple[list[int], list[int]]:
    """(indices, counts) of the non-empty buckets of a V2 counts payload of `layout`;
    MalformedHdr when malformed.

    Long runs of single-byte tokens (counts and zero runs under 64: nearly all of them) are
    decoded with C-level byte translation, accumulate and compress; other tokens one by one.
    """
    index = 0
    indices: list[int] = []
    counts: list[int] = []
    pos, n = 0, len(data)
    run_end = 0  # where the current run of single-byte tokens ends
    while pos < n:
        if pos >= run_end:
            found = _MULTI_BYTE.search(data, pos)
            run_end = found.start() if found is not None else n
            if run_end - pos >= 12:  # a long run: C-level
                run = data[pos:run_end]
                starts = list(accumulate(run.translate(_STEP), initial=index))
                is_count = run.translate(_IS_COUNT)
                indices += compress(starts, is_count)
                counts += compress(run.translate(_HALF), is_count)
                index = starts[-1]
                pos = run_end
                continue
        v = data[pos]
        pos += 1
        if v >= 0x80:  # the first byte of a varint of 2..9 bytes (the 9th carries 8 bits)
            v &= 0x7F
            shift = 7
            while True:
                if pos >= n:
                    raise MalformedHdr("HDR varint cut short")
                b = data[pos]
                pos += 1
                if b >= 0x80 and shift < 56:
                    v |= (b & 0x7F) << shift
                    shift += 7
                    continue
                v |= b << shift
                break
        if v & 1:  # ZigZag: a negative value is a run of zero counts
            index += (v + 1) >> 1
        else:
            if v:
                indices.append(index)
                counts.append(v >> 1)
            index += 1
    if index > layout.counts_len + 1 or (indices and indices[-1] >= layout.counts_len):
        raise MalformedHdr("HDR counts past the highest trackable value")
    return indices, counts
