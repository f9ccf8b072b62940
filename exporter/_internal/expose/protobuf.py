"""The protobuf exposition: delimited `io.prometheus.client.MetricFamily` messages.

Prometheus asks for it first when native histograms are on. Every family of the text format is
served; each histogram carries its classic buckets (exact `le` counts, exemplars) and its
native buckets (native.py). Prometheus 2.42 with native histograms stores only the native
histogram of such a message, one series (no `_bucket`, `_count` or `_sum`), so the exact counts
at the SLO thresholds are served besides as counters (`names.slo_calls_name`, label `le`, with
`le="+Inf"` counting every call): the native-mode SLO rules divide those, exactly as the
classic rules divide `_bucket{le=...}` by `_count`.

Family headers and the self-metrics are built with the `protobuf` package from
prometheus/client_model's definitions (proto/metrics_pb2.py); the series, thousands per scrape,
are written directly in the same wire format (protowire.py), byte for byte what those messages
serialize. One series is serialized as a one-metric MetricFamily, which is exactly
the bytes of one element of the family's repeated `metric` field, so the renderer caches each
series' bytes and a family is its header's bytes followed by its series' (protobuf merges
concatenated messages, appending repeated fields). Each family is prefixed with its length as
a varint: the `encoding=delimited` framing.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from prometheus_client.core import Metric

from .. import names
from ..config.settings import Config
from ..record.exemplar import LABEL as EXEMPLAR_LABEL, Exemplar
from ..record.schema import FamilySchema
from . import protowire as wire, textformat
from .native import Converter
from .native_fields import NativeFields

from .proto import metrics_pb2 as pb
from .sample import Sample
from .protowire import varint

_TYPES = {"counter": pb.COUNTER, "gauge": pb.GAUGE, "summary": pb.SUMMARY,
          "histogram": pb.HISTOGRAM, "unknown": pb.UNTYPED}


def _bucket_count(count: int) -> bytes:
    """A classic bucket's key and length, and its `cumulative_count` field: the upper bound
    field (nine bytes) follows."""
    count_bytes = varint(count)
    return b"\x1a" + bytes([len(count_bytes) + 10]) + b"\x08" + count_bytes


#: The pieces of the small counts most are, looked up rather than built.
_BUCKET_COUNTS = [_bucket_count(n) for n in range(len(wire.SMALL))]


def delimited(header: bytes, metrics: Sequence[bytes]) -> bytes:
    """One family as the delimited format frames it: its length, then the message."""
    size = len(header) + sum(map(len, metrics))
    return b"".join((varint(size), header, *metrics))


def header(name: str, help_text: str, kind: str) -> bytes:
    """A MetricFamily without metrics: name, help and type (`counter`, `histogram`...)."""
    return pb.MetricFamily(name=name, help=help_text, type=_TYPES[kind]).SerializeToString()


class Encoder:
    """Serializes one config's series: histograms with native buckets, SLO counts, windows.

    Each message is written directly in the wire format (protowire.py) from pieces computed once
    per family: every classic bucket's upper bound, the SLO counters' `le` pairs; and once per
    series: its label pairs.
    """

    def __init__(self, config: Config, families: dict[str, FamilySchema]):
        hist = config.histograms
        self._converters: dict[str, Converter] = {}
        #: family -> each classic bucket's `upper_bound` field (the count goes before it)
        self._bounds: dict[str, list[bytes]] = {}
        #: family -> (positions in the layout's boundaries, `le` label pair fields) of its SLO
        #: counts
        self._slo: dict[str, tuple[list[int], list[bytes]]] = {}
        self._labels: dict[tuple[tuple[str, str], ...], bytes] = {}
        self._classic = hist.protobuf_classic_buckets
        self._last_created: tuple[float | None, bytes] = (None, b"")
        by_layout: dict[int, Converter] = {}
        for name, spec in families.items():
            fam, layout = spec.family, spec.layout
            converter = by_layout.get(id(layout))
            if converter is None:
                converter = by_layout[id(layout)] = Converter(
                    layout, fam.scale, hist.native_schema, hist.native_max_buckets)
            self._converters[name] = converter
            self._bounds[name] = [b"\x11" + wire.double(fam.to_unit(b))
                                  for b in layout.boundaries]
        for objective, fam in names.SLO_FAMILIES.items():
            layout = families[fam.name].layout
            thresholds = config.objective_thresholds(objective)
            positions = [layout.boundaries.index(fam.from_unit(t)) for t in thresholds]
            les = [textformat.number(t) for t in thresholds] + ["+Inf"]
            self._slo[fam.name] = (positions, [wire.field(b"\x0a", wire.label_pair("le", le))
                                               for le in les])

    def slo_families(self) -> list[tuple[str, names.Family]]:
        """(SLO counter name, family) of every family served with SLO counts."""
        return [(names.slo_calls_name(names.HISTOGRAMS_BY_NAME[name]),
                 names.HISTOGRAMS_BY_NAME[name]) for name in self._slo]

    def _label_fields(self, labels: Sequence[tuple[str, str]]) -> bytes:
        """A Metric's `label` fields for these pairs (built once per series)."""
        key = tuple(labels)
        found = self._labels.get(key)
        if found is None:
            found = self._labels[key] = b"".join(
                wire.field(b"\x0a", wire.label_pair(k, v)) for k, v in key)
        return found

    def _stamp(self, created: float) -> bytes:
        """A created timestamp's body; series created at one scrape share it, so the last one
        is kept."""
        if created != self._last_created[0]:
            self._last_created = (created, wire.timestamp(created))
        return self._last_created[1]

    def histogram(self, fam: names.Family, labels: Sequence[tuple[str, str]], now: Sample,
                  created: float | None = None, native: NativeFields | None = None
                  ) -> tuple[bytes, bytes]:
        """The series' histogram metric, and its SLO counts metrics (b"" for other families),
        each as a one-metric MetricFamily, with `created` as their created timestamp
        (created.py) when known; `native`: the series' native fields as the previous render
        encoded them (kept up to date here)."""
        name = fam.name
        varint = wire.varint
        cumulative = now.cumulative
        exemplars = now.exemplars
        marked = {p: _exemplar(e) for p, e in sorted(exemplars.items())} if exemplars else {}
        out = [b"\x08", varint(now.count), b"\x11", wire.double(now.total)]
        # Bucket: cumulative_count (1), upper_bound (2), exemplar (3); +Inf is implied
        bounds = self._bounds[name]
        if self._classic and not marked:  # (the counts' pieces looked up in C where small,
            # interleaved with the bounds by slice assignment: no tuple per bucket)
            n = len(bounds)
            buckets = [b""] * (2 * n)
            buckets[::2] = map(_BUCKET_COUNTS.__getitem__ if now.count < len(_BUCKET_COUNTS)
                               else _bucket_count, cumulative[:n])
            buckets[1::2] = bounds
            out += buckets
        else:  # without classic buckets, a bucket is sent for an exemplar alone
            for position, bound in enumerate(bounds):
                exemplar = marked.get(position)
                if self._classic or exemplar is not None:
                    bucket = b"\x08" + varint(cumulative[position]) + bound
                    if exemplar is not None:
                        bucket += wire.field(b"\x1a", exemplar)
                    out += (b"\x1a", varint(len(bucket)), bucket)
        out.append((native or NativeFields()).encode(self._converters[name], now.hist,
                                                     now.native))
        stamp = None if created is None else self._stamp(created)
        if stamp is not None:
            out.append(wire.field(b"\x7a", stamp))  # created_timestamp (15)
        for exemplar in marked.values():  # also in the native histogram's own list
            out += (b"\x82\x01", varint(len(exemplar)), exemplar)
        label_fields = self._label_fields(labels)
        histogram = b"".join(out)
        metric = label_fields + b"\x3a" + varint(len(histogram)) + histogram
        family = b"\x22" + varint(len(metric)) + metric
        slo = self._slo.get(name)
        if slo is None:
            return family, b""
        positions, les = slo
        counts = [cumulative[p] for p in positions] + [now.count]
        # Counter: value (1), created_timestamp (3)
        created_field = b"" if stamp is None else wire.field(b"\x1a", stamp)
        counter_key = b"\x1a" + varint(9 + len(created_field)) + b"\x09"
        size = len(label_fields) + len(counter_key) + 8 + len(created_field)  # but the `le`
        counters: list[bytes] = []
        for le, count in zip(les, counts):  # (one join for all: no concatenation per piece)
            counters += (b"\x22", varint(size + len(le)), label_fields, le, counter_key,
                         wire.double(count), created_field)
        return family, b"".join(counters)

    def window(self, labels: Sequence[tuple[str, str]], quantiles: Sequence[float],
               values: Sequence[float] | None, count: int, total: float) -> bytes:
        """A window-quantile summary metric (no quantiles while the window is empty)."""
        double = wire.double
        summary = b"".join([b"\x08", wire.varint(count), b"\x11", double(total)] + [
            b"\x1a\x12\x09" + double(q) + b"\x11" + double(v)
            for q, v in zip(quantiles, values or ())])
        return wire.field(b"\x22", self._label_fields(labels) + wire.field(b"\x22", summary))


