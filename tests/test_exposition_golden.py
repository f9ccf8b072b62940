"""Golden bytes: the exposition of one known call, written out by hand from the formats'
specifications (Prometheus text format 0.0.4 and OpenMetrics 1.0), not produced by a renderer.

The call: model m, provider p, route r, tenant t; first (answer) token 50 ms after the start,
end at 80 ms, traced (trace id abc); no phases stamped but `decode` (first answer token to last
token: 0 s). Buckets 0.1 s and 1 s (every SLO threshold set to 1 s, so no other boundary), one
window quantile (p50). The recorder's clock stands at Unix time 1700000000 (the exemplars' time,
and the renderer's build: every series and counter row is created after it, so their created
timestamp, in OpenMetrics and protobuf, is 1700000000; docs/metrics.md).

Window p50 values are HDR's highest equivalent value of the one recorded value's bucket (2
significant digits: 128 sub-buckets per octave): 50,000 µs lies in [32,768, 65,536), buckets of
256 µs, so in [49,920, 50,175] -> 0.050175 s; 80,000 µs lies in [65,536, 131,072), buckets of
512 µs, so in [79,872, 80,383] -> 0.080383 s.
"""

from __future__ import annotations

from exporter._internal.config.loader import load
from exporter._internal.expose.text import Renderer
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline
from exporter._internal.expose.proto import metrics_pb2 as pb
from tests.support.clock import ManualClock
from tests.test_protobuf_exposition import decode

LABELS = 'model="m",provider="p",route="r",tenant="t"'
TTFT = "llm_client_time_to_first_token_seconds"
WINDOW = "llm_client_time_to_first_token_window_seconds"
PHASE = "llm_client_phase_seconds"


def rendered(openmetrics: bool) -> dict[str, str]:
    """The body split into family blocks, by family name (the name on its HELP line)."""
    body = rendered_body(openmetrics).decode()
    blocks = {}
    for block in body.split("# HELP ")[1:]:
        blocks[block.split(" ", 1)[0]] = "# HELP " + block
    return blocks


def rendered_body(openmetrics: bool, protobuf: bool = False) -> bytes:
    """The body of the known call's exposition, the renderer built before the call."""
    clock = ManualClock()
    config = load({"histograms": {"seconds_buckets": [0.1, 1.0], "token_buckets": [100]},
                   "slos": [{"ttft": {"threshold_seconds": 1.0},
                             "first_answer_token": {"threshold_seconds": 1.0},
                             "stall": {"threshold_seconds": 1.0}}],
                   "window": {"quantiles": [0.5]}})
    rec = Recorder(config, clock)
    renderer = Renderer(rec)
    t = CallTimeline(start=clock.now_ns - 80_000_000, model="m", provider="p", route="r",
                     tenant="t", trace_id="abc")
    t.token(t.start + 50_000_000)
    t.end = t.start + 80_000_000
    t.outcome = "ok"
    rec.record_call(t)
    return renderer.render_protobuf() if protobuf else renderer.render(openmetrics)


def test_text_format_golden_bytes():
    blocks = rendered(openmetrics=False)
    assert blocks[TTFT] == (
        f"# HELP {TTFT} Time from the SDK call to the first output token of any kind.\n"
        f"# TYPE {TTFT} histogram\n"
        f'{TTFT}_bucket{{le="0.1",{LABELS}}} 1.0\n'
        f'{TTFT}_bucket{{le="1.0",{LABELS}}} 1.0\n'
        f'{TTFT}_bucket{{le="+Inf",{LABELS}}} 1.0\n'
        f"{TTFT}_count{{{LABELS}}} 1.0\n"
        f"{TTFT}_sum{{{LABELS}}} 0.05\n")
    assert blocks[WINDOW] == (
        f"# HELP {WINDOW} Quantiles of {TTFT} over the last 60.0 s, exact to HDR precision; "
        f"count and sum are cumulative.\n"
        f"# TYPE {WINDOW} summary\n"
        f'{WINDOW}{{model="m",provider="p",quantile="0.5",route="r",tenant="t"}} 0.050175\n'
        f"{WINDOW}_count{{{LABELS}}} 1.0\n"
        f"{WINDOW}_sum{{{LABELS}}} 0.05\n")
    decode = 'model="m",phase="decode",provider="p",route="r"'  # no tenant on phases
    assert blocks[PHASE] == (
        f"# HELP {PHASE} Time spent in each phase of the call (retry, queue, connect, send, "
        f"server, prefill, reasoning, decode).\n"
        f"# TYPE {PHASE} histogram\n"
        f'{PHASE}_bucket{{le="0.1",{decode}}} 1.0\n'
        f'{PHASE}_bucket{{le="1.0",{decode}}} 1.0\n'
        f'{PHASE}_bucket{{le="+Inf",{decode}}} 1.0\n'
        f"{PHASE}_count{{{decode}}} 1.0\n"
        f"{PHASE}_sum{{{decode}}} 0.0\n")
    assert blocks["llm_client_inter_token_latency_seconds"] == (  # an empty family
        "# HELP llm_client_inter_token_latency_seconds Each gap between consecutive token "
        "events after the first.\n"
        "# TYPE llm_client_inter_token_latency_seconds histogram\n")
    assert blocks["llm_client_requests_total"] == (
        "# HELP llm_client_requests_total LLM calls by outcome (ok, client_error, rate_limited, "
        "provider_error, timeout, connection_error, error, cancelled, abandoned).\n"
        "# TYPE llm_client_requests_total counter\n"
        'llm_client_requests_total{model="m",outcome="ok",provider="p",route="r",tenant="t"} '
        "1.0\n")
    assert blocks["ttft_exporter_series"] == (  # TTFT, first answer, duration, decode phase
        "# HELP ttft_exporter_series Histogram series held by this exporter.\n"
        "# TYPE ttft_exporter_series gauge\n"
        "ttft_exporter_series 4.0\n")
    assert blocks["ttft_exporter_dropped_total"] == (
        "# HELP ttft_exporter_dropped_total Values or series not recorded, by reason.\n"
        "# TYPE ttft_exporter_dropped_total counter\n"
        'ttft_exporter_dropped_total{reason="series_limit"} 0.0\n'
        'ttft_exporter_dropped_total{reason="bad_value"} 0.0\n'
        'ttft_exporter_dropped_total{reason="bad_label"} 0.0\n'
        'ttft_exporter_dropped_total{reason="internal_error"} 0.0\n'
        'ttft_exporter_dropped_total{reason="task_overflow"} 0.0\n')
    assert "trace_id" not in "".join(blocks.values())  # exemplars are OpenMetrics only


