"""The protobuf exposition: every family of the text format, native buckets, exact SLO counts,
negotiation that never fails a scrape, and one cache shared with the text format."""

from __future__ import annotations

import gzip
import urllib.request

import pytest
from google.protobuf.internal.decoder import _DecodeVarint32
from prometheus_client.parser import text_string_to_metric_families

import exporter
from bench.accuracy import native_buckets
from exporter._internal import names, runtime
from exporter._internal.config.loader import load
from exporter._internal.config.settings import ConfigError
from exporter._internal.expose import protobuf, textformat
from exporter._internal.expose.proto import metrics_pb2 as pb
from exporter._internal.expose.server import OPENMETRICS, PROTOBUF, TEXT, negotiate
from exporter._internal.expose.textformat import PROTOBUF_CONTENT_TYPE, TEXT_CONTENT_TYPE
from tests.test_exposition import record

#: What Prometheus 2.42 sends with --enable-feature=native-histograms (captured from it).
NATIVE_ACCEPT = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                 "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
                 "application/openmetrics-text;version=0.0.1;q=0.75,"
                 "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def decode(body: bytes) -> dict[str, pb.MetricFamily]:
    """Delimited MetricFamily messages by name (the framing checked on the way)."""
    out, pos = {}, 0
    while pos < len(body):
        size, pos = _DecodeVarint32(body, pos)
        family = pb.MetricFamily.FromString(body[pos:pos + size])
        pos += size
        assert family.name not in out
        out[family.name] = family
    assert pos == len(body)
    return out


def key(labels) -> tuple:
    return tuple(sorted((p.name, p.value) if hasattr(p, "name") else p for p in labels))


def text_samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, key(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def populate() -> None:
    for i in range(40):
        record(model=f"m{i % 3}", tenant=f"t{i % 4}", ttft_ms=3 + i * 149,
               gaps_ms=(1, 900 + 150 * i, 7), outcome="ok" if i % 6 else "timeout",
               trace_id=f"{i:032x}" if i % 5 == 0 else None)


def test_every_family_and_value_of_the_text_format_is_served() -> None:
    populate()
    renderer = runtime.state().renderer
    families = decode(renderer.render_protobuf())
    text = text_samples(renderer.render().decode())
    text_families = {f.name for f in text_string_to_metric_families(renderer.render().decode())}
    served = {name.removesuffix("_total") for name in families}
    assert text_families <= served
    checked = 0
    for name, family in families.items():
        for metric in family.metric:
            labels = key(metric.label)
            if family.type == pb.HISTOGRAM:
                h = metric.histogram
                assert text[(name + "_count", labels)] == h.sample_count
                assert text[(name + "_sum", labels)] == pytest.approx(h.sample_sum, rel=1e-12)
                for bucket in h.bucket:  # classic buckets: the exact `le` counts
                    le = (("le", textformat.number(bucket.upper_bound)),)
                    assert text[(name + "_bucket", key(labels + le))] == bucket.cumulative_count
                natives = native_buckets(_native(h))
                assert sum(c for *_, c in natives) == h.sample_count
                checked += 1
            elif family.type == pb.SUMMARY:
                s = metric.summary
                assert text[(name + "_count", labels)] == s.sample_count
                for q in s.quantile:
                    qk = key(labels + (("quantile", textformat.number(q.quantile)),))
                    assert text[(name, qk)] == q.value
            elif family.type == pb.COUNTER and not name.endswith("slo_calls_total"):
                assert text[(name, labels)] == metric.counter.value
            elif family.type == pb.GAUGE and name != names.SELF_SCRAPE_DURATION:
                assert text[(name, labels)] == metric.gauge.value
    assert checked > 30


def _native(h: pb.Histogram):
    from exporter._internal.expose.native import NativeBuckets

    return NativeBuckets(h.schema, h.zero_count, [(s.offset, s.length) for s in h.positive_span],
                         list(h.positive_delta))


def test_slo_counts_equal_the_classic_le_counts_at_every_threshold() -> None:
    runtime.configure({"slos": [{}, {"model": "m1", "ttft": {"threshold_seconds": 1.337}}]})
    populate()
    renderer = runtime.state().renderer
    families = decode(renderer.render_protobuf())
    text = text_samples(renderer.render().decode())
    for fam, thresholds in ((names.TTFT, ("1.337", "2.0")), (names.FIRST_ANSWER, ("10.0",)),
                            (names.STALL, ("5.0",))):
        slo = families[names.slo_calls_name(fam)]
        assert slo.type == pb.COUNTER
        seen = set()
        for metric in slo.metric:
            labels = dict(key(metric.label))
            le = labels.pop("le")
            seen.add(le)
            base = key(labels.items())
            expected = text[(fam.name + "_count", base)] if le == "+Inf" else \
                text[(fam.name + "_bucket", key(base + (("le", le),)))]
            assert metric.counter.value == expected
        assert seen == {*thresholds, "+Inf"}
    ttft = families[names.slo_calls_name(names.TTFT)]
    assert {dict(key(m.label))["le"] for m in ttft.metric} == {"1.337", "2.0", "+Inf"}


def test_exemplars_ride_on_the_classic_buckets_and_the_native_list() -> None:
    record(ttft_ms=120, trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    h = decode(runtime.state().renderer.render_protobuf())[names.TTFT.name].metric[0].histogram
    carrying = [b for b in h.bucket if b.HasField("exemplar")]
    assert [b.upper_bound for b in carrying] == [0.15]
    for exemplar in (carrying[0].exemplar, h.exemplars[0]):
        assert exemplar.label[0].name == "trace_id"
        assert exemplar.label[0].value == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert exemplar.value == pytest.approx(0.12) and exemplar.timestamp.seconds > 1.6e9


def test_formats_share_one_cache_and_stay_current_when_scraped_in_turn() -> None:
    renderer = runtime.state().renderer

    def ttft_count(body: bytes) -> int:
        return decode(body)[names.TTFT.name].metric[0].histogram.sample_count

    record(ttft_ms=100)
    renderer.render()
    renderer.render_protobuf()
    record(ttft_ms=200)  # changed: seen first by a text scrape, then by a protobuf one
    assert f'{names.TTFT.name}_count{{model="m"'.encode() in renderer.render()
    assert ttft_count(renderer.render_protobuf()) == 2
    record(ttft_ms=300)  # and the other way round
    assert ttft_count(renderer.render_protobuf()) == 3
    text = text_samples(renderer.render().decode())
    assert [v for (n, _), v in text.items() if n == names.TTFT.name + "_count"] == [3.0]
    assert ttft_count(renderer.render_protobuf()) == 3  # unchanged: from the cache


@pytest.mark.parametrize("accept, expected", [
    (NATIVE_ACCEPT, PROTOBUF),
    ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", OPENMETRICS),
    ("text/plain;version=0.0.4", TEXT),
    ("", TEXT),
    ("application/json", TEXT),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text",
     TEXT),  # the text encoding of protobuf is not served
    ("application/vnd.google.protobuf;proto=other.Message;encoding=delimited", TEXT),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0.2,application/openmetrics-text;q=0.9", OPENMETRICS),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0,text/plain", TEXT),
    (";;;q=x,,=,\x00\xff", TEXT),
    ("application/openmetrics-text;q=abc", TEXT),
])
def test_negotiation(accept: str, expected: str) -> None:
    assert negotiate(accept) == expected