def _exemplar(exemplar: Exemplar) -> bytes:
    """An Exemplar's body: its trace-id label pair, value and timestamp."""
    trace_id, value, timestamp = exemplar
    return (wire.field(b"\x0a", wire.label_pair(EXEMPLAR_LABEL, trace_id)) + b"\x11" +
            wire.double(value) + wire.field(b"\x1a", wire.timestamp(timestamp)))


@lru_cache(maxsize=1 << 16)
def _row_labels(pairs: tuple[tuple[str, str], ...]) -> bytes:
    """A Metric's `label` fields for a counter row's label pairs, sorted by name (the text
    format's order); rows are many (a request counter has one per series) and the same at
    every scrape: the recent ones are kept."""
    return b"".join(wire.field(b"\x0a", wire.label_pair(k, v)) for k, v in sorted(pairs))


#: The Metric field holding a family's value: counter (3), gauge (2), else untyped (5).
_VALUE_FIELDS = {"counter": b"\x1a", "gauge": b"\x12"}


def small_family(family: Metric) -> bytes:
    """A prometheus_client family (counters, gauges: the self-metrics), delimited; a counter's
    `_created` sample (after its value's) is its created timestamp. Written in the wire format
    directly, as the series are: byte for byte what the client_model messages serialize
    (tests/test_protowire.py), at a fraction of building one message object per row."""
    kind = family.type
    counter = kind == "counter"
    name = family.name + "_total" if counter else family.name
    value_field = _VALUE_FIELDS.get(kind, b"\x2a")
    double = wire.double
    rows: list[list[bytes]] = []  # per row: its label fields, value (1), created (3)
    stamped: tuple[float | None, bytes] = (None, b"")  # (rows created at one read share it)
    for sample in family.samples:
        if sample.name != name:
            if rows and counter:
                if sample.value != stamped[0]:
                    stamp = wire.timestamp(sample.value)
                    stamped = (sample.value, b"\x1a" + varint(len(stamp)) + stamp)
                rows[-1][3:] = (stamped[1],)
            continue
        rows.append([_row_labels(tuple(sample.labels.items())), b"\x09", double(sample.value)])
    metrics = [header(name, family.documentation, kind if kind in _TYPES else "unknown")]
    for row in rows:
        value = b"".join(row[1:])
        metric = b"".join((row[0], value_field, varint(len(value)), value))
        metrics += (b"\x22", varint(len(metric)), metric)
    data = b"".join(metrics)
    return varint(len(data)) + data
