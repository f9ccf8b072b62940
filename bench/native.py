"""Issue #13 figures: classic text vs protobuf with native histograms, at 1,000 and 10,000
histogram series: scrape bytes, render time, and what the same Prometheus binary holds after
ingesting each (head series, resident memory), side by side; fleet quantile error of classic
buckets and of native buckets against the exact quantiles of the union of three pods.
"""

from __future__ import annotations

import gzip
import random
import shutil
import time
import urllib.request
from dataclasses import replace

import numpy as np

from exporter._internal import names, runtime
from exporter._internal.config.settings import Config
from exporter._internal.expose.native import Converter, error_bound
from exporter._internal.expose.protobuf import Encoder
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.names import US_PER_SECOND
from exporter._internal.record.histogram import Histogram, Layout
from exporter._internal.record.timeline import CallTimeline

from .accuracy import QUANTILES, histogram_quantile, native_histogram_quantile, sample
from .core import _ttft_only
from .harness import Stat, ratios

CALLS_PER_SERIES = 20
#: The protobuf render's goal: at most this many times the text render's time.
GOAL = 1.2


def populate(n: int) -> None:
    """A fresh process state with `n` TTFT series (3 models x 3 routes x n/9 tenants), each
    with CALLS_PER_SERIES lognormal values, as bench/core.py's scrape figures: every other
    histogram family stays empty."""
    runtime.configure({"labels": {"max_tenants": 100_000, "max_series": 1_000_000}})
    rng = random.Random(5)
    for _ in range(CALLS_PER_SERIES):
        one_call_each(n, rng)


def one_call_each(n: int, rng: random.Random) -> None:
    """One lognormal TTFT call on each of the `n` series of `populate`, recorded as the caller
    records it (the values wait in their series' pending batches for the next scrape)."""
    rec = runtime.state().recorder
    now = time.perf_counter_ns()
    with rec.held:
        for i in range(n):
            t = CallTimeline(start=now, model=f"m{i % 3}", route=f"r{(i // 3) % 3}",
                             tenant=f"tenant-{i // 9}", provider="p")
            t.first_token = now + int(rng.lognormvariate(-0.7, 0.6) * 1e9)
            t.end = t.first_token + 1
            rec._record_locked(t, _ttft_only(t))


def render_side_by_side(n: int, runs: int) -> list[str]:
    populate(n)
    rec, renderer = runtime.state().recorder, runtime.state().renderer
    lean = Renderer(rec)  # the same series, protobuf without the classic buckets
    lean._encoder = Encoder(replace(rec.config, histograms=replace(
        rec.config.histograms, protobuf_classic_buckets=False)), rec.schema.families)
    ttft = list(rec.families[names.TTFT.name].series.values())
    contenders = {"text": renderer.render, "protobuf": renderer.render_protobuf,
                  "lean": lean.render_protobuf}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    called = {name: [] for name in ("text", "protobuf")}  # (one new call on every series)
    bodies = {name: render() for name, render in contenders.items()}  # warm-up: caches
    rng = random.Random(6)
    for _ in range(runs):  # every series marked changed before each render, interleaved
        for name, render in contenders.items():
            rec.dirty.update(ttft)
            started = time.thread_time()  # (CPU time: the machine's load does not count)
            bodies[name] = render()
            times[name].append((time.thread_time() - started) * 1000)
        for name in called:  # changed by a call: the scrape folds it in (and the native counts)
            one_call_each(n, rng)
            render = contenders[name]
            started = time.thread_time()
            render()
            called[name].append((time.thread_time() - started) * 1000)
    text, proto, lean_body = bodies["text"], bodies["protobuf"], bodies["lean"]
    text_ms, proto_ms = times["text"], times["protobuf"]
    call_speed = ratios(called["text"], called["protobuf"])
    size_ratio = len(text) / len(proto)
    gz_text, gz_proto = len(gzip.compress(text, 1)), len(gzip.compress(proto, 1))
    speed, lean_speed = ratios(text_ms, proto_ms), ratios(text_ms, times["lean"])
    return [
        f"| scrape bytes, {n:,} series: classic text / protobuf with native | "
        f"{len(text) / 1e6:.2f} MB / {len(proto) / 1e6:.2f} MB ({size_ratio:.1f}× smaller); "
        f"gzip level 1: {gz_text / 1e6:.2f} MB / {gz_proto / 1e6:.2f} MB "
        f"({gz_text / gz_proto:.1f}×) | ≥ 5× smaller | "
        f"{'met' if size_ratio >= 5 else 'missed'} |",
        f"| render, {n:,} series, every series marked changed (no new value): text | "
        f"{Stat.of(text_ms).fmt('ms', 1)} | | |",
        f"| render, {n:,} series, every series marked changed (no new value): protobuf with "
        f"native buckets | {Stat.of(proto_ms).fmt('ms', 1)} | at most {GOAL}× the text render "
        f"(issue #23) | {'met' if speed.median >= 1 / GOAL else 'missed'} (protobuf/text = "
        f"{1 / speed.median:.2f}×, min {1 / speed.high:.2f}, max {1 / speed.low:.2f}) |",
        f"| the same, `protobuf_classic_buckets: false` (native buckets, SLO counts and "
        f"exemplar buckets only): bytes; render | {len(lean_body) / 1e6:.2f} MB "
        f"({len(text) / len(lean_body):.1f}× smaller than text); "
        f"{Stat.of(times['lean']).fmt('ms', 1)} | | bytes "
        f"{'met' if len(text) / len(lean_body) >= 5 else 'missed'}, render "
        f"{'met' if lean_speed.median >= 1 / GOAL else 'missed'} (this/text = "
        f"{1 / lean_speed.median:.2f}×) |",
        f"| render, {n:,} series, one new call on every series: text; protobuf with native "
        f"buckets | {Stat.of(called['text']).fmt('ms', 1)}; "
        f"{Stat.of(called['protobuf']).fmt('ms', 1)} | at most {GOAL}× the text render "
        f"(issue #23) | {'met' if call_speed.median >= 1 / GOAL else 'missed'} "
        f"(protobuf/text = {1 / call_speed.median:.2f}×, min {1 / call_speed.high:.2f}, "
        f"max {1 / call_speed.low:.2f}) |",
    ]


