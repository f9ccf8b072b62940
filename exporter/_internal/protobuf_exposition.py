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

from . import names, textformat
from .config import Config
from .exemplar import LABEL as EXEMPLAR_LABEL, Exemplar
from .histogram import Histogram
from .native import ZERO_THRESHOLD, Converter
from .proto import metrics_pb2 as pb
from .schema import FamilySchema

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


def _exemplar(exemplar: Exemplar) -> pb.Exemplar:
    trace_id, value, timestamp = exemplar
    nanos = round(timestamp * 1e9)
    out = pb.Exemplar(label=[pb.LabelPair(name=EXEMPLAR_LABEL, value=trace_id)], value=value)
    out.timestamp.seconds, out.timestamp.nanos = divmod(nanos, 1_000_000_000)
    return out


class Encoder:
    """Serializes one config's series: histograms with native buckets, SLO counts, windows."""

    def __init__(self, config: Config, families: dict[str, FamilySchema]):
        hist = config.histograms
        self._converters: dict[str, Converter] = {}
        self._bounds: dict[str, list[float]] = {}
        #: family -> (positions in the layout's boundaries, `le` label values) of its SLO counts
        self._slo: dict[str, tuple[list[int], list[str]]] = {}
        by_layout: dict[int, Converter] = {}
        for name, spec in families.items():
            fam, layout = spec.family, spec.layout
            converter = by_layout.get(id(layout))
            if converter is None:
                converter = by_layout[id(layout)] = Converter(
                    layout, fam.scale, hist.native_schema, hist.native_max_buckets)
            self._converters[name] = converter
            self._bounds[name] = [fam.to_unit(b) for b in layout.boundaries]
        for objective, fam in names.SLO_FAMILIES.items():
            layout = families[fam.name].layout
            thresholds = config.objective_thresholds(objective)
            positions = [layout.boundaries.index(fam.from_unit(t)) for t in thresholds]
            les = [textformat.number(t) for t in thresholds] + ["+Inf"]
            self._slo[fam.name] = (positions, les)

    def slo_families(self) -> list[tuple[str, names.Family]]:
        """(SLO counter name, family) of every family served with SLO counts."""
        return [(names.slo_calls_name(names.HISTOGRAMS_BY_NAME[name]),
                 names.HISTOGRAMS_BY_NAME[name]) for name in self._slo]

    def histogram(self, fam: names.Family, labels: Sequence[tuple[str, str]], hist: Histogram,
                  exemplars: dict[int, Exemplar] | None) -> tuple[bytes, bytes]:
        """The series' histogram metric, and its SLO counts metrics (b"" for other families)."""
        name = fam.name
        native = self._converters[name].convert(hist)
        cumulative = hist.cumulative_at()
        out = pb.Histogram(sample_count=hist.count, sample_sum=fam.to_unit(hist.total),
                           schema=native.schema, zero_threshold=ZERO_THRESHOLD,
                           zero_count=native.zero_count, positive_delta=native.deltas)
        if native.spans:
            add_span = out.positive_span.add
            for offset, length in native.spans:
                add_span(offset=offset, length=length)
        else:
            out.positive_span.extend(_NO_OP_SPAN)
        add_bucket = out.bucket.add
        for upper, count in zip(self._bounds[name], cumulative):
            add_bucket(upper_bound=upper, cumulative_count=count)
        if exemplars:
            buckets = out.bucket
            for position, exemplar in sorted(exemplars.items()):
                message = _exemplar(exemplar)
                if position < len(buckets):  # (the +Inf bucket is implied, not sent)
                    buckets[position].exemplar.CopyFrom(message)
                out.exemplars.append(message)  # for parsers reading native exemplars
        label_pairs = _labels(labels)
        metric = pb.MetricFamily(metric=[pb.Metric(label=label_pairs, histogram=out)])
        slo = self._slo.get(name)
        if slo is None:
            return metric.SerializeToString(), b""
        positions, les = slo
        counts = [cumulative[p] for p in positions] + [hist.count]
        slo_metrics = pb.MetricFamily(metric=[
            pb.Metric(label=[*label_pairs, pb.LabelPair(name="le", value=le)],
                      counter=pb.Counter(value=c)) for le, c in zip(les, counts)])
        return metric.SerializeToString(), slo_metrics.SerializeToString()

    @staticmethod
    def window(labels: Sequence[tuple[str, str]], quantiles: Sequence[float],
               values: Sequence[float] | None, count: int, total: float) -> bytes:
        """A window-quantile summary metric (no quantiles while the window is empty)."""
        summary = pb.Summary(sample_count=count, sample_sum=total, quantile=[
            pb.Quantile(quantile=q, value=v) for q, v in zip(quantiles, values or ())])
        return pb.MetricFamily(metric=[pb.Metric(label=_labels(labels), summary=summary)]
                               ).SerializeToString()


def small_family(family: Metric) -> bytes:
    """A prometheus_client family (counters, gauges: the self-metrics), delimited."""
    kind = family.type
    name = family.name + "_total" if kind == "counter" else family.name
    out = pb.MetricFamily(name=name, help=family.documentation,
                          type=_TYPES.get(kind, pb.UNTYPED))
    for sample in family.samples:
        if sample.name != name:  # (a counter's `_created` sample)
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

