"""Worker side of multi-process mode: push HDR deltas to `ttft-exporter serve`, and the wire codec.

With `push_url` in the config (or the env var TTFT_EXPORTER_PUSH_URL) the process's recorder is a
*delta store*: a daemon thread (the flusher) wakes every `push.interval_seconds`, takes what was
recorded since its previous visit (`Recorder.drain()`: one lock hold of pointer swaps; the HDR
indexing of pending values runs afterwards on the flusher thread), and POSTs it, zlib-compressed,
to `<push_url>/push` with the worker's id and a per-worker sequence number. The aggregator merges
it exactly (HDR add) and answers 200; a batch it has already applied is acknowledged again and
ignored, so a retry never counts twice.

Nothing here runs on the app's threads or raises into them. Batches not yet acknowledged stay
queued and are resent in order with exponential backoff; while the head of the queue is being
retried, new drains are merged into one tail batch that has never been sent (merging deltas is
exact), so an outage costs memory in proportion to the label cardinality, not to its length. The
queue is bounded by `push.max_pending_bytes`: past it the oldest batch is dropped and counted
(`lost_batches`, served by the aggregator as `ttft_exporter_push_lost_batches_total`). At exit
(`atexit`, and multiprocessing's exit hook) a last drain is pushed, retried for at most
`push.exit_timeout_seconds`. After `fork()` the child starts afresh: a new recorder (the parent's
data is the parent's to push), a new worker id, a new flusher.

Wire format (version 1): `POST <push_url>/push`, `Content-Type: application/x-ttft-delta`,
`Authorization: Bearer <token>` when a token is configured. The body is zlib-compressed (gzip is
accepted too) by the format itself, not by a `Content-Encoding` (which would let HTTP servers
inflate it before any size check; the aggregator refuses one), and inflates to one JSON object:

    {"format": "ttft-exporter-delta", "version": 1, "worker": "host/pid/random", "seq": 7,
     "interval": 5.0, "final": false,
     "layouts": {"seconds": [highest, digits, [le boundaries...]], "tokens": [...]},
     "labels": [[label values in the family's sorted label-name order], ...],
     "histograms": {family: [label ref, counts, count, sum,  label ref, counts, count, sum, ...]},
     "straddles": {family: [[series, boundary position, n], ...]},
     "exemplars": {family: [[series, le bucket, trace id, value, unix time], ...]},
     "requests": [[model, outcome, provider, route, tenant, n], ...],
     "in_flight": [[model, provider, route, n], ...],       (current values, not increments)
     "tenant_folds": [[model, route, n], ...], "dropped": {reason: n},
     "lost_batches": n, "push_failures": n}

Each series is four items of its family's flat list: a reference into `labels` (label tuples
are shared by the families), its counts, count and sum; `series` in the side tables is its
position in that list. The layout keeps JSON parsing cheap: few objects per series.

`counts` is the base64 of the counts payload of HdrHistogram's standard V2 encoding (ZigZag
LEB128, runs of zeros as negative numbers). The V2 header, the same for every histogram of a
unit, is not repeated: `layouts` states it once (`highest` trackable value and significant
`digits`; lowest discernible value 1, no offset, ratio 1), and `v2_header()` + counts is a
standard V2 encoding that any HdrHistogram library reads. `count` (the number of values, which
the counts must add up to: a truncated payload fails) and what the HDR format cannot carry
travel beside it: the exact `sum` of the values, and for each `le` boundary that falls inside an
HDR bucket (`pos` into the boundaries) the number `n` of that bucket's values at or under the
boundary (`straddles`). `exemplars` are the latest traced call per `le` bucket (position into the
boundaries, len(boundaries) for +Inf), which the aggregator serves in OpenMetrics.
"""

from __future__ import annotations

import atexit
import base64
import http.client
import json
import logging
import math
import os
import random
import re
import secrets
import socket
import ssl
import struct
import sys
import threading
import time
import zlib
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, compress
from operator import mul
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

from . import names, runtime
from .config import Config
from .histogram import Histogram, Layout

log = logging.getLogger("exporter.push")

ENV_URL = "TTFT_EXPORTER_PUSH_URL"
ENV_TOKEN = "TTFT_EXPORTER_PUSH_TOKEN"
FORMAT = "ttft-exporter-delta"
VERSION = 1
CONTENT_TYPE = "application/x-ttft-delta"
PUSH_PATH = "/push"

#: HdrHistogram V2 encoding: cookie, payload length, normalizing index offset, significant
#: digits, lowest discernible value, highest trackable value, integer-to-double ratio.
V2_COOKIE = 0x1C849303
_V2_HEADER = struct.Struct(">IIiIqqd")
_MAX_COUNT = 2**63 - 1
_MAX_SUM = 2**127  # sums are exact Python ints; this only keeps a hostile one small


