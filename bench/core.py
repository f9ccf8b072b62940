"""Issue #2 figures: token cost, record cost, bytes per series, scrape time."""

from __future__ import annotations

import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

from hdrh.histogram import HdrHistogram
from prometheus_client import CollectorRegistry, Histogram as PromHistogram, generate_latest

from exporter._internal import names, runtime
from exporter._internal.config.loader import load
from exporter._internal.config.settings import Config
from exporter._internal.expose.text import Renderer
from exporter._internal.expose.textformat import TEXT
from exporter._internal.names import US_PER_SECOND
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline
from exporter._internal.shim.manual import Call

from .harness import Stat, interleaved, ratios

HOUR_US = 3_600_000_000


def token_cost(runs: int, ops: int) -> list[str]:
    """Added ns per `call.token()` over a bare `time.perf_counter_ns()` loop."""
    from time import perf_counter_ns

    def bare(n: int) -> None:
        for _ in range(n):
            perf_counter_ns()

    def tokens(n: int) -> None:
        call = Call("m", "p", "r", "t")
        token = call.token
        for _ in range(n):
            token()

    def tokens_kind(n: int) -> None:
        call = Call("m", "p", "r", "t")
        token = call.token
        for _ in range(n):
            token("reasoning")

    res = interleaved({"bare": bare, "token": tokens, "reasoning": tokens_kind}, ops, runs)
    added = Stat.of([t - b for t, b in zip(res["token"], res["bare"])])
    added_r = Stat.of([t - b for t, b in zip(res["reasoning"], res["bare"])])
    return [
        f"| `call.token()` added over a bare `perf_counter_ns()` loop | {added.fmt()} | "
        f"≤ 200 ns | {'met' if added.median <= 200 else 'missed'} |",
        f"| `call.token(\"reasoning\")` added | {added_r.fmt()} | ≤ 200 ns | "
        f"{'met' if added_r.median <= 200 else 'missed'} |",
        f"| (bare `perf_counter_ns()` loop itself) | {Stat.of(res['bare']).fmt()} | | |",
    ]


def record_cost(runs: int, ops: int) -> list[str]:
    """Per-value cost of the recorder vs prometheus_client observe, HdrHistogram_py, OTel."""
    rng = random.Random(1)
    values_us = [int(rng.lognormvariate(13, 0.8)) for _ in range(4096)]
    values_s = [v / US_PER_SECOND for v in values_us]
    registry = CollectorRegistry()
    prom = PromHistogram("x_seconds", "x", buckets=Config().seconds_buckets(),
                         registry=registry)
    prom_labelled = PromHistogram("y_seconds", "y", ["model", "route"],
                                  buckets=Config().seconds_buckets(), registry=registry)
    hdr = HdrHistogram(1, HOUR_US, 2)
    rec = Recorder()
    slice_id = time.perf_counter_ns() // rec.slice_ns

    def recorder_path(family: names.Family, fold_at_scrape: bool) -> Callable[[int], None]:
        """Values recorded as calls do: one lock per call, ~10 values per call."""
        lock, observe = rec._lock, rec.observe
        state = rec.families[family.name]
        key = ("m", "p", "r", "t") if state.has_tenant else ("m", "p", "r")

        def run(n: int) -> None:
            for k in range(0, n, 10):
                start = k % 4000
                with lock:
                    for v in values_us[start:start + 10]:
                        observe(state, key, v, slice_id)
                    if fold_at_scrape:  # the scrape thread's share, not timed as caller work
                        state.series[key].pending.clear()
        return run

    def cycle(fn: Callable[[float], None], values: list[float]) -> Callable[[int], None]:
        def run(n: int) -> None:
            k = len(values)
            for i in range(n):
                fn(values[i % k])
        return run

    contenders: dict[str, Callable[[int], None]] = {
        "this recorder, windowed family (TTFT), all work: append, HDR fold into cumulative "
        "and window slice": recorder_path(names.TTFT, False),
        "this recorder, family without window (phases, tokens), all work":
            recorder_path(names.TPOT, False),
        "this recorder, caller's thread when scrapes fold (append only)":
            recorder_path(names.TTFT, True),
        "prometheus_client bound `observe`": cycle(prom.observe, values_s),
        "prometheus_client `labels(...).observe`": cycle(
            lambda v: prom_labelled.labels("m", "r").observe(v), values_s),
        "HdrHistogram_py `record_value`": cycle(hdr.record_value, values_us),  # type: ignore
    }
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
        otel = meter.create_histogram("x", unit="s")
        attrs = {"model": "m", "route": "r", "tenant": "t"}
        contenders["OTel SDK `Histogram.record` (3 attributes)"] = cycle(
            lambda v: otel.record(v, attrs), values_s)
    except ImportError:
        pass
    res = interleaved(contenders, ops, runs)
    base = res["prometheus_client bound `observe`"]
    lines = []
    for name, values in res.items():
        r = ratios(base, values)
        goal, status = "", f"prometheus_client/this = {r.median:.1f}×"
        if name.startswith("this recorder, windowed"):
            goal = "≥ 5× cheaper than prometheus_client `observe`"
            status = f"{'met' if r.median >= 5 else 'missed'} ({status})"
        lines.append(f"| record one value: {name} | {Stat.of(values).fmt()} | {goal} | "
                     f"{status} |")
    return lines


