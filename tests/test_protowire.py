"""The protobuf encoder writes the wire format by hand (expose/protowire.py): its bytes must be
exactly what prometheus/client_model's messages (metrics_pb2, upb) serialize for the same
histogram, SLO counts, window summary and small family (counters, gauges). The reference below builds those messages field by
field with the library; random histograms, exemplars and labels are compared byte for byte."""

from __future__ import annotations

from dataclasses import replace

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings, strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.expose import protowire as wire, textformat
from exporter._internal.expose.native import ZERO_THRESHOLD
from exporter._internal.expose.proto import metrics_pb2 as pb
from exporter._internal.expose.protobuf import Encoder, small_family
from exporter._internal.expose.sample import sample
from exporter._internal.record.exemplar import LABEL as EXEMPLAR_LABEL
from exporter._internal.record.histogram import Histogram
from exporter._internal.record.schema import Schema

CONFIG = Config()
SCHEMA = Schema(CONFIG)
#: An SLO family (seconds, SLO counters) and a token family (no SLO counters).
FAMILIES = [names.TTFT, names.OUTPUT_TOKENS]
ENCODERS = {classic: Encoder(replace(CONFIG, histograms=replace(
    CONFIG.histograms, protobuf_classic_buckets=classic)), SCHEMA.families)
    for classic in (True, False)}


def _stamp(into, unix: float) -> None:
    into.seconds, into.nanos = divmod(round(unix * 1e9), 1_000_000_000)


def reference(fam, labels, now, created, classic: bool, encoder: Encoder
              ) -> tuple[bytes, bytes]:
    """The same series built as upb messages (how protobuf.py built them before protowire.py)."""
    layout = SCHEMA.families[fam.name].layout
    bounds = [fam.to_unit(b) for b in layout.boundaries]
    native = encoder._converters[fam.name].convert(now.hist)
    family = pb.MetricFamily()
    metric = family.metric.add()
    pairs = [pb.LabelPair(name=k, value=v) for k, v in labels]
    metric.label.extend(pairs)
    out = metric.histogram
    out.sample_count, out.sample_sum = now.count, now.total
    if classic:
        for bound, count in zip(bounds, now.cumulative):
            out.bucket.add(upper_bound=bound, cumulative_count=count)
    out.schema, out.zero_threshold, out.zero_count = native.schema, ZERO_THRESHOLD, \
        native.zero_count
    for offset, length in native.spans or [(0, 0)]:
        out.positive_span.add(offset=offset, length=length)
    out.positive_delta.extend(native.deltas)
    for position, (trace_id, value, timestamp) in sorted((now.exemplars or {}).items()):
        message = pb.Exemplar(label=[pb.LabelPair(name=EXEMPLAR_LABEL, value=trace_id)],
                              value=value)
        _stamp(message.timestamp, timestamp)
        if position < len(bounds):
            if classic:
                out.bucket[position].exemplar.CopyFrom(message)
            else:
                out.bucket.add(upper_bound=bounds[position],
                               cumulative_count=now.cumulative[position], exemplar=message)
        out.exemplars.append(message)
    if created is not None:
        _stamp(out.created_timestamp, created)
    if fam.name not in encoder._slo:
        return family.SerializeToString(), b""
    positions, _ = encoder._slo[fam.name]
    thresholds = CONFIG.objective_thresholds(
        next(o for o, f in names.SLO_FAMILIES.items() if f.name == fam.name))
    les = [textformat.number(t) for t in thresholds]
    counters = pb.MetricFamily()
    for le, count in zip(les + ["+Inf"], [now.cumulative[p] for p in positions] + [now.count]):
        counter = counters.metric.add()
        counter.label.extend(pairs)
        counter.label.add(name="le", value=le)
        counter.counter.value = count
        if created is not None:
            _stamp(counter.counter.created_timestamp, created)
    return family.SerializeToString(), counters.SerializeToString()


label_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
labels_strategy = st.lists(st.tuples(st.sampled_from(["model", "route", "tenant", "a_b"]),
                                     label_text), max_size=4)
#: Values in the family's recorded integer unit (µs or tokens): zeros, small, large.
values_strategy = st.lists(st.one_of(st.just(0), st.integers(1, 2_000),
                                     st.integers(1, 3_000_000_000)), max_size=60)