class PushError(ValueError):
    """A push that cannot be applied; `reason` is the label of the aggregator's reject counter."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


MALFORMED = names.REJECT_MALFORMED
INCOMPATIBLE = names.REJECT_INCOMPATIBLE
#: Exemplar trace ids longer than this are refused (OpenMetrics allows 128 characters of
#: exemplar labels in all).
MAX_TRACE_ID = 100

#: (trace id, value in the family's unit, Unix time): recorder.Exemplar.
Exemplar = tuple[str, float, float]


# --- HDR V2 codec ---------------------------------------------------------------------------------

def encode_counts(hist: Histogram) -> bytes:
    """The counts payload of HdrHistogram's V2 encoding: ZigZag LEB128, zero runs negative."""
    out = bytearray()
    put = _put_varint
    zeros = hist._lo  # the stored range starts at _lo: everything below is zero
    for c in hist._counts:
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


class Sparse:
    """A received histogram: its non-empty buckets only, so validating and adding it costs in
    proportion to the buckets it touches, not to the range they span."""

    __slots__ = ("layout", "indices", "counts", "count", "total", "below")

    def __init__(self, layout: Layout, indices: Sequence[int], counts: Sequence[int],
                 count: int, total: int = 0, below: dict[int, int] | None = None):
        self.layout = layout
        self.indices = indices  # ascending HDR indices (never mutated in place: may be shared)
        self.counts = counts  # their counts, all > 0
        self.count = count  # sum(counts)
        self.total = total
        self.below = below  # straddle counts, as Histogram._at_or_below

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
    """The counts of a full V2 encoding of `layout`; PushError on anything unexpected."""
    if len(data) < _V2_HEADER.size:
        raise PushError(MALFORMED, "HDR encoding shorter than its header")
    cookie, length, offset, digits, lowest, highest, ratio = _V2_HEADER.unpack_from(data)
    if cookie & ~0xF0 != V2_COOKIE:
        raise PushError(MALFORMED, f"not an HDR V2 encoding (cookie {cookie:#x})")
    if length != len(data) - _V2_HEADER.size:
        raise PushError(MALFORMED, "HDR payload length does not match (truncated?)")
    if offset != 0 or lowest != 1 or ratio != 1.0:
        raise PushError(INCOMPATIBLE, "HDR encoding with an offset, unit or ratio not used here")
    if digits != layout.digits or highest != layout.highest:
        raise PushError(INCOMPATIBLE, f"HDR layout ({digits} digits, highest {highest}) differs "
                                      f"from the aggregator's ({layout.digits}, {layout.highest})")
    indices, counts = decode_counts(layout, data[_V2_HEADER.size:])
    return Sparse(layout, indices, counts, sum(counts))


#: Bytes with the high bit set: a multi-byte varint (a count or zero run above 63).
_MULTI_BYTE = re.compile(rb"[\x80-\xff]")
#: For single-byte ZigZag tokens v: how far the index moves, whether v is a count, the count.
_STEP = bytes(((v + 1) >> 1 if v & 1 else 1) if v < 0x80 else 0 for v in range(256))
_IS_COUNT = bytes(1 if v < 0x80 and v and not v & 1 else 0 for v in range(256))
_HALF = bytes(v >> 1 for v in range(256))


def decode_counts(layout: Layout, data: bytes) -> tuple[list[int], list[int]]:
    """(indices, counts) of the non-empty buckets of a V2 counts payload of `layout`; PushError
    when malformed.

    Runs of single-byte tokens (counts and zero runs under 64: nearly all of them) are decoded
    with C-level byte translation, accumulate and compress; longer varints one by one.
    """
    index = 0
    indices: list[int] = []
    counts: list[int] = []
    pos, n = 0, len(data)
    while pos < n:
        found = _MULTI_BYTE.search(data, pos)
        end = found.start() if found is not None else n
        if end - pos >= 12:  # a long run: C-level
            run = data[pos:end]
            starts = list(accumulate(run.translate(_STEP), initial=index))
            is_count = run.translate(_IS_COUNT)
            indices += compress(starts, is_count)
            counts += compress(run.translate(_HALF), is_count)
            index = starts[-1]
            pos = end
        else:  # a short one: byte by byte
            for v in data[pos:end]:
                if v & 1:
                    index += (v + 1) >> 1
                else:
                    if v:
                        indices.append(index)
                        counts.append(v >> 1)
                    index += 1
            pos = end
        if found is None:
            break
        v = shift = 0
        while True:  # one varint of 2..9 bytes (the 9th byte carries 8 bits)
            if pos >= n:
                raise PushError(MALFORMED, "HDR varint cut short")
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
    if index > _counts_len(layout) + 1 or (indices and indices[-1] >= _counts_len(layout)):
        raise PushError(MALFORMED, "HDR counts past the highest trackable value")
    return indices, counts