def bytes_per_series(quick: bool) -> list[str]:
    """Memory of one TTFT series (cumulative + window) after a realistic load of values."""
    rng = random.Random(2)
    n_series = 200 if quick else 10_000
    values_per_series = 200 if quick else 1000
    config = load({"labels": {"max_tenants": 100_000, "max_series": 1_000_000}})
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rec = Recorder(config)
    now = time.perf_counter_ns()
    for i in range(n_series):
        t_model, t_route, t_tenant = f"m{i % 3}", f"r{(i // 3) % 3}", f"tenant-{i // 9}"
        for _ in range(values_per_series // 10):
            t = CallTimeline(start=now, model=t_model, route=t_route, tenant=t_tenant,
                             provider="p")
            ttft = int(rng.lognormvariate(-0.7, 0.6) * 1e9)
            t.first_token = t.first_answer_token = now + ttft
            t.end = now + ttft + int(rng.uniform(1, 5) * 1e9)
            rec.record_call(t)
    for state in rec.families.values():  # fold pending batches, as the next scrape would
        for series in state.series.values():
            series.fold(config.window.slices)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    state = rec.families[names.TTFT.name]
    counters = [h.nbytes for _, h in rec.folded_copies(state)]
    counters.sort()
    total = after - before
    series = rec.series_count
    per_series = total / series
    return [
        f"| bytes per series, whole recorder (all families, window slices, keys) at "
        f"{series:,} series | {per_series:,.0f} B | ≤ 4 KB | "
        f"{'met' if per_series <= 4096 else 'missed'} |",
        f"| HDR counters of one TTFT series (median of {len(counters):,}; lognormal TTFT, "
        f"~{values_per_series // 10} calls each) | {counters[len(counters) // 2]:,} B | | |",
        f"| total recorder memory at {series:,} series | {total / 2**20:,.1f} MiB | | |",
    ]


def scrape_time(runs: int, sizes: tuple[int, ...]) -> list[str]:
    """Render time at N histogram series vs prometheus_client.generate_latest, same content."""
    lines = []
    for n in sizes:
        runtime.configure({"labels": {"max_tenants": 100_000, "max_series": 1_000_000}})
        rec = runtime.state().recorder
        rng = random.Random(3)
        now = time.perf_counter_ns()
        renderer = Renderer(rec)  # before the calls: every series gets a created timestamp
        # N TTFT series: n/9 tenants x 3 models x 3 routes, a few calls each
        for i in range(n):
            t = CallTimeline(start=now, model=f"m{i % 3}", route=f"r{(i // 3) % 3}",
                             tenant=f"tenant-{i // 9}", provider="p")
            t.first_token = now + int(rng.lognormvariate(-0.7, 0.6) * 1e9)
            t.end = t.first_token + 1
            for _ in range(3):
                rec._record_locked(t, _ttft_only(t))
        renderer.delivered(renderer.scrape(TEXT, "prom").delivery)  # every series' debut
        registry = CollectorRegistry()

        registry.register(runtime.collector())
        full, partial, scraped, openmetrics, reference = [], [], [], [], []
        size = 0

        def render_changed(every: int, scraper: bool = False, om: bool = False
                           ) -> tuple[float, int]:
            """(ms, bytes) of a render after every `every`-th series changed since the last."""
            for k, s in enumerate(rec.families[names.TTFT.name].series.values()):
                if k % every == 0:
                    rec.dirty.add(s)
            start = time.perf_counter()
            body = renderer.render(om, scraper="prom" if scraper else None)
            return (time.perf_counter() - start) * 1000, len(body)

        for _ in range(runs):
            ms, size = render_changed(1)
            full.append(ms)
            partial.append(render_changed(10)[0])  # 10% of the series changed
            # the same for a scraper: the debut bookkeeping (debut.py) on top
            scraped.append(render_changed(10, scraper=True)[0])
            # OpenMetrics: exemplars and the `_created` lines (expose/created.py) on top
            openmetrics.append(render_changed(10, om=True)[0])
            start = time.perf_counter()
            generate_latest(registry)
            reference.append((time.perf_counter() - start) * 1000)
        r_full = ratios(reference, full)
        goal = "≤ 50 ms" if n == 1000 else "≥ 10× faster than generate_latest"
        met = Stat.of(full).median <= 50 if n == 1000 else r_full.median >= 10
        lines.append(f"| scrape {n:,} series, every series changed | {Stat.of(full).fmt('ms', 1)}"
                     f"; {size / 1e6:.1f} MB | {goal} | {'met' if met else 'missed'} "
                     f"(generate_latest/this = {r_full.median:.1f}×) |")
        lines.append(f"| scrape {n:,} series, 10% changed | {Stat.of(partial).fmt('ms', 1)} | | "
                     f"(generate_latest/this = {ratios(reference, partial).median:.1f}×) |")
        lines.append(f"| scrape {n:,} series, 10% changed, by a scraper (new series debut "
                     f"at zero) | {Stat.of(scraped).fmt('ms', 1)} | | (this/plain = "
                     f"{ratios(scraped, partial).median:.2f}×) |")
        lines.append(f"| scrape {n:,} series, 10% changed, OpenMetrics (`_created` lines) | "
                     f"{Stat.of(openmetrics).fmt('ms', 1)} | | (this/plain = "
                     f"{ratios(openmetrics, partial).median:.2f}×) |")
        lines.append(f"| prometheus_client generate_latest, same {n:,} series | "
                     f"{Stat.of(reference).fmt('ms', 1)} | | |")
    runtime.configure(None)
    return lines


def _ttft_only(t: CallTimeline):
    from exporter._internal.record.timeline import Derived

    none = dict.fromkeys(Derived._fields)
    return Derived(**{**none, "ttft": (t.first_token - t.start) // 1000, "phases": {},
                      "gaps": []})


def run(quick: bool) -> list[str]:
    runs = 3 if quick else 7
    lines = ["| figure | measured (median of runs; min, max) | goal | status |",
             "| --- | --- | --- | --- |"]
    lines += token_cost(runs, 2_000 if quick else 200_000)
    record = record_cost(runs, 2_000 if quick else 200_000)
    lines += record
    lines += bytes_per_series_isolated(quick)
    lines += scrape_time(runs if not quick else 1, (100,) if quick else (1_000, 10_000))
    if any("missed" in line for line in record):
        lines += ["", "Why the record-cost goal is missed, and what would close it: in pure "
                      "Python one HDR bucket index costs ~0.1–0.14 µs and one `array` increment "
                      "~0.08 µs, and a windowed family counts each value twice (cumulative and "
                      "window slice), so all the work per value stays above 0.5 µs while "
                      "prometheus_client's `observe` costs ~0.9 µs here (not the 1.6 µs the goal "
                      "assumed). The caller's thread pays only the append row's figure: the "
                      "indexing runs when a scrape folds the batch. Closing the gap needs the "
                      "index-and-increment loop in C (a small extension module)."]
    return lines


def bytes_per_series_isolated(quick: bool) -> list[str]:
    """`bytes_per_series` in a fresh interpreter: what other benchmarks left behind in this
    process (caches, resized global tables) would otherwise be counted (~4 %)."""
    import subprocess

    args = [sys.executable, "-m", "bench.core", "--memory"] + (["--quick"] if quick else [])
    done = subprocess.run(args, capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    return done.stdout.splitlines()


if __name__ == "__main__":
    if "--memory" in sys.argv:
        print("\n".join(bytes_per_series("--quick" in sys.argv)))
    else:
        print("\n".join(run("--quick" in sys.argv)))