def _self_metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("prometheus_tsdb_head_series ", "process_resident_memory_bytes ")):
            name, value = line.split()
            out[name] = float(value)
    return out


def prometheus_side_by_side(n: int) -> list[str]:
    """The same Prometheus binary three times at once: idle, scraping the text format, and
    scraping protobuf with native histograms on; head series and RSS once both hold n series."""
    from tests.support.prometheus import PrometheusServer

    populate(n)
    server = ExporterServer(create_app(lambda: runtime.state().renderer), "127.0.0.1", 0).start()
    target = server.url.split("//", 1)[1].split("/", 1)[0]
    interval = "1s" if n <= 1000 else "5s"
    scrape = (f"global:\n  scrape_interval: {interval}\nscrape_configs:\n  - job_name: x\n"
              f"    static_configs:\n      - targets: [\"{target}\"]\n")
    idle_config = "global:\n  scrape_interval: 15s\n"
    ttft = names.TTFT.name
    try:
        with PrometheusServer(idle_config) as idle, PrometheusServer(scrape) as classic, \
                PrometheusServer(scrape, extra_flags=["--enable-feature=native-histograms"]) \
                as native:
            classic.wait_for(f"count({ttft}_count) == {n}", timeout=120, interval=1)
            native.wait_for(f"count({ttft}) == {n}", timeout=120, interval=1)
            scrapes = "count_over_time(up[1h])"
            for prom in (classic, native):  # 5 more scrapes each, then read
                done = float(prom.query(scrapes)[0]["value"][1])
                prom.wait_for(scrapes, timeout=120, interval=1,
                              predicate=lambda r, d=done: float(r[0]["value"][1]) >= d + 5)
            base, text, prot = (_self_metrics(p.url) for p in (idle, classic, native))
    finally:
        server.stop()
    series = {k: v["prometheus_tsdb_head_series"] for k, v in (("t", text), ("p", prot))}
    growth = {k: (v["process_resident_memory_bytes"] - base["process_resident_memory_bytes"])
              / 2**20 for k, v in (("t", text), ("p", prot))}
    per_hist = series["p"] / n
    return [
        f"| Prometheus 2.42 head series after ingesting {n:,} TTFT series: classic / native | "
        f"{series['t']:,.0f} / {series['p']:,.0f} ({series['t'] / series['p']:.1f}× fewer) | "
        f"one series per histogram | met: 1 native series per histogram; with its 2 SLO "
        f"counters, 6 window-summary series and 1 request counter, {per_hist:.1f} per TTFT "
        f"series (classic: {series['t'] / n:.1f}) |",
        f"| Prometheus 2.42 resident memory over an idle one, {n:,} series: classic / native | "
        f"{growth['t']:,.0f} MiB / {growth['p']:,.0f} MiB | | |",
    ]