def get(url: str, **headers: str) -> tuple[int, dict, bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
        return response.status, dict(response.headers), response.read()


def test_the_server_answers_prometheus_native_accept_header_with_protobuf() -> None:
    server = exporter.start_http_server(port=0)
    try:
        populate()
        status, headers, body = get(server.url, Accept=NATIVE_ACCEPT,
                                    **{"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Type"] == PROTOBUF_CONTENT_TYPE
        families = decode(gzip.decompress(body))
        assert families[names.TTFT.name].metric[0].histogram.positive_span
        status, headers, body = get(server.url, Accept="application/x-unknown;q=1")
        assert status == 200 and headers["Content-Type"] == TEXT_CONTENT_TYPE
        assert body.startswith(b"# HELP")
    finally:
        server.stop()


def test_an_encoder_failure_serves_text_and_counts_a_drop(monkeypatch) -> None:
    server = exporter.start_http_server(port=0)
    try:
        populate()
        def broken(family: object) -> bytes:
            raise RuntimeError("bug")

        monkeypatch.setattr(protobuf, "small_family", broken)
        status, headers, body = get(server.url, Accept=NATIVE_ACCEPT)
        assert status == 200 and headers["Content-Type"] == TEXT_CONTENT_TYPE
        assert f'{names.SELF_DROPS}{{reason="internal_error"}} 1.0'.encode() in body
    finally:
        server.stop()


@pytest.mark.parametrize("section, path", [
    ({"histograms": {"native_schema": 9}}, "histograms.native_schema"),
    ({"histograms": {"native_schema": -5}}, "histograms.native_schema"),
    ({"histograms": {"native_schema": "fine"}}, "histograms.native_schema"),
    ({"histograms": {"native_max_buckets": 0}}, "histograms.native_max_buckets"),
    ({"dashboards": {"histograms": "sparse"}}, "dashboards.histograms"),
])
def test_native_settings_are_validated(section: dict, path: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(section)
    assert [p for p, _ in error.value.errors] == [path]


def test_a_coarser_schema_from_the_config() -> None:
    runtime.configure({"histograms": {"native_schema": 2}})
    record(ttft_ms=120)
    h = decode(runtime.state().renderer.render_protobuf())[names.TTFT.name].metric[0].histogram
    assert h.schema == 2 and h.zero_threshold == 2.0 ** -128


def test_without_classic_buckets_only_the_exemplars_buckets_are_sent() -> None:
    runtime.configure({"histograms": {"protobuf_classic_buckets": False}})
    record(ttft_ms=120, trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    record(ttft_ms=900)
    families = decode(runtime.state().renderer.render_protobuf())
    h = families[names.TTFT.name].metric[0].histogram
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == [(0.15, 1)]
    assert h.bucket[0].exemplar.label[0].value == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert h.sample_count == 2 and sum(c for *_, c in native_buckets(_native(h))) == 2
    assert not families[names.OUTPUT_TOKENS.name].metric[0].histogram.bucket  # no exemplar
    slo = families[names.slo_calls_name(names.TTFT)].metric
    assert sorted(m.counter.value for m in slo) == [2.0, 2.0]  # both calls within 2 s