def test_openmetrics_golden_bytes():
    blocks = rendered(openmetrics=True)
    # the exemplar of the bucket the value fell in: trace id, value, Unix time
    assert blocks[TTFT] == (
        f"# HELP {TTFT} Time from the SDK call to the first output token of any kind.\n"
        f"# TYPE {TTFT} histogram\n"
        f'{TTFT}_bucket{{le="0.1",{LABELS}}} 1.0 # {{trace_id="abc"}} 0.05 1700000000.0\n'
        f'{TTFT}_bucket{{le="1.0",{LABELS}}} 1.0\n'
        f'{TTFT}_bucket{{le="+Inf",{LABELS}}} 1.0\n'
        f"{TTFT}_count{{{LABELS}}} 1.0\n"
        f"{TTFT}_sum{{{LABELS}}} 0.05\n"
        f"{TTFT}_created{{{LABELS}}} 1.7e+09\n")  # after _sum: created timestamp, Unix s
    # a counter's family name has no _total in OpenMetrics; its sample keeps it; `_created`
    # follows each row (a row at zero too: it was zero when the renderer was built)
    assert blocks["llm_client_requests"] == (
        "# HELP llm_client_requests LLM calls by outcome (ok, client_error, rate_limited, "
        "provider_error, timeout, connection_error, error, cancelled, abandoned).\n"
        "# TYPE llm_client_requests counter\n"
        'llm_client_requests_total{model="m",outcome="ok",provider="p",route="r",tenant="t"} '
        "1.0\n"
        'llm_client_requests_created{model="m",outcome="ok",provider="p",route="r",tenant="t"} '
        "1.7e+09\n")
    assert blocks["ttft_exporter_dropped"].endswith(
        'ttft_exporter_dropped_total{reason="task_overflow"} 0.0\n'
        'ttft_exporter_dropped_created{reason="task_overflow"} 1.7e+09\n')
    # the window summary and gauges carry none
    assert "_created" not in blocks[WINDOW] + blocks["ttft_exporter_series"]
    scrape = blocks["ttft_exporter_scrape_duration_seconds"]
    assert scrape.startswith("# HELP ttft_exporter_scrape_duration_seconds Time the previous "
                             "scrape of this exporter took to render.\n"
                             "# TYPE ttft_exporter_scrape_duration_seconds gauge\n"
                             "ttft_exporter_scrape_duration_seconds ")
    last = list(blocks.values())[-1]
    assert last.endswith("\n# EOF\n") and last.count("# EOF") == 1  # the body's end marker


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint, written out from the encoding's specification."""
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def test_protobuf_created_timestamps_golden_bytes():
    """`created_timestamp` (a google.protobuf.Timestamp: field 1 seconds) is field 15 of
    Histogram and field 3 of Counter, length-delimited (wire type 2)."""
    body = rendered_body(False, protobuf=True)
    stamp = b"\x08" + varint(1_700_000_000)  # seconds; no nanos field when 0
    histogram = bytes([15 << 3 | 2, len(stamp)]) + stamp
    counter = bytes([3 << 3 | 2, len(stamp)]) + stamp
    assert stamp == b"\x08\x80\xe2\xcf\xaa\x06"
    # TTFT, first answer, duration, decode phase: one histogram each
    assert body.count(histogram) == 4
    # every counter row (requests_total's, the SLO counts, each zero row of the self-metrics)
    # (an exemplar's timestamp is field 3 of Exemplar: the same bytes, the same time)
    families = decode(body).values()
    counters = [m for f in families if f.type == pb.COUNTER for m in f.metric]
    exemplars = sum(len(m.histogram.exemplars) + sum(b.HasField("exemplar")
                                                     for b in m.histogram.bucket)
                    for f in families for m in f.metric)
    assert exemplars == 2 * 3  # TTFT, first answer, duration: bucket + list
    # this recorder's rows all carry it; a process-wide self-metric that an earlier test moved
    # from zero existed before the renderer and carries none (docs/metrics.md)
    stamped = [m for m in counters if m.counter.HasField("created_timestamp")]
    assert len(stamped) > 10
    assert body.count(counter) == len(stamped) + exemplars
    assert {m.counter.created_timestamp.seconds for m in stamped} == {1_700_000_000}
