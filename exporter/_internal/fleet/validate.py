"""A push body validated completely, into a Delta: nothing is applied before all of it passed.

`decode` inflates (refusing a decompression bomb), bounds what parsing it would cost before the
parser builds anything (`check_parse_cost`), parses and checks every field of the wire format
(wire.py) against the aggregator's schema: families, label counts and lengths, closed
label values, HDR counts that add up to their count, sums that their buckets allow, straddle and
exemplar positions, row bounds. `PushError.reason` names the aggregator's reject counter.
"""

from __future__ import annotations

import base64
import json
from array import array
import math
import re
import zlib
from bisect import bisect_left
from operator import mul
from typing import Any, Sequence

from .. import names
from ..record.exemplar import Exemplar
from ..record.histogram import Layout
from ..record.schema import Schema
from .codec import MalformedHdr, Sparse, decode_counts
from .wire import (FORMAT, INCOMPATIBLE, MALFORMED, MAX_TRACE_ID, VERSION, Delta, PushError,
                   as_object)

_MAX_COUNT = 2**63 - 1
_MAX_SUM = 2**127  # sums are exact Python ints; this only keeps a hostile one small


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


# --- what parsing a push costs, bounded before the parser builds anything ------------------------
# json.loads builds a Python object per JSON value: 16 MiB of `{},` is 5.6 million dicts
# (~390 MiB). The counts below are upper bounds of what CPython's parser allocates (measured by
# tests/test_aggregator.py::test_the_parse_cost_estimate_bounds_what_json_allocates): a scalar
# (string, number, true...) costs at most 13 bytes per byte of its text (`-9,`: an int of 28
# bytes and its slot in the parent list), an array at most 96 bytes more than its text (`[0],`: a
# list of 4 slots and its slot in the parent). The format's own objects are a few, keyed by name.

#: What parsing one push may cost: this many bytes per byte of `max_decompressed_bytes`
#: (256 MiB at the default 16 MiB). The format's densest valid rows (exemplars, counter rows
#: of short labels) estimate at 16 bytes per byte of text; realistic pushes at about 8.
PARSE_BUDGET_PER_BYTE = 16
SCALAR_COST_PER_BYTE = 13
ARRAY_COST = 96
#: The format's objects (the document, `layouts`, `histograms`...: about ten) and their
#: members (families, counters, units, top-level keys: a few hundred), with room to grow.
MAX_OBJECTS = 64
MAX_MEMBERS = 4096
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def parse_cost(raw: bytes) -> tuple[int, int, int]:
    """(estimated bytes, objects, members) of parsing `raw`, counting the brackets, braces and
    colons anywhere (an upper bound: those inside strings build nothing)."""
    return (SCALAR_COST_PER_BYTE * len(raw) + ARRAY_COST * raw.count(b"["), raw.count(b"{"),
            raw.count(b":"))


def check_parse_cost(raw: bytes, max_inflated: int) -> None:
    """Refuse (too_large), before it is parsed, a document whose parse would cost more than
    the budget of `max_inflated` or that holds more objects than the format has."""
    budget = PARSE_BUDGET_PER_BYTE * max_inflated

    def over(cost: int, objects: int, members: int) -> bool:
        return cost > budget or objects > MAX_OBJECTS or members > MAX_MEMBERS

    counts = parse_cost(raw)
    if over(*counts) and b'"' in raw:  # count again outside strings (a copy, only here)
        counts = parse_cost(_STRING.sub(b'""', raw))
    if over(*counts):
        cost, objects, members = counts
        raise PushError(names.REJECT_TOO_LARGE,
                        f"parsing this push would build {cost / 2**20:.0f} MiB of objects "
                        f"({objects} objects, {members} members); at most "
                        f"{budget / 2**20:.0f} MiB ({PARSE_BUDGET_PER_BYTE} x "
                        f"aggregator.max_decompressed_bytes), {MAX_OBJECTS} objects and "
                        f"{MAX_MEMBERS} members")


