"""The protobuf exposition: delimited `io.prometheus.client.MetricFamily` messages.

Prometheus asks for it first when native histograms are on. Every family of the text format is
served; each histogram carries its classic buckets (exact `le` counts, exemplars) and its
native buckets (native.py). Prometheus 2.42 with native histograms stores only the native
histogram of such a message, one series (no `_bucket`, `_count` or `_sum`), so the exact counts
at the SLO thresholds are served besides as counters (`names.slo_calls_name`, label `le`, with
`le="+Inf"` counting every call): the native-mode SLO rules divide those, exactly as the
classic rules divide `_bucket{le=...}` by `_count`.

Messages are built with the `protobuf` package from prometheus/client_model's definitions
(proto/metrics_pb2.py). One series is serialized as a one-metric MetricFamily, which is exactly
the bytes of one element of the family's repeated `metric` field, so the renderer caches each
series' bytes and a family is its header's bytes followed by its series' (protobuf merges
concatenated messages, appending repeated fields). Each family is prefixed with its length as
a varint: the `encoding=delimited` framing.
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client.core import Metric

from .. import names
from ..config.settings import Config
from ..record.exemplar import LABEL as EXEMPLAR_LABEL, Exemplar
from ..record.schema import FamilySchema
from . import textformat
from .native import ZERO_THRESHOLD, Converter
from google.protobuf.timestamp_pb2 import Timestamp

from .proto import metrics_pb2 as pb
from .sample import Sample

_TYPES = {"counter": pb.COUNTER, "gauge": pb.GAUGE, "summary": pb.SUMMARY,
          "histogram": pb.HISTOGRAM, "unknown": pb.UNTYPED}
#: The no-op span: marks a native histogram without observations for parsers that look for it.
_NO_OP_SPAN = [pb.BucketSpan(offset=0, length=0)]


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of n >= 0: the length prefix of a delimited message."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def delimited(header: bytes, metrics: Sequence[bytes]) -> bytes:
    """One family as the delimited format frames it: its length, then the message."""
    size = len(header) + sum(map(len, metrics))
    return b"".join((varint(size), header, *metrics))


def header(name: str, help_text: str, kind: str) -> bytes:
    """A MetricFamily without metrics: name, help and type (`counter`, `histogram`...)."""
    return pb.MetricFamily(name=name, help=help_text, type=_TYPES[kind]).SerializeToString()


def _labels(pairs: Sequence[tuple[str, str]]) -> list[pb.LabelPair]:
    return [pb.LabelPair(name=k, value=v) for k, v in pairs]


def _stamp(into: Timestamp, unix: float) -> None:
    into.seconds, into.nanos = divmod(round(unix * 1e9), 1_000_000_000)


def _exemplar(exemplar: Exemplar) -> pb.Exemplar:
    trace_id, value, timestamp = exemplar
    out = pb.Exemplar(label=[pb.LabelPair(name=EXEMPLAR_LABEL, value=trace_id)], value=value)
    _stamp(out.timestamp, timestamp)
    return out


class Encoder:
    """Serializes one config's series: histograms with native buckets, SLO counts, windows.

    Built for speed with the library: a template Histogram per family holds the classic
    buckets' upper bounds (copied, then the counts set), and label pairs are built once per
    series.
    """

    def __init__(self, config: Config, families: dict[str, FamilySchema]):
        hist = config.histograms
        self._converters: dict[str, Converter] = {}
        self._templates: dict[str, pb.Histogram] = {}
        #: family -> (positions in the layout's boundaries, `le` label pairs) of its SLO counts
        self._slo: dict[str, tuple[list[int], list[pb.LabelPair]]] = {}
        self._labels: dict[tuple[tuple[str, str], ...], list[pb.LabelPair]] = {}
        self._classic = hist.protobuf_classic_buckets
        self._bounds: dict[str, list[float]] = {}
        by_layout: dict[int, Converter] = {}
        for name, spec in families.items():
            fam, layout = spec.family, spec.layout
            converter = by_layout.get(id(layout))
            if converter is None:
                converter = by_layout[id(layout)] = Converter(
                    layout, fam.scale, hist.native_schema, hist.native_max_buckets)
            self._converters[name] = converter
            self._bounds[name] = [fam.to_unit(b) for b in layout.boundaries]
            self._templates[name] = pb.Histogram(zero_threshold=ZERO_THRESHOLD, bucket=[
                pb.Bucket(upper_bound=b) for b in self._bounds[name]] if self._classic else [])
        for objective, fam in names.SLO_FAMILIES.items():
            layout = families[fam.name].layout
            thresholds = config.objective_thresholds(objective)
            positions = [layout.boundaries.index(fam.from_unit(t)) for t in thresholds]
            les = [textformat.number(t) for t in thresholds] + ["+Inf"]
            self._slo[fam.name] = (positions, [pb.LabelPair(name="le", value=le) for le in les])

    def slo_families(self) -> list[tuple[str, names.Family]]:
        """(SLO counter name, family) of every family served with SLO counts."""
        return [(names.slo_calls_name(names.HISTOGRAMS_BY_NAME[name]),
                 names.HISTOGRAMS_BY_NAME[name]) for name in self._slo]

    def _label_pairs(self, labels: Sequence[tuple[str, str]]) -> list[pb.LabelPair]:
        key = tuple(labels)
        found = self._labels.get(key)
        if found is None:
            found = self._labels[key] = [pb.LabelPair(name=k, value=v) for k, v in key]
        return found

    def histogram(self, fam: names.Family, labels: Sequence[tuple[str, str]], now: Sample,
                  created: float | None = None) -> tuple[bytes, bytes]:
        """The series' histogram metric, and its SLO counts metrics (b"" for other families),
        with `created` as their created timestamp (created.py) when known."""
        name = fam.name
        native = self._converters[name].convert(now.hist)
        cumulative = now.cumulative
        label_pairs = self._label_pairs(labels)
        family = pb.MetricFamily()
        metric = family.metric.add()
        metric.label.extend(label_pairs)
        out = metric.histogram
        out.CopyFrom(self._templates[name])
        out.sample_count, out.sample_sum = now.count, now.total
        out.schema, out.zero_count = native.schema, native.zero_count
        # (no buckets without classic ones; +Inf is implied: zip stops at the last boundary)
        for bucket, count in zip(out.bucket, cumulative):
            bucket.cumulative_count = count
        if native.spans:
            add_span = out.positive_span.add
            for offset, length in native.spans:
                add_span(offset=offset, length=length)
            out.positive_delta.extend(native.deltas)
        else:
            out.positive_span.extend(_NO_OP_SPAN)
        if now.exemplars:
            self._exemplars(out, name, cumulative, now.exemplars)
        if created is not None:
            _stamp(out.created_timestamp, created)
        slo = self._slo.get(name)
        if slo is None:
            return family.SerializeToString(), b""
        positions, les = slo
        counts = [cumulative[p] for p in positions] + [now.count]
        counters = pb.MetricFamily()
        for le, count in zip(les, counts):
            counter = counters.metric.add()
            counter.label.extend(label_pairs)
            counter.label.append(le)
            counter.counter.value = count
            if created is not None:
                _stamp(counter.counter.created_timestamp, created)
        return family.SerializeToString(), counters.SerializeToString()

    def _exemplars(self, out: pb.Histogram, name: str, cumulative: list[int],
                   exemplars: dict[int, Exemplar]) -> None:
        """Each exemplar on its classic bucket (where 2.42 reads them; without classic buckets,
        on a bucket sent for it alone) and in the native histogram's own list."""
        bounds = self._bounds[name]
        for position, exemplar in sorted(exemplars.items()):
            message = _exemplar(exemplar)
            if position < len(bounds):  # (the +Inf bucket is implied, not sent)
                if self._classic:
                    out.bucket[position].exemplar.CopyFrom(message)
                else:
                    out.bucket.add(upper_bound=bounds[position],
                                   cumulative_count=cumulative[position], exemplar=message)
            out.exemplars.append(message)  # for parsers reading native exemplars

    def window(self, labels: Sequence[tuple[str, str]], quantiles: Sequence[float],
               values: Sequence[float] | None, count: int, total: float) -> bytes:
        """A window-quantile summary metric (no quantiles while the window is empty)."""
        family = pb.MetricFamily()
        metric = family.metric.add()
        metric.label.extend(self._label_pairs(labels))
        summary = metric.summary
        summary.sample_count, summary.sample_sum = count, total
        add = summary.quantile.add
        for q, v in zip(quantiles, values or ()):
            add(quantile=q, value=v)
        return family.SerializeToString()


def small_family(family: Metric) -> bytes:
    """A prometheus_client family (counters, gauges: the self-metrics), delimited; a counter's
    `_created` sample (after its value's) is its created timestamp."""
    kind = family.type
    name = family.name + "_total" if kind == "counter" else family.name
    out = pb.MetricFamily(name=name, help=family.documentation,
                          type=_TYPES.get(kind, pb.UNTYPED))
    metric = None
    for sample in family.samples:
        if sample.name != name:
            if metric is not None and kind == "counter":
                _stamp(metric.counter.created_timestamp, sample.value)
            continue
        metric = out.metric.add(label=_labels(sorted(sample.labels.items())))
        if kind == "counter":
            metric.counter.value = sample.value
        elif kind == "gauge":
            metric.gauge.value = sample.value
        else:
            metric.untyped.value = sample.value
    data = out.SerializeToString()
    return varint(len(data)) + data

