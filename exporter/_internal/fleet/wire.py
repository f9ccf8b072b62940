"""The push wire format: what a worker sends `ttft-exporter serve` (validate.py checks it).

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
     "dropped": {reason: n}, "lost_batches": n, "push_failures": n, "retry": true}

The counter rows are those of names.COUNTERS: a counter of the format's first release travels
under its own key (`Counter.wire`: a list of rows, or for a one-label counter with closed values
an object keyed by that value), every later one in `counters`. Each row is sent, zeros
included, but a gauge's (`in_flight`: a worker with nothing in flight sends no row).

Each series is four items of its family's flat list: a reference into `labels` (label tuples
are shared by the families), its counts, count and sum; `series` in the side tables is its
position in that list. The layout keeps JSON parsing cheap: few objects per series.

`counts` is the base64 of the counts payload of HdrHistogram's standard V2 encoding
(codec.py). The V2 header, the same for every histogram of a unit, is not repeated:
`layouts` states it once (`highest` trackable value and significant `digits`; lowest
discernible value 1, no offset, ratio 1). `count` (the number of values, which the counts must
add up to: a truncated payload fails) and what the HDR format cannot carry travel beside it:
the exact `sum` of the values, and for each `le` boundary that falls inside an HDR bucket
(`pos` into the boundaries) the number `n` of that bucket's values at or under the boundary
(`straddles`). `exemplars` are the latest traced call per `le` bucket (position into the
boundaries, len(boundaries) for +Inf), which the aggregator serves in OpenMetrics.

`retry` (absent when false) marks every resend of a batch one of whose attempts reached a
connection without a definite answer (a timeout, a reset, a proxy's 5xx): the aggregator may
have applied it. An aggregator that no longer knows the worker (its entry was evicted,
`aggregator.max_workers`) cannot tell, and refuses it (409, `evicted`) rather than count it
twice. A push without it is the batch's first attempt, sent only once every earlier batch of
the worker was acknowledged or given up: it settles every lower `seq`. The body is ASCII (every
other character escaped, as `json.dumps` does by default).

Every counter key may be absent (no rows: `input_tokens`, `cached_tokens`, `upstreams`,
`label_folds` and `counters` came after the first release of version 1), and so may the `count`
layout; a layout is required only for the units the push's families use. validate.py checks
every field before anything is applied, so a bad push changes nothing; `PushError.reason`
names the aggregator's reject counter.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Union

from .. import names
from ..record import exemplar
from ..record.exemplar import Exemplar
from ..record.histogram import Histogram
from .codec import Sparse, encode_counts

FORMAT = "ttft-exporter-delta"
VERSION = 1
CONTENT_TYPE = "application/x-ttft-delta"
PUSH_PATH = "/push"


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
    #: names.COUNTERS by name -> label values (the counter's label order) -> count (for a
    #: gauge, the worker's current value: the latest wins)
    rows: dict[str, dict[tuple[str, ...], int]] = field(default_factory=dict)
    lost_batches: int = 0
    push_failures: int = 0
    #: A resend of a batch the aggregator may have applied (an attempt went unanswered).
    retry: bool = False

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
        for counter in names.COUNTERS:
            theirs = later.rows.get(counter.name)
            if counter.gauge:
                self.rows[counter.name] = dict(theirs or {})
                continue
            if theirs:
                mine = self.rows.setdefault(counter.name, {})
                for row, n in theirs.items():
                    mine[row] = mine.get(row, 0) + n
        self.interval = later.interval
        self.final = later.final
        self.lost_batches += later.lost_batches
        self.push_failures += later.push_failures

    def calls(self) -> int:
        return sum(self.rows.get(names.REQUESTS_TOTAL, {}).values())


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
    doc = {
        "format": FORMAT, "version": VERSION, "worker": delta.worker, "seq": delta.seq,
        "interval": delta.interval, "final": delta.final, "layouts": layouts,
        "labels": [list(values) for values in table],
        "histograms": histograms, "straddles": straddles, "exemplars": exemplars,
        "lost_batches": delta.lost_batches, "push_failures": delta.push_failures,
    }
    later: dict[str, list[list[Any]]] = {}
    for counter in names.COUNTERS:
        rows = delta.rows.get(counter.name) or {}
        if counter.gauge:
            rows = {k: n for k, n in rows.items() if n}
        if as_object(counter):
            doc[counter.wire] = {k[0]: n for k, n in rows.items()}
        elif counter.wire:
            doc[counter.wire] = [[*k, n] for k, n in rows.items()]
        elif rows:
            later[counter.name] = [[*k, n] for k, n in rows.items()]
    doc["counters"] = later
    if delta.retry:
        doc["retry"] = True
    return doc


def as_object(counter: names.Counter) -> bool:
    """A counter of the first release with one closed label travels as {value: n}."""
    return bool(counter.wire and counter.zero_rows)


def encode(delta: Delta, layouts: dict[str, list[Any]], level: int = 6) -> bytes:
    """The compressed body of a push."""
    text = json.dumps(payload(delta, layouts), separators=(",", ":"))
    return zlib.compress(text.encode("utf-8"), level)