def decode(body: bytes, schema: Schema, *, max_inflated: int = 64 * 2**20) -> Delta:
    """Validate a push body completely and return its delta; PushError names what is wrong.

    Nothing is applied here, so a bad push changes nothing. `schema` supplies the families,
    their label names and layouts, and the label-length limit.
    """
    raw = inflate(body, max_inflated)
    if not raw.isascii():  # workers escape every other character (json.dumps' default)
        raise PushError(MALFORMED, "body is not ASCII JSON")
    check_parse_cost(raw, max_inflated)
    text = raw.decode("ascii")
    del raw  # the parse's peak holds the text and the objects, not the bytes too
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise PushError(MALFORMED, "body is not JSON") from None
    return from_payload(doc, schema)


def from_payload(doc: Any, schema: Schema) -> Delta:
    """A validated Delta from a decoded JSON document (see `decode`)."""
    if not isinstance(doc, dict):
        raise PushError(MALFORMED, "body is not a JSON object")
    if doc.get("format") != FORMAT:
        raise PushError(MALFORMED, "not a ttft-exporter delta")
    if doc.get("version") != VERSION:
        raise PushError(INCOMPATIBLE, f"unsupported version {doc.get('version')!r}")
    max_len = schema.max_label_length
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
    families = schema.families
    mine = schema.layouts()
    pushed = doc.get("histograms")
    units = {families[name].family.unit for name in pushed if name in families} \
        if pushed.__class__ is dict else set()
    for unit, layout in mine.items():
        if (unit in units or unit in layouts) and layouts.get(unit) != layout:
            raise PushError(INCOMPATIBLE, f"the {unit} histogram layout differs from the "
                                          f"aggregator's (digits, range or buckets)")
    table = _list(doc.get("labels"), "labels")
    _bounded(doc, schema.max_series)
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
        closed = _closed(state.label_names)
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
            if closed:
                _check_closed(closed, labels)
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
    later = doc.get("counters", {})
    if not isinstance(later, dict):
        raise PushError(MALFORMED, "counters must be an object")
    for name in later:
        counter = names.COUNTERS_BY_NAME.get(name)
        if counter is None or counter.wire:
            raise PushError(MALFORMED, f"unknown counter {str(name)[:80]!r}")
    for counter in names.COUNTERS:
        if counter.wire:
            if counter.wire not in doc:
                continue
            value = doc[counter.wire]
        elif counter.name in later:
            value = later[counter.name]
        else:
            continue
        delta.rows[counter.name] = _counter_rows(counter, value, max_len)
    delta.lost_batches = _count(doc.get("lost_batches"), "lost_batches")
    delta.push_failures = _count(doc.get("push_failures"), "push_failures")
    retry = doc.get("retry", False)
    if type(retry) is not bool:
        raise PushError(MALFORMED, "retry must be true or false")
    delta.retry = retry
    return delta