_STRADDLE_INDEX: dict[int, tuple[Layout, dict[int, int]]] = {}
_COUNTS_LEN: dict[int, tuple[Layout, int]] = {}
_BOUNDS: dict[int, tuple[Layout, list[int], list[int]]] = {}


def _bucket_bounds(layout: Layout) -> tuple[list[int], list[int]]:
    """Per HDR index: the lowest value of the bucket, and its width - 1."""
    cached = _BOUNDS.get(id(layout))
    if cached is None or cached[0] is not layout:
        n = _counts_len(layout)
        lowest = [layout.lowest_equivalent(i) for i in range(n)]
        width = [layout.highest_equivalent(i) - lowest[i] for i in range(n)]
        cached = _BOUNDS[id(layout)] = (layout, lowest, width)
    return cached[1], cached[2]


def _counts_len(layout: Layout) -> int:
    cached = _COUNTS_LEN.get(id(layout))
    if cached is None or cached[0] is not layout:
        cached = _COUNTS_LEN[id(layout)] = (layout, layout.counts_len)
    return cached[1]


def _straddle_index(layout: Layout) -> dict[int, int]:
    """boundary position -> the HDR index that it falls inside, for straddling boundaries."""
    cached = _STRADDLE_INDEX.get(id(layout))
    if cached is None or cached[0] is not layout:
        cached = (layout, {pos: i for i, poss in layout.straddles.items() for pos in poss})
        _STRADDLE_INDEX[id(layout)] = cached
    return cached[1]


#: (layout, base64 counts) -> (indices, counts, count, lowest possible sum, highest possible sum
#: or -1 when unbounded): one-bucket deltas (a series with one or a few values in the interval,
#: most series of most pushes) recur across series and pushes, and their decoding and bounds
#: are then a dictionary lookup. Only those are kept: larger ones rarely repeat.
_DECODED: dict[tuple[Layout, str], tuple[tuple[int, ...], tuple[int, ...], int, int, int]] = {}
_DECODED_MAX = 100_000
_DECODED_KEY_MAX = 8  # base64 characters: up to 6 bytes, a zero run and one count


def _decoded(layout: Layout, b64: str) -> tuple[tuple[int, ...], tuple[int, ...], int, int, int]:
    key = (layout, b64)
    found = _DECODED.get(key)
    if found is not None:
        return found
    try:
        data = base64.b64decode(b64, validate=True)
    except ValueError:
        raise PushError(MALFORMED, "histogram counts are not base64") from None
    indices, counts = decode_counts(layout, data)
    if not indices:
        raise PushError(MALFORMED, "empty histogram")
    # the sum must be possible for these buckets (values above the range only raise it)
    lowest, width = _bucket_bounds(layout)
    low = sum(map(mul, counts, map(lowest.__getitem__, indices)))
    high = -1 if indices[-1] == len(lowest) - 1 else \
        low + sum(map(mul, counts, map(width.__getitem__, indices)))
    found = (tuple(indices), tuple(counts), sum(counts), low, high)
    if len(b64) <= _DECODED_KEY_MAX:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        _DECODED[key] = found
    return found


def _read_hist(layout: Layout, b64: Any, count: Any, total: Any) -> Sparse:
    if b64.__class__ is not str:
        raise PushError(MALFORMED, "histogram counts are not a string")
    indices, counts, n, low, high = _decoded(layout, b64)
    if total.__class__ is not int or not 0 <= total <= _MAX_SUM:
        raise PushError(MALFORMED, "histogram sum must be a non-negative integer")
    if count.__class__ is not int or count != n or n > _MAX_COUNT:
        raise PushError(MALFORMED, "histogram count does not match its counts (truncated?)")
    if total < low or (total > high >= 0):
        raise PushError(MALFORMED, "histogram sum outside what its buckets allow")
    return Sparse(layout, indices, counts, n, total)


def _row(item: Any, n: int, what: str) -> list[Any]:
    if item.__class__ is not list or len(item) != n:
        raise PushError(MALFORMED, f"a {what} row is not a list of {n}")
    return item


def _read_straddles(layout: Layout, rows: Any, series: list[Sparse]) -> None:
    """[[series, boundary position, count at or under it], ...] of one family."""
    where = _straddle_index(layout)
    for item in _list(rows, "straddles"):
        s, p, n = _row(item, 3, "straddle")
        if s.__class__ is not int or not 0 <= s < len(series):
            raise PushError(MALFORMED, "straddle count of a series not in the push")
        p, n = _count(p, "boundary position"), _count(n, "straddle count")
        hist = series[s]
        below = hist.below
        if below is None:
            below = hist.below = {}
        i = where.get(p)
        if i is None or p in below:
            raise PushError(MALFORMED, f"boundary {p} does not straddle a bucket (or repeats)")
        k = bisect_left(hist.indices, i)
        if n > (hist.counts[k] if k < len(hist.indices) and hist.indices[k] == i else 0):
            raise PushError(MALFORMED, "straddle count above its bucket's count")
        below[p] = n


