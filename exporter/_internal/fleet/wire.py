"""The push wire format: what a worker sends `ttft-exporter serve`, and its full validation.

Version 1: `POST <push_url>/push`, `Content-Type: application/x-ttft-delta`,
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
     "tenant_folds": [[model, route, n], ...], "label_folds": {label: n},
     "input_tokens": [[model, provider, route, tenant, n], ...], "cached_tokens": [...],
     "upstreams": [[address, fingerprint, model, provider, region, n], ...],
     "counters": {counter: [[label values in the counter's label order..., n], ...]},
     "dropped": {reason: n}, "lost_batches": n, "push_failures": n}

Each series is four items of its family's flat list: a reference into `labels` (label tuples
are shared by the families), its counts, count and sum; `series` in the side tables is its
position in that list. The layout keeps JSON parsing cheap: few objects per series.

`counts` is the base64 of the counts payload of HdrHistogram's standard V2 encoding
(hdr_codec.py). The V2 header, the same for every histogram of a unit, is not repeated:
`layouts` states it once (`highest` trackable value and significant `digits`; lowest
discernible value 1, no offset, ratio 1). `count` (the number of values, which the counts must
add up to: a truncated payload fails) and what the HDR format cannot carry travel beside it:
the exact `sum` of the values, and for each `le` boundary that falls inside an HDR bucket
(`pos` into the boundaries) the number `n` of that bucket's values at or under the boundary
(`straddles`). `exemplars` are the latest traced call per `le` bucket (position into the
boundaries, len(boundaries) for +Inf), which the aggregator serves in OpenMetrics.

`input_tokens`, `cached_tokens` and `upstreams` (the per-tenant usage counters and the upstream
identities), `counters` (names.COUNTERS: finish reasons, agent tasks) and the `count` layout
came after the first release of version 1 and may be absent; a layout is required only for the
units the push's families use. `decode()` validates every field before anything is applied, so
a bad push changes nothing; `PushError.reason` names the aggregator's reject counter.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from bisect import bisect_left
from dataclasses import dataclass, field
from operator import mul
from typing import Any, Union

from .. import names
from ..record import exemplar
from ..record.exemplar import Exemplar
from ..record.histogram import Histogram, Layout
from ..record.schema import Schema
from .codec import MalformedHdr, Sparse, decode_counts, encode_counts

FORMAT = "ttft-exporter-delta"
VERSION = 1
CONTENT_TYPE = "application/x-ttft-delta"
PUSH_PATH = "/push"
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

#: The histogram of one series in a delta: recorded here (Histogram) or received (Sparse).
DeltaHistogram = Union[Histogram, Sparse]
SeriesKey = tuple[str, tuple[str, ...]]


@dataclass
class Delta:
    """What one worker recorded between two drains (or, merged, over several)."""

    worker: str = ""
    seq: int = 0
    interval: float = 0.0
    final: bool = False
    #: (family name, label values in the family's sorted label order) -> histogram of the values
    histograms: dict[SeriesKey, DeltaHistogram] = field(default_factory=dict)
    #: same keys -> `le` bucket position -> latest exemplar of that bucket
    exemplars: dict[SeriesKey, dict[int, Exemplar]] = field(default_factory=dict)
    #: (model, outcome, provider, route, tenant) -> calls
    requests: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: (model, provider, route) -> calls in flight now (a gauge: the latest value wins)
    in_flight: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: (model, route) -> calls whose tenant was folded into __other__
    tenant_folds: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: model / route / provider / task / series -> calls whose label (set) folded
    label_folds: dict[str, int] = field(default_factory=dict)
    #: names.COUNTERS by name -> label values -> count
    counters: dict[str, dict[tuple[str, ...], int]] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    #: (model, provider, route, tenant) -> input tokens / cached input tokens (provider usage)
    input_tokens: dict[tuple[str, ...], int] = field(default_factory=dict)
    cached_tokens: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: (address, fingerprint, model, provider, region) -> calls that reached that upstream
    upstreams: dict[tuple[str, ...], int] = field(default_factory=dict)
    lost_batches: int = 0
    push_failures: int = 0

    def absorb(self, later: "Delta") -> None:
        """Merge a later delta of the same worker into this one, exactly."""
        for key, hist in later.histograms.items():
            mine = self.histograms.get(key)
            if mine is None:
                self.histograms[key] = hist
            else:
                mine.add(hist)  # type: ignore[arg-type]  (both of one kind within a role)
        for key, theirs in later.exemplars.items():
            exemplar.merge(self.exemplars.setdefault(key, {}), theirs)
        for mine_d, theirs_d in ((self.requests, later.requests),
                                 (self.tenant_folds, later.tenant_folds),
                                 (self.label_folds, later.label_folds),
                                 (self.dropped, later.dropped),
                                 (self.input_tokens, later.input_tokens),
                                 (self.cached_tokens, later.cached_tokens),
                                 (self.upstreams, later.upstreams)):
            for row, n in theirs_d.items():
                mine_d[row] = mine_d.get(row, 0) + n
        for name, rows in later.counters.items():
            mine_rows = self.counters.setdefault(name, {})
            for row, n in rows.items():
                mine_rows[row] = mine_rows.get(row, 0) + n
        self.in_flight = dict(later.in_flight)
        self.interval = later.interval
        self.final = later.final
        self.lost_batches += later.lost_batches
        self.push_failures += later.push_failures

    def calls(self) -> int:
        return sum(self.requests.values())


# --- encoding ---------------------------------------------------------------------------------

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
        below = hist.at_or_below
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
        "label_folds": {label: n for label, n in delta.label_folds.items() if n},
        "counters": {name: [[*k, n] for k, n in rows.items()]
                     for name, rows in delta.counters.items() if rows},
        "dropped": {r: n for r, n in delta.dropped.items() if n},
        **{name: [[*k, n] for k, n in rows.items() if n] for name, rows in (
            ("input_tokens", delta.input_tokens), ("cached_tokens", delta.cached_tokens),
            ("upstreams", delta.upstreams))},
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




# --- decoding and validation ------------------------------------------------------------------

def decode(body: bytes, schema: Schema, *, max_inflated: int = 64 * 2**20,
           compressed: bool = True) -> Delta:
    """Validate a push body completely and return its delta; PushError names what is wrong.

    Nothing is applied here, so a bad push changes nothing. `schema` supplies the families,
    their label names and layouts, and the label-length limit.
    """
    raw = inflate(body, max_inflated) if compressed else body
    try:
        doc = json.loads(raw)
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
    _rows(doc.get("requests"), "requests", 5, max_len, delta.requests)
    for key in delta.requests:
        if key[1] not in names.OUTCOMES:
            raise PushError(MALFORMED, f"unknown outcome {key[1][:40]!r}")
    _rows(doc.get("in_flight"), "in_flight", 3, max_len, delta.in_flight)
    _rows(doc.get("tenant_folds"), "tenant_folds", 2, max_len, delta.tenant_folds)
    for name, n_labels, into in (("input_tokens", 4, delta.input_tokens),
                                 ("cached_tokens", 4, delta.cached_tokens),
                                 ("upstreams", 5, delta.upstreams)):
        _rows(doc.get(name, []), name, n_labels, max_len, into)
    _counts(doc.get("dropped"), "dropped", names.DROP_REASONS, delta.dropped)
    # (absent from the pushes of releases that did not cap model, route and provider)
    _counts(doc.get("label_folds", {}), "label_folds", names.LABEL_FOLDS, delta.label_folds)
    _counters(doc.get("counters", {}), max_len, delta.counters)
    delta.lost_batches = _count(doc.get("lost_batches"), "lost_batches")
    delta.push_failures = _count(doc.get("push_failures"), "push_failures")
    return delta


def _bounded(doc: dict[str, Any], limit: int) -> None:
    """Refuse, before any work, a push with more series or rows than a family may hold."""
    histograms = doc.get("histograms")
    series = sum(len(flat) // 4 for flat in histograms.values() if flat.__class__ is list) \
        if histograms.__class__ is dict else 0
    counters = doc.get("counters")
    rows = [(name, _size(value)) for name, value in counters.items()] \
        if counters.__class__ is dict else []
    for what, n in (("series", series), ("label sets", _size(doc.get("labels"))),
                    *((key, _size(doc.get(key))) for key in
                      ("requests", "in_flight", "tenant_folds", "input_tokens",
                       "cached_tokens", "upstreams")), *rows):
        if n > limit:
            raise PushError(names.REJECT_TOO_LARGE, f"{n} {what} in one push: more than "
                                                    f"labels.max_series ({limit})")


def _size(value: Any) -> int:
    """Items in a list (what a malformed value holds counts as none: refused later)."""
    return len(value) if value.__class__ is list else 0


def _closed(label_names: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
    """(position, allowed values) of the labels whose values are a closed set."""
    return [(i, names.CLOSED_LABELS[label]) for i, label in enumerate(label_names)
            if label in names.CLOSED_LABELS]


def _check_closed(closed: list[tuple[int, tuple[str, ...]]], values: tuple[str, ...]) -> None:
    for i, allowed in closed:
        if values[i] not in allowed:
            raise PushError(MALFORMED, f"unknown label value {values[i][:40]!r}")


def _counters(value: Any, max_len: int, into: dict[str, dict[tuple[str, ...], int]]) -> None:
    """{counter name: [[label values..., n], ...]} of the known counters."""
    if not isinstance(value, dict):
        raise PushError(MALFORMED, "counters must be an object")
    for name, rows in value.items():
        counter = names.COUNTERS_BY_NAME.get(name)
        if counter is None:
            raise PushError(MALFORMED, f"unknown counter {str(name)[:80]!r}")
        found = into[name] = {}
        _rows(rows, name, len(counter.labels), max_len, found)
        closed = _closed(counter.labels)
        for key in found:
            _check_closed(closed, key)


def _counts(value: Any, what: str, known: tuple[str, ...], into: dict[str, int]) -> None:
    """An object of counts keyed by one of `known`."""
    if not isinstance(value, dict):
        raise PushError(MALFORMED, f"{what} must be an object")
    for key, n in value.items():
        if key not in known:
            raise PushError(MALFORMED, f"{what}: unknown key {str(key)[:40]!r}")
        into[key] = _count(n, f"{what} count")


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