exemplar_strategy = st.tuples(label_text, st.floats(allow_nan=False, width=64),
                              st.floats(0, 4e9, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(FAMILIES), classic=st.booleans(), labels=labels_strategy,
       values=values_strategy,
       exemplars=st.dictionaries(st.integers(0, 40), exemplar_strategy, max_size=4),
       created=st.one_of(st.none(), st.floats(0, 4e9)), repeat=st.sampled_from([1, 1, 300]))
def test_histogram_bytes_equal_the_upb_messages(family, classic, labels, values, exemplars,
                                                created, repeat) -> None:
    """(`repeat`: each value that many times, for counts past the encoder's small tables)"""
    layout = SCHEMA.families[family.name].layout
    hist = Histogram(layout)
    hist.record_many([min(v, layout.highest) for v in values] * repeat)
    positions = len(layout.boundaries) + 1
    now = sample(family, hist, {p % positions: e for p, e in exemplars.items()} or None)
    encoder = ENCODERS[classic]
    ours, our_counters = encoder.histogram(family, labels, now, created)
    theirs, their_counters = reference(family, labels, now, created, classic, encoder)
    assert ours == theirs
    assert our_counters == their_counters
    assert pb.MetricFamily.FromString(ours).metric[0].histogram.sample_count == \
        len(values) * repeat


@settings(max_examples=100, deadline=None)
@given(labels=labels_strategy, count=st.integers(0, 2**40),
       total=st.floats(allow_nan=False, width=64),
       values=st.one_of(st.none(), st.lists(st.floats(allow_nan=False), min_size=4,
                                            max_size=4)))
def test_window_bytes_equal_the_upb_messages(labels, count, total, values) -> None:
    quantiles = CONFIG.window.quantiles
    family = pb.MetricFamily()
    metric = family.metric.add()
    metric.label.extend(pb.LabelPair(name=k, value=v) for k, v in labels)
    metric.summary.sample_count, metric.summary.sample_sum = count, total
    for q, v in zip(quantiles, values or ()):
        metric.summary.quantile.add(quantile=q, value=v)
    assert ENCODERS[True].window(labels, quantiles, values, count, total) == \
        family.SerializeToString()


@given(st.integers(-2**63, 2**64 - 1))
def test_varint_and_zigzag_match_the_library(n: int) -> None:
    """uint64 and int64 (negatives on ten bytes) as varints, sint64 zigzag-mapped."""
    if n >= 0:
        assert pb.Histogram(sample_count=n).SerializeToString() == b"\x08" + wire.varint(n)
    if n < 2**63:
        assert pb.Histogram(positive_delta=[n]).SerializeToString() == b"\x68" + wire.zigzag(n)
        if n:
            assert Timestamp(seconds=n).SerializeToString() == b"\x08" + wire.varint(n)


_TYPES = {"counter": pb.COUNTER, "gauge": pb.GAUGE}


def reference_small_family(family: Metric) -> bytes:
    """A small family built as upb messages (how protobuf.py built them before)."""
    kind = family.type
    name = family.name + "_total" if kind == "counter" else family.name
    out = pb.MetricFamily(name=name, help=family.documentation,
                          type=_TYPES.get(kind, pb.UNTYPED))
    metric = None
    for s in family.samples:
        if s.name != name:
            if metric is not None and kind == "counter":
                _stamp(metric.counter.created_timestamp, s.value)
            continue
        metric = out.metric.add(label=[pb.LabelPair(name=k, value=v)
                                       for k, v in sorted(s.labels.items())])
        if kind == "counter":
            metric.counter.value = s.value
        elif kind == "gauge":
            metric.gauge.value = s.value
        else:
            metric.untyped.value = s.value
    data = out.SerializeToString()
    return wire.varint(len(data)) + data


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["counter", "gauge", "unknown"]),
       label_names=st.lists(st.sampled_from(["reason", "model", "a_b", "tenant"]), unique=True,
                            max_size=3),
       rows=st.lists(st.tuples(st.lists(label_text, min_size=3, max_size=3),
                               st.one_of(st.integers(0, 2**60),
                                         st.floats(allow_nan=False, width=64)),
                               st.one_of(st.none(), st.floats(0, 4e9))), max_size=6))
def test_small_family_bytes_equal_the_upb_messages(kind, label_names, rows) -> None:
    """Counters with and without `_created` samples (created.py adds them after the value),
    gauges, and another type (served untyped), as the renderer serves the self-metrics."""
    if kind == "counter":
        family: Metric = CounterMetricFamily("x", "help \\ \"text\"\n", labels=label_names)
    elif kind == "gauge":
        family = GaugeMetricFamily("x", "help", labels=label_names)
    else:
        family = Metric("x", "help", "unknown")
    seen = set()
    for values, value, created in rows:
        values = values[:len(label_names)]
        if tuple(values) in seen:
            continue
        seen.add(tuple(values))
        labels = dict(zip(label_names, values))
        if kind == "unknown":
            family.add_sample("x", labels, value)
        else:
            family.add_metric(values, value)
        if created is not None and kind == "counter":
            family.samples.append(family.samples[-1]._replace(name="x_created", value=created))
    assert small_family(family) == reference_small_family(family)