def _bounded(doc: dict[str, Any], limit: int) -> None:
    """Refuse, before any work, a push with more series or rows than a family may hold: a
    counter holds `limit` rows and, past them, its overflow rows (names.Counter.overflow)."""
    histograms = doc.get("histograms")
    series = sum(len(flat) // 4 for flat in histograms.values() if flat.__class__ is list) \
        if histograms.__class__ is dict else 0
    counters = doc.get("counters")
    later = counters if counters.__class__ is dict else {}
    for what, n, most in (
            ("series", series, limit), ("label sets", _size(doc.get("labels")), limit),
            *((c.wire, _size(doc.get(c.wire)), limit + _overflow_rows(c))
              for c in names.COUNTERS if c.wire),
            *((name, _size(value), limit + _overflow_rows(names.COUNTERS_BY_NAME[name]))
              for name, value in later.items() if name in names.COUNTERS_BY_NAME)):
        if n > most:
            raise PushError(names.REJECT_TOO_LARGE, f"{n} {what} in one push: more than "
                                                    f"labels.max_series ({limit}) allows")


def _overflow_rows(counter: names.Counter) -> int:
    """The overflow rows a counter can hold past `labels.max_series`: one per combination of
    its closed labels' values."""
    return math.prod(len(values) for _, values in counter.closed)


def _size(value: Any) -> int:
    """Items in a list (what a malformed value holds counts as none: refused later)."""
    return len(value) if value.__class__ is list else 0


def _closed(label_names: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
    """(position, allowed values) of the labels whose values are a closed set."""
    return [(i, names.CLOSED_LABELS[label]) for i, label in enumerate(label_names)
            if label in names.CLOSED_LABELS]


def _check_closed(closed: Sequence[tuple[int, tuple[str, ...]]], values: tuple[str, ...]
                  ) -> None:
    for i, allowed in closed:
        if values[i] not in allowed:
            raise PushError(MALFORMED, f"unknown label value {values[i][:40]!r}")


def _counter_rows(counter: names.Counter, value: Any, max_len: int
                  ) -> dict[tuple[str, ...], int]:
    """One counter's rows: [[label values..., n], ...], or {value: n} for `_as_object`."""
    what = counter.wire or counter.name
    found: dict[tuple[str, ...], int] = {}
    if as_object(counter):
        if not isinstance(value, dict):
            raise PushError(MALFORMED, f"{what} must be an object")
        for key, n in value.items():
            if key not in counter.zero_rows:
                raise PushError(MALFORMED, f"{what}: unknown key {str(key)[:40]!r}")
            found[(key,)] = _count(n, f"{what} count")
        return found
    _rows(value, what, len(counter.labels), max_len, found)
    closed = counter.closed
    for key in found:
        _check_closed(closed, key)
    return found


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


def _rows(value: Any, what: str, n: int, max_len: int, into: dict[tuple[str, ...], int]
          ) -> None:
    for row in _list(value, what):
        if not isinstance(row, list) or len(row) != n + 1:
            raise PushError(MALFORMED, f"{what}: a row is not {n} labels and a count")
        key = _labels(row[:n], n, max_len, what)
        if key in into:
            raise PushError(MALFORMED, f"{what}: a row appears twice")
        into[key] = _count(row[n], f"{what} count")


#: (layout, base64 counts) -> (indices, counts, count, lowest possible sum, highest possible sum
#: or -1 when unbounded): one-bucket deltas (a series with one or a few values in the interval,
#: most series of most pushes) recur across series and pushes, and their decoding and bounds
#: are then a dictionary lookup. Only those are kept: larger ones rarely repeat.
#: Indices and counts are kept as machine arrays, 12 bytes a bucket: as Python ints (an index
#: past 256 is an object of its own) they took ~46, and a valid push of dense histograms
#: (0.3 MB compressed, 16 MiB inflated: 11 million buckets) grew `serve` by 550 MiB.
_DECODED: dict[tuple[Layout, str], tuple[Sequence[int], Sequence[int], int, int, int]] = {}
_DECODED_MAX = 100_000
_DECODED_KEY_MAX = 8  # base64 characters: up to 6 bytes, a zero run and one count


def _decoded(layout: Layout, b64: str) -> tuple[Sequence[int], Sequence[int], int, int, int]:
    key = (layout, b64)
    found = _DECODED.get(key)
    if found is not None:
        return found
    try:
        data = base64.b64decode(b64, validate=True)
    except ValueError:
        raise PushError(MALFORMED, "histogram counts are not base64") from None
    try:
        indices, counts = decode_counts(layout, data)
    except MalformedHdr as e:
        raise PushError(MALFORMED, str(e)) from None
    if not indices:
        raise PushError(MALFORMED, "empty histogram")
    # the sum must be possible for these buckets (values above the range only raise it)
    lowest, width = layout.bucket_bounds()
    low = sum(map(mul, counts, map(lowest.__getitem__, indices)))
    high = -1 if indices[-1] == len(lowest) - 1 else \
        low + sum(map(mul, counts, map(width.__getitem__, indices)))
    n = sum(counts)
    if n > _MAX_COUNT:
        raise PushError(MALFORMED, "histogram count past 2^63 - 1")
    found = (array("i", indices), array("q", counts), n, low, high)
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
    if count.__class__ is not int or count != n:
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
    where = layout.straddle_index
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