def _read_exemplars(layout: Layout, rows: Any, keys: list[Any],
                    into: dict[Any, dict[int, Exemplar]]) -> None:
    """[[series, le bucket, trace id, value, unix time], ...] of one family."""
    for item in _list(rows, "exemplars"):
        s, position, trace_id, value, at = _row(item, 5, "exemplar")
        if s.__class__ is not int or not 0 <= s < len(keys):
            raise PushError(MALFORMED, "exemplar of a series not in the push")
        if position.__class__ is not int or not 0 <= position <= len(layout.boundaries):
            raise PushError(MALFORMED, "exemplar bucket out of range")
        if not _label_ok(trace_id, MAX_TRACE_ID) or not all(
                type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in (value, at)):
            raise PushError(MALFORMED, "exemplar trace id, value or time is invalid")
        into.setdefault(keys[s], {})[position] = (trace_id, float(value), float(at))


# --- deltas -------------------------------------------------------------------------------------

@dataclass
class Delta:
    """What one worker recorded between two drains (or, merged, over several)."""

    worker: str = ""
    seq: int = 0
    interval: float = 0.0
    final: bool = False
    #: (family name, label values in the family's sorted label order) -> histogram of the values
    #: (a Histogram from `Recorder.drain`, a Sparse from `decode`)
    histograms: dict[tuple[str, tuple[str, ...]], Any] = field(default_factory=dict)
    #: same keys -> `le` bucket position -> latest exemplar of that bucket
    exemplars: dict[tuple[str, tuple[str, ...]], dict[int, Exemplar]] = field(
        default_factory=dict)
    #: (model, outcome, provider, route, tenant) -> calls
    requests: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: (model, provider, route) -> calls in flight now (a gauge: the latest value wins)
    in_flight: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: (model, route) -> calls whose tenant was folded into __other__
    tenant_folds: dict[tuple[str, ...], int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    lost_batches: int = 0
    push_failures: int = 0

    def absorb(self, later: "Delta") -> None:
        """Merge a later delta of the same worker into this one, exactly."""
        for key, hist in later.histograms.items():
            mine = self.histograms.get(key)
            if mine is None:
                self.histograms[key] = hist
            else:
                mine.add(hist)
        for key, theirs_e in later.exemplars.items():
            mine_e = self.exemplars.setdefault(key, {})
            for position, exemplar in theirs_e.items():
                if position not in mine_e or mine_e[position][2] <= exemplar[2]:
                    mine_e[position] = exemplar
        for mine_d, theirs in ((self.requests, later.requests),
                               (self.tenant_folds, later.tenant_folds),
                               (self.dropped, later.dropped)):
            for key, n in theirs.items():
                mine_d[key] = mine_d.get(key, 0) + n
        self.in_flight = dict(later.in_flight)
        self.interval = later.interval
        self.final = later.final
        self.lost_batches += later.lost_batches
        self.push_failures += later.push_failures

    def calls(self) -> int:
        return sum(self.requests.values())


def layouts_of(recorder: Any) -> dict[str, list[Any]]:
    """The layout of each unit's families, as the payload states it."""
    out: dict[str, list[Any]] = {}
    for state in recorder.families.values():
        layout = state.layout
        out.setdefault(state.family.unit, [layout.highest, layout.digits,
                                           list(layout.boundaries)])
    return out


def payload(delta: Delta, layouts: dict[str, list[Any]]) -> dict[str, Any]:
    """The JSON document of a delta (before compression)."""
    table: dict[tuple[str, ...], int] = {}
    histograms: dict[str, list[Any]] = {}
    straddles: dict[str, list[list[int]]] = {}
    exemplars: dict[str, list[list[Any]]] = {}
    for (family, values), hist in delta.histograms.items():
        if not hist.count:
            continue
        ref = table.get(values)
        if ref is None:
            ref = table[values] = len(table)
        flat = histograms.setdefault(family, [])
        series = len(flat) // 4
        flat += [ref, base64.b64encode(encode_counts(hist)).decode("ascii"), hist.count,
                 hist.total]
        below = hist._at_or_below
        if below:
            straddles.setdefault(family, []).extend(
                [series, p, n] for p, n in sorted(below.items()) if n)
        found = delta.exemplars.get((family, values))
        if found:
            exemplars.setdefault(family, []).extend(
                [series, p, *e] for p, e in sorted(found.items()))
    return {
        "format": FORMAT, "version": VERSION, "worker": delta.worker, "seq": delta.seq,
        "interval": delta.interval, "final": delta.final, "layouts": layouts,
        "labels": [list(values) for values in table],
        "histograms": histograms, "straddles": straddles, "exemplars": exemplars,
        "requests": [[*k, n] for k, n in delta.requests.items() if n],
        "in_flight": [[*k, n] for k, n in delta.in_flight.items() if n],
        "tenant_folds": [[*k, n] for k, n in delta.tenant_folds.items() if n],
        "dropped": {r: n for r, n in delta.dropped.items() if n},
        "lost_batches": delta.lost_batches, "push_failures": delta.push_failures,
    }


def encode(delta: Delta, layouts: dict[str, list[Any]], level: int = 6) -> bytes:
    """The compressed body of a push."""
    text = json.dumps(payload(delta, layouts), separators=(",", ":"))
    return zlib.compress(text.encode("utf-8"), level)


def inflate(body: bytes, limit: int) -> bytes:
    """zlib or gzip body -> bytes, at most `limit` of them (a decompression bomb is rejected)."""
    d = zlib.decompressobj(47)  # 32 + 15: zlib or gzip header, detected
    try:
        out = d.decompress(body, limit)
    except zlib.error as e:
        raise PushError(MALFORMED, f"body does not inflate: {e}") from None
    if d.unconsumed_tail:
        raise PushError(names.REJECT_TOO_LARGE, f"body inflates to more than {limit} bytes")
    if not d.eof:
        raise PushError(MALFORMED, "compressed body cut short")
    if d.unused_data:
        raise PushError(MALFORMED, "bytes after the compressed body")
    return out


def decode(body: bytes, recorder: Any, *, max_inflated: int = 64 * 2**20,
           compressed: bool = True) -> Delta:
    """Validate a push body completely and return its delta; PushError names what is wrong.

    Nothing is applied here, so a bad push changes nothing. `recorder` supplies the families,
    their label names and layouts, and the label-length limit.
    """
    raw = inflate(body, max_inflated) if compressed else body
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise PushError(MALFORMED, "body is not JSON") from None
    return from_payload(doc, recorder)


def from_payload(doc: Any, recorder: Any) -> Delta:
    """A validated Delta from a decoded JSON document (see `decode`)."""
    if not isinstance(doc, dict):
        raise PushError(MALFORMED, "body is not a JSON object")
    if doc.get("format") != FORMAT:
        raise PushError(MALFORMED, "not a ttft-exporter delta")
    if doc.get("version") != VERSION:
        raise PushError(INCOMPATIBLE, f"unsupported version {doc.get('version')!r}")
    max_len = recorder.config.labels.max_label_length
    worker = doc.get("worker")
    if not _label_ok(worker, max_len):
        raise PushError(MALFORMED, "worker id must be a short printable string")
    delta = Delta(worker=worker, seq=_count(doc.get("seq"), "seq"))
    interval = doc.get("interval")
    if type(interval) not in (int, float) or not 0 <= interval <= 86400:
        raise PushError(MALFORMED, "interval must be a number of seconds")
    delta.interval = float(interval)
    final = doc.get("final")
    if type(final) is not bool:
        raise PushError(MALFORMED, "final must be true or false")
    delta.final = final
    layouts = doc.get("layouts")
    if not isinstance(layouts, dict):
        raise PushError(MALFORMED, "layouts missing")
    mine = layouts_of(recorder)
    for unit, layout in mine.items():
        if layouts.get(unit) != layout:
            raise PushError(INCOMPATIBLE, f"the {unit} histogram layout differs from the "
                                          f"aggregator's (digits, range or buckets)")
    families = recorder.families
    table = _list(doc.get("labels"), "labels")
    by_family = doc.get("histograms")
    straddles, exemplars = doc.get("straddles"), doc.get("exemplars")
    if by_family.__class__ is not dict or straddles.__class__ is not dict or \
            exemplars.__class__ is not dict:
        raise PushError(MALFORMED, "histograms, straddles and exemplars must be objects keyed "
                                   "by family")
    if not set(straddles) <= set(by_family) or not set(exemplars) <= set(by_family):
        raise PushError(MALFORMED, "straddles or exemplars of a family without histograms")
    histograms = delta.histograms
    checked: dict[tuple[int, int], tuple[str, ...]] = {}
    n_table = len(table)
    for name, flat in by_family.items():
        state = families.get(name)
        if state is None:
            raise PushError(MALFORMED, f"unknown histogram family {str(name)[:80]!r}")
        if flat.__class__ is not list or len(flat) % 4:
            raise PushError(MALFORMED, f"{name}: expected [labels, counts, count, sum] x series")
        layout, n_labels = state.layout, len(state.label_names)
        phase = state.label_names.index(names.PHASE) \
            if state.family.extra_label == names.PHASE else -1
        keys: list[tuple[str, tuple[str, ...]]] = []
        series: list[Sparse] = []
        it = iter(flat)
        for ref, b64, count, total in zip(it, it, it, it):
            if ref.__class__ is not int or not 0 <= ref < n_table:
                raise PushError(MALFORMED, "label reference out of the labels table")
            labels = checked.get((ref, n_labels))
            if labels is None:
                labels = checked[(ref, n_labels)] = _labels(table[ref], n_labels, max_len,
                                                            "histogram labels")
            if phase >= 0 and labels[phase] not in names.PHASES:
                raise PushError(MALFORMED, "unknown phase")
            key = (name, labels)
            if key in histograms:
                raise PushError(MALFORMED, "a series appears twice")
            hist = histograms[key] = _read_hist(layout, b64, count, total)
            keys.append(key)
            series.append(hist)
        if name in straddles:
            _read_straddles(layout, straddles[name], series)
        if name in exemplars:
            _read_exemplars(layout, exemplars[name], keys, delta.exemplars)
    _rows(doc.get("requests"), "requests", 5, max_len, delta.requests)
    for key in delta.requests:
        if key[1] not in names.OUTCOMES:
            raise PushError(MALFORMED, f"unknown outcome {key[1][:40]!r}")
    _rows(doc.get("in_flight"), "in_flight", 3, max_len, delta.in_flight)
    _rows(doc.get("tenant_folds"), "tenant_folds", 2, max_len, delta.tenant_folds)
    dropped = doc.get("dropped")
    if not isinstance(dropped, dict):
        raise PushError(MALFORMED, "dropped must be an object")
    for reason, n in dropped.items():
        if reason not in names.DROP_REASONS:
            raise PushError(MALFORMED, f"unknown drop reason {str(reason)[:40]!r}")
        delta.dropped[reason] = _count(n, "drop count")
    delta.lost_batches = _count(doc.get("lost_batches"), "lost_batches")
    delta.push_failures = _count(doc.get("push_failures"), "push_failures")
    return delta


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_COUNT:
        raise PushError(MALFORMED, f"{what} must be a non-negative integer")
    return value


def _label_ok(value: Any, max_len: int) -> bool:
    return type(value) is str and 0 < len(value) <= max_len and value.isprintable()


#: Label tuples already validated, by maximum length (the same few recur in every push).
_VALID_LABELS: dict[tuple[int, tuple[Any, ...]], tuple[str, ...]] = {}


def _labels(values: Any, n: int, max_len: int, what: str) -> tuple[str, ...]:
    if values.__class__ is not list or len(values) != n:
        raise PushError(MALFORMED, f"{what}: expected {n} label values")
    try:
        key = (max_len, tuple(values))
        known = _VALID_LABELS.get(key)
    except TypeError:  # an unhashable value: a list or an object
        raise PushError(MALFORMED, f"{what}: a label value is not a string") from None
    if known is not None:
        return known
    for v in values:
        if not _label_ok(v, max_len):
            raise PushError(MALFORMED, f"{what}: a label value is not a short printable string")
    if len(_VALID_LABELS) >= 200_000:
        _VALID_LABELS.clear()
    labels = _VALID_LABELS[key] = key[1]
    return labels


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise PushError(MALFORMED, f"{what} must be a list")
    return value


def _rows(value: Any, what: str, n: int, max_len: int, into: dict[tuple[str, ...], int]) -> None:
    for row in _list(value, what):
        if not isinstance(row, list) or len(row) != n + 1:
            raise PushError(MALFORMED, f"{what}: a row is not {n} labels and a count")
        key = _labels(row[:n], n, max_len, what)
        if key in into:
            raise PushError(MALFORMED, f"{what}: a row appears twice")
        into[key] = _count(row[n], f"{what} count")


# --- the flusher (worker side) ------------------------------------------------------------------

def new_worker_id() -> str:
    host = "".join(ch for ch in socket.gethostname() if ch.isprintable())[:60] or "host"
    return f"{host}/{os.getpid()}/{secrets.token_hex(4)}"


@dataclass
class _Batch:
    seq: int
    delta: Delta
    body: bytes
    attempted: bool = False


#: HTTP answers after which resending the same batch cannot succeed: drop it (and count it).
_PERMANENT = frozenset({400, 404, 405, 409, 413, 415, 422})


class Flusher:
    """One per process: drains the recorder every interval and pushes to the aggregator."""

    def __init__(self, url: str, config: Config, recorder: Any):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"push URL must be http(s)://host[:port][/path], got {url!r}")
        self.url = url
        self.config = config
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path.rstrip("/") + PUSH_PATH
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            self._ssl = ssl.create_default_context(cafile=config.push.ca_file or None)
        self._token = _read_token(config.push.token_file)
        self.worker = new_worker_id()
        self.recorder = recorder
        self._retired: list[Any] = []
        self._seq = 0
        self._pending: deque[_Batch] = deque()
        self._lost = 0  # batches dropped and not yet reported to the aggregator
        self._failures = 0  # failed attempts not yet reported
        self._lock = threading.Lock()  # the queue and the connection; never taken by app threads
        self._conn: http.client.HTTPConnection | None = None
        self._stop = threading.Event()
        self._retry_at = 0.0
        self._backoff_step = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="ttft-exporter-push", daemon=True)
        self.acked = 0  # batches acknowledged (tests, bench)

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> "Flusher":
        self._thread.start()
        return self

    def follow(self, recorder: Any) -> None:
        """The process switched to a new recorder (configure()): drain the old one once more."""
        with self._lock:
            if recorder is not self.recorder:
                self._retired.append(self.recorder)
                self.recorder = recorder

    def close(self, timeout: float) -> None:
        """Stop the thread, push a last drain; retry what is unacknowledged for `timeout` s."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(timeout, 0.1) + self.config.push.timeout_seconds)
        deadline = time.monotonic() + timeout
        with self._lock:
            self._collect(final=True)
            self._retry_at = 0.0
            delay = 0.05
            while self._pending:
                self._send_pending()
                left = deadline - time.monotonic()
                if not self._pending or left <= 0:
                    break
                time.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)
            self._close_connection()

    def abandon(self) -> None:
        """In a forked child: this flusher (and its queue) belongs to the parent; forget it."""
        self._stop.set()
        conn, self._conn = self._conn, None
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.close()  # our copy of the descriptor only; the parent keeps its own
            except OSError:
                pass

    def flush(self) -> bool:
        """Drain now and try to send everything; True when nothing is left unacknowledged."""
        with self._lock:
            self._collect(final=False)
            self._retry_at = 0.0
            self._send_pending()
            return not self._pending

    def pending(self) -> int:
        return len(self._pending)

    def _run(self) -> None:
        interval = self.config.push.interval_seconds
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(next_at - time.monotonic(), 0)):
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # we fell behind (suspended process): do not burst
                next_at = now + interval
            try:
                with self._lock:
                    self._collect(final=False)
                    if now >= self._retry_at:
                        self._send_pending()
            except Exception:  # never let the thread die: the process would stop pushing
                log.exception("ttft-exporter push: unexpected error (will retry)")

    # draining and queueing ---------------------------------------------------------------------

    def _collect(self, final: bool) -> None:
        """Drain the recorder(s) into the queue (merging into a never-sent tail batch)."""
        delta = self.recorder.drain()
        for old in self._retired:
            delta.absorb(old.drain())
        self._retired.clear()
        delta.worker = self.worker
        delta.interval = self.config.push.interval_seconds
        delta.final = final
        delta.lost_batches, self._lost = self._lost, 0
        delta.push_failures, self._failures = self._failures, 0
        layouts = layouts_of(self.recorder)
        tail = self._pending[-1] if self._pending else None
        if tail is not None and not tail.attempted:
            tail.delta.absorb(delta)
            tail.body = encode(tail.delta, layouts)
        else:
            self._seq += 1
            delta.seq = self._seq
            self._pending.append(_Batch(self._seq, delta, encode(delta, layouts)))
        limit = self.config.push.max_pending_bytes
        while len(self._pending) > 1 and sum(len(b.body) for b in self._pending) > limit:
            self._drop(self._pending.popleft(), "the unacknowledged deltas exceed "
                                                "push.max_pending_bytes")

    def _drop(self, batch: _Batch, why: str) -> None:
        self._lost += 1 + batch.delta.lost_batches
        self._failures += batch.delta.push_failures
        log.warning("ttft-exporter push: dropped batch %d of worker %s (%d calls): %s",
                    batch.seq, self.worker, batch.delta.calls(), why)

    # sending ------------------------------------------------------------------------------------

    def _send_pending(self) -> None:
        while self._pending:
            batch = self._pending[0]
            batch.attempted = True
            status, detail = self._post(batch.body)
            if 200 <= status < 300:
                self._pending.popleft()
                self.acked += 1
                self._backoff_step = 0
                if self._failing:
                    self._failing = False
                    log.warning("ttft-exporter push: %s reachable again", self.url)
                continue
            if status in _PERMANENT:
                self._pending.popleft()
                self._drop(batch, f"the aggregator rejected it: HTTP {status} {detail}")
                continue
            self._failures += 1
            if not self._failing:
                self._failing = True
                log.warning("ttft-exporter push: cannot push to %s (%s); keeping the deltas and "
                            "retrying", self.url, detail or f"HTTP {status}")
            interval = self.config.push.interval_seconds
            delay = min(interval * 2 ** self._backoff_step, max(60.0, interval))
            self._backoff_step = min(self._backoff_step + 1, 16)
            self._retry_at = time.monotonic() + delay * random.uniform(0.5, 1.0)
            return

    def _post(self, body: bytes) -> tuple[int, str]:
        """POST one body; (status, detail), status 0 for a connection error."""
        headers = {"Content-Type": CONTENT_TYPE, "Content-Length": str(len(body))}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (0, 1):
            reused = self._conn is not None
            try:
                conn = self._connection()
                conn.request("POST", self._path, body=body, headers=headers)
                response = conn.getresponse()
                text = response.read(512)
                if response.will_close:
                    self._close_connection()
                return response.status, text.decode("utf-8", "replace").strip()
            except (OSError, http.client.HTTPException) as e:
                self._close_connection()
                if reused and attempt == 0:
                    continue  # a kept-alive connection the server had closed: once more, fresh
                return 0, f"{type(e).__name__}: {e}"
        return 0, "unreachable"

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = self.config.push.timeout_seconds
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                         context=self._ssl)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _read_token(path: str) -> str:
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            log.warning("ttft-exporter push: cannot read push.token_file %s: %s", path,
                        e.strerror or e)
            return ""
    return os.environ.get(ENV_TOKEN, "").strip()


# --- process-wide wiring ------------------------------------------------------------------------

_flusher: Flusher | None = None
_enabled = True
_wiring_lock = threading.Lock()


def push_url(config: Config) -> str:
    """The URL this process pushes to: the env var wins over the config; '' when off."""
    return os.environ.get(ENV_URL, "").strip() or config.push_url


def current() -> Flusher | None:
    """The running flusher, if push is on (tests, diagnostics)."""
    return _flusher


def disable() -> None:
    """Never push from this process (`ttft-exporter serve` is the aggregator, not a worker)."""
    global _enabled
    _enabled = False
    stop(timeout=0)


def stop(timeout: float | None = None) -> None:
    """Stop pushing, after a last drain (retried for `timeout` s, default the config's)."""
    global _flusher
    with _wiring_lock:
        flusher, _flusher = _flusher, None
    if flusher is not None:
        flusher.close(flusher.config.push.exit_timeout_seconds if timeout is None else timeout)


def _on_new_state(state: runtime.State) -> None:
    """Called for every new process-wide state (configure(), first use): start/follow/stop."""
    global _flusher
    url = push_url(state.config) if _enabled else ""
    with _wiring_lock:
        flusher = _flusher
        if flusher is not None and url and flusher.url == url and \
                flusher.config.push == state.config.push:
            flusher.follow(state.recorder)
            return
        _flusher = None
    if flusher is not None:
        flusher.close(timeout=0)  # one last attempt; a stopped push must not stall configure()
    if not url:
        return
    try:
        new = Flusher(url, state.config, state.recorder)
    except ValueError as e:
        log.warning("ttft-exporter push: %s; not pushing", e)
        return
    with _wiring_lock:
        _flusher = new.start()


def _at_exit() -> None:
    try:
        stop()
    except Exception:
        log.exception("ttft-exporter push: final push failed")


def _after_fork_in_child() -> None:
    """A forked worker: the parent's recorder and queue are the parent's. Start afresh."""
    global _flusher, _wiring_lock
    flusher, _flusher = _flusher, None
    _wiring_lock = threading.Lock()  # it may have been held by another thread at fork time
    if flusher is None:
        return
    flusher.abandon()
    try:
        runtime.configure(runtime.state().config)  # fresh recorder -> a new flusher
    except Exception:
        log.exception("ttft-exporter push: could not restart after fork")
        return
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:  # multiprocessing children leave through os._exit: no atexit
        mp_util.Finalize(None, _at_exit, exitpriority=100)


def _install() -> None:
    """Hook state creation: push follows configure() without a new public function."""
    original = runtime._new_state
    if getattr(original, "_push_hook", False):
        return

    def _new_state(config: Config) -> runtime.State:
        state = original(config)
        try:
            _on_new_state(state)
        except Exception:  # never let push break configure() or a call's first state()
            log.exception("ttft-exporter push: could not start")
        return state

    _new_state._push_hook = True  # type: ignore[attr-defined]
    runtime._new_state = _new_state  # type: ignore[assignment]
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    existing = runtime._state
    if existing is not None:  # a state made before this module was imported
        _on_new_state(existing)


_install()