def fleet_accuracy(n: int) -> list[str]:
    """Three pods (one 30 % slower, one 20 % faster), merged: classic `histogram_quantile` over
    the summed `le` counts, native over the summed native buckets, at every schema."""
    config = Config()
    bounds = list(config.seconds_buckets())
    layout = Layout(int(config.histograms.max_seconds * US_PER_SECOND), 2,
                    [round(b * US_PER_SECOND) for b in bounds])
    pods = [[int(v * factor) for v in sample(n // 3, seed)]
            for seed, factor in ((11, 1.0), (12, 1.3), (13, 0.8))]
    merged = Histogram(layout)
    for values in pods:
        for k in range(0, len(values), 4096):
            merged.record_many(values[k:k + 4096])
    exact = np.quantile(np.array([v for p in pods for v in p]) / 1e6, QUANTILES,
                        method="inverted_cdf")
    cumulative = merged.cumulative_at() + [merged.count]
    default = config.histograms.native_schema
    head = " | ".join(f"p{q * 100:g}" for q in QUANTILES)
    lines = [f"| buckets | {head} | goal (p99) | populated buckets | bound |",
             "| --- | " + " | ".join("---" for _ in QUANTILES) + " | --- | --- | --- |"]
    classic = [abs(histogram_quantile(q, bounds, cumulative) - e) / e
               for q, e in zip(QUANTILES, exact)]
    lines.append("| classic, default `le` buckets | " + " | ".join(
        f"{x * 100:.2f} %" for x in classic) + f" | (3.2 % before) | {len(bounds) + 1} | |")
    for schema in range(3, 9):
        nb = Converter(layout, US_PER_SECOND, schema, 10**6).convert(merged)
        errors = [abs(native_histogram_quantile(q, nb) - e) / e for q, e in zip(QUANTILES, exact)]
        populated = sum(1 for d in _counts(nb.deltas) if d)
        mark = " (default)" if schema == default else ""
        goal = ("met" if errors[2] <= 0.02 else "missed") if schema == default else ""
        lines.append(f"| native, schema {schema}{mark} | " + " | ".join(
            f"{x * 100:.2f} %" for x in errors) + f" | {'≤ 2 %: ' + goal if goal else ''} | "
            f"{populated} | {error_bound(schema, layout) * 100:.2f} % |")
    return lines


def _counts(deltas: list[int]) -> list[int]:
    out, running = [], 0
    for d in deltas:
        running += d
        out.append(running)
    return out


def run(quick: bool) -> list[str]:
    sizes = (100,) if quick else (1_000, 10_000)
    lines = ["| figure | measured (median of runs; min, max) | goal | status |",
             "| --- | --- | --- | --- |"]
    for n in sizes:
        lines += render_side_by_side(n, 1 if quick else 7)
    if not quick and shutil.which("prometheus"):
        for n in sizes:
            lines += prometheus_side_by_side(n)
    runtime.configure(None)
    lines += ["", f"Each TTFT series holds {CALLS_PER_SERIES} lognormal calls (median 0.5 s); "
                  "the text format serves 29 `le` buckets, count and sum per series, the "
                  "protobuf format the same classic buckets plus the native ones (schema "
                  f"{Config().histograms.native_schema}) and two SLO counters. Both also serve "
                  "the window summaries (4 quantiles, count, sum). Renders are timed in CPU "
                  "time of the rendering thread, contenders interleaved; \"marked changed\" "
                  "renders every series again as it is, \"one new call\" records a call on "
                  "every series first, which the scrape folds in (the native counts kept "
                  "beside the HDR counts follow it).", "",
              "Fleet quantile error against the exact quantiles of the union of three pods "
              f"({(20_000 if quick else 999_999):,} values of the accuracy sample; pods 1.0×, "
              "1.3×, 0.8×), Prometheus 2.42's `histogram_quantile` on the summed buckets "
              "(linear interpolation in the bucket holding the rank):", ""]
    lines += fleet_accuracy(20_000 if quick else 999_999)
    return lines
