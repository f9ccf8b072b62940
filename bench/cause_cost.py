"""The Prometheus-side cost of the likely-cause decision at 10k, 100k and 1M head series.

`ttft-exporter watch` evaluates the decision as one `diagnose(prom, windows.request(now))` call
per evaluation (diagnose/watch.py): its instant queries (`rate(...[window])` over the
exporter's histogram and counter families, grouped by model and route) are all it asks of
Prometheus. This benchmark builds a
scrape body of the exporter's own families at each size (a Recorder fed with synthetic calls
over models × routes × tenants, rendered by the exporter's renderer, so names, labels and
buckets are what it serves), serves it on loopback with the counters growing scrape by scrape,
lets a real Prometheus scrape it until both windows hold samples, stops the scrapes (so
Prometheus' CPU is the queries' alone) and times evaluations of the decision.

    python -m bench --only bench.cause_cost      # writes its section of docs/benchmarks.md
    python -m bench.cause_cost                   # prints the markdown lines
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import median
from typing import Any

from exporter._internal.config.loader import load
from exporter._internal.config.settings import AlertingConfig
from exporter._internal.evidence.signals import SIGNALS
from exporter._internal.diagnose.run import LOGGED, Prometheus, diagnose
from exporter._internal.diagnose.watch import Windows
from exporter._internal.expose.text import Renderer
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

SCALES = (10_000, 100_000, 1_000_000)
CALLS_PER_TENANT = 3
#: The scrape job: `alerting.exporter_job`'s default, which the watch's queries select.
JOB = AlertingConfig().exporter_job
_MS = 1_000_000


@dataclass(frozen=True)
class Plan:
    """Scrape interval and the decision's windows (alerting.tenant_window_seconds and
    tenant_baseline_offset_seconds, shortened so a run takes minutes), and evaluations timed."""

    interval: float = 10.0
    window: float = 30.0
    offset: float = 60.0
    evaluations: int = 3
    #: Fixed across the sizes: only the tenants grow (a multi-tenant service's cardinality).
    models: int = 2
    routes: int = 5

    @property
    def scrapes(self) -> int:
        """Scrapes that cover the baseline window's start to the diagnosed window's end."""
        return math.ceil((self.window + self.offset) / self.interval) + 3


FULL = Plan()


@dataclass(frozen=True)
class QueryStats:
    """One query of the decision run alone, as Prometheus' own statistics tell it."""

    samples: int  # totalQueryableSamples
    seconds: float  # evalTotalTime
    expr: str


@dataclass(frozen=True)
class Row:
    """One size measured."""

    target: int
    head_series: int
    series_read: int
    samples_read: int
    queries: int
    rows_returned: int
    #: per evaluation: seconds (wall) and Prometheus' process CPU seconds
    wall: list[float]
    cpu: list[float]
    #: median per evaluation of Prometheus' query engine seconds (every slice)
    engine: float
    #: the decision's queries, heaviest first
    heaviest: tuple[QueryStats, ...] = ()
    #: per evaluation round: Prometheus' CPU seconds for the floor (`floor_queries`)
    floor: tuple[float, ...] = ()

    @property
    def floor_median(self) -> float:
        return median(self.floor) if self.floor else math.nan

    @property
    def wall_median(self) -> float:
        return median(self.wall)

    @property
    def cpu_median(self) -> float:
        return median(self.cpu)


# --- the scrape body ----------------------------------------------------------------------------

def _call(model: str, route: str, tenant: str, rng: random.Random, now: int) -> CallTimeline:
    """One streamed call with every stamp, usage and upstream the exporter records."""
    t = CallTimeline(start=now, model=model, provider="openai", route=route, tenant=tenant)
    t.dispatched = now + int(rng.uniform(0.1, 3) * _MS)
    t.connected = t.dispatched + int(rng.lognormvariate(3, 0.5) * _MS)
    t.sent = t.connected + int(rng.uniform(0.5, 4) * _MS)
    t.headers = t.sent + int(rng.lognormvariate(5, 0.6) * _MS)
    first = t.headers + int(rng.lognormvariate(4.5, 0.7) * _MS)
    tokens = rng.randint(5, 60)
    for k in range(tokens):
        t.token(first + k * int(rng.uniform(15, 45) * _MS))
    t.end = first + tokens * 45 * _MS
    t.input_tokens = int(rng.lognormvariate(7, 0.8))
    t.cached_input_tokens = int(t.input_tokens * rng.uniform(0, 0.9))
    t.output_tokens = tokens
    t.max_tokens = 1024
    t.finish_reason = "stop"
    t.outcome = "ok"
    t.upstream_address, t.upstream_region, t.fingerprint = "10.0.0.7:443", "eu-west", "fp_1"
    return t


def render(tenants: int, models: int, routes: int, seed: int = 1) -> str:
    """The exporter's text exposition after a few calls of every (model, route, tenant)."""
    cap = max(tenants, 100)
    rec = Recorder(load({"labels": {"max_tenants": cap, "max_series": 2_000_000}}))
    rng = random.Random(seed)
    now = time.perf_counter_ns()
    for m in range(models):
        for r in range(routes):
            for k in range(tenants):
                for _ in range(CALLS_PER_TENANT):
                    rec.record_call(_call(f"model-{m}", f"route-{r}", f"tenant-{k:05d}", rng,
                                          now))
    return Renderer(rec).render().decode()


def _samples(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def tenants_for(series: int, models: int, routes: int) -> int:
    """Tenants per (model, route) for about `series` samples in a body: the body's size is
    linear in the tenants (per-(model, route) families plus per-tenant ones)."""
    one, two = (_samples(render(k, models, routes)) for k in (1, 2))
    return max(1, round((series - one) / (two - one)) + 1)


class Body:
    """A rendered body whose counters (counter and histogram samples, a summary's count and
    sum) grow scrape by scrape: scrape n serves each of them at n times its value, so every
    rate is constant and non-zero; gauges and quantiles stay as rendered."""

    def __init__(self, text: str):
        growing: set[str] = set()
        summaries: set[str] = set()
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                if kind in ("counter", "histogram"):
                    growing.add(name)
                elif kind == "summary":
                    summaries.add(name)
        #: parts[i] is the fixed text before values[i] (header, fixed lines, name and labels).
        self.parts: list[str] = []
        self.values: list[float] = []
        self.samples = 0
        fixed: list[str] = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                fixed.append(line + "\n")
                continue
            self.samples += 1
            name = line.split("{", 1)[0].split(" ", 1)[0]
            family = re.sub(r"_(bucket|count|sum|total)$", "", name)
            grows = family in growing or name in growing or (
                family in summaries and name != family)
            if not grows:
                fixed.append(line + "\n")
                continue
            head, value = line.rsplit(" ", 1)
            number = float(value)
            self.parts.append("".join(fixed) + head + " ")
            self.values.append(int(number) if number.is_integer() else number)
            fixed = ["\n"]
        self.tail = "".join(fixed)

    def at(self, n: int) -> bytes:
        """The body of scrape `n` (1, 2, ...)."""
        return ("".join([p + str(v * n) for p, v in zip(self.parts, self.values)])
                + self.tail).encode()


class Target:
    """`Body` served on 127.0.0.1 as an exporter's /metrics, one scrape number per request,
    until `stop`; `served` holds each scrape's unix time."""

    def __init__(self, body: Body):
        self.served: list[float] = []
        lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    target.served.append(time.time())
                    data = body.at(len(target.served))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


# --- what Prometheus says about itself ------------------------------------------------------------

_SELF = re.compile(r"^(prometheus_tsdb_head_series|process_cpu_seconds_total|"
                   r"prometheus_engine_query_duration_seconds_sum)(\{[^}]*\})? (\S+)$", re.M)


def self_metrics(url: str) -> dict[str, float]:
    """Head series, process CPU seconds and query engine seconds (every slice summed), from
    Prometheus' own /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    out = {"head": 0.0, "cpu": 0.0, "engine": 0.0}
    for name, _, value in _SELF.findall(text):
        key = {"prometheus_tsdb_head_series": "head", "process_cpu_seconds_total": "cpu"}.get(
            name, "engine")
        out[key] += float(value)
    return out


class _Recording(Prometheus):
    """The diagnose client, keeping each query and how many rows it returned."""

    def __init__(self, url: str, timeout: float):
        super().__init__(url, timeout)
        self.asked: list[tuple[str, int]] = []
        self.at: list[float] = []

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        result = super().query(expr, at)
        self.asked.append((expr, len(result)))
        self.at.append(at)
        return result


_RANGE = re.compile(r"\b((?:llm_client|ttft_exporter)_\w+(?:\{[^}]*\})?\[\w+\])")


def floor_queries(rec: _Recording) -> list[tuple[str, float]]:
    """The floor under the decision: each (range selector, time) its queries read, read once
    by the cheapest query that touches every sample (`count(count_over_time(...))`). What
    this costs is Prometheus' selecting and decoding the same series and samples, with no
    arithmetic of the decision's own."""
    seen = sorted({(found, at) for (expr, _), at in zip(rec.asked, rec.at)
                   for found in _RANGE.findall(expr)})
    return [(f"count(count_over_time({selector}))", at) for selector, at in seen]


_SELECTOR = re.compile(r"\b((?:llm_client|ttft_exporter)_\w+)(\{[^}]*\})?")


def _api(url: str, expr: str, at: float, stats: bool = False) -> dict[str, Any]:
    params = {"query": expr, "time": f"{at:.3f}", **({"stats": "all"} if stats else {})}
    body = urllib.parse.urlencode(params).encode()
    with urllib.request.urlopen(url + "/api/v1/query", data=body, timeout=600) as response:
        return json.loads(response.read())["data"]


def series_read(url: str, exprs: list[str], at: float) -> int:
    """Head series the queries select: the union of every selector in them."""
    selectors = sorted({name + (matchers or "") for expr in exprs
                        for name, matchers in _SELECTOR.findall(expr)})
    result = _api(url, f"count({' or '.join(selectors)})", at)["result"]
    return int(float(result[0]["value"][1])) if result else 0


def query_stats(url: str, exprs: list[str], at: float) -> list[QueryStats]:
    """Each query's samples and evaluation time, run one at a time, heaviest first."""
    out = []
    for expr in exprs:
        found = _api(url, expr, at, stats=True).get("stats", {})
        out.append(QueryStats(int(found.get("samples", {}).get("totalQueryableSamples", 0)),
                              float(found.get("timings", {}).get("evalTotalTime", 0)), expr))
    return sorted(out, key=lambda q: (q.samples, q.seconds), reverse=True)


# --- the sizes, side by side ------------------------------------------------------------------

class Scraped:
    """One size: its body served, a Prometheus scraping it until both windows hold samples,
    then the scrapes stopped (`ready`), so nothing but the queries runs in that Prometheus."""

    def __init__(self, series: int, plan: Plan, log: Callable[[str], None]):
        from tests.support.prometheus import PrometheusServer, scrape_config

        self.series, self.plan, self.log = series, plan, log
        tenants = tenants_for(series, plan.models, plan.routes)
        began = time.perf_counter()
        body = Body(render(tenants, plan.models, plan.routes))
        log(f"{series:,}: {tenants} tenants per (model, route), {body.samples:,} samples, "
            f"rendered in {time.perf_counter() - began:.0f} s")
        self.target = Target(body)
        self.stopped = False
        config = scrape_config(self.target.address, job=JOB, interval=plan.interval)
        try:
            # at 1M series a query among 8 at once on 2 cores can outlast the default 2 minutes
            self.prom = PrometheusServer(config, extra_flags=["--query.timeout=10m"])
        except BaseException:
            self.target.stop()
            raise
        self.deadline = time.monotonic() + plan.interval * (plan.scrapes + 10) + 120
        self.at = 0.0

    def ready(self) -> bool:
        """Stop the scrapes once there are enough; True once the last one is stored and the
        next failed (its stale markers are written after `at`, the last scrape's time)."""
        if self.at:
            return True
        if not self.stopped:
            if len(self.target.served) < self.plan.scrapes:
                if time.monotonic() > self.deadline or not self.prom.running():
                    raise RuntimeError(f"{self.series:,}: only {len(self.target.served)} "
                                       f"scrapes served:\n{self.prom.log}")
                return False
            self.target.stop()
            self.stopped = True
        last = self.target.served[-1]
        wait = self.plan.interval * 3 + 30
        self.prom.wait_for(f'up{{job="{JOB}"}} == 1 and timestamp(up) >= {last - 1:.3f}',
                           timeout=wait)
        self.prom.wait_for(f'up{{job="{JOB}"}} == 0', timeout=wait)
        self.at = last
        self.log(f"{self.series:,}: {len(self.target.served)} scrapes over "
                 f"{last - self.target.served[0]:.0f} s")
        return True

    def close(self) -> None:
        if not self.stopped:
            self.target.stop()
            self.stopped = True
        self.prom.stop()


def measure(sizes: list[int], plan: Plan = FULL, log: Callable[[str], None] = lambda _: None
            ) -> list[Row]:
    """Serve each size to its own Prometheus, all at once, until both windows hold samples;
    then time `plan.evaluations` decisions per size at its last scrape, interleaved (each
    round evaluates every size once), as every speed in docs/benchmarks.md is measured."""
    windows = Windows.of(AlertingConfig(tenant_window_seconds=plan.window,
                                        tenant_baseline_offset_seconds=plan.offset))
    with ExitStack() as stack:
        scraped: list[Scraped] = []
        for n in sizes:
            scraped.append(Scraped(n, plan, log))
            stack.callback(scraped[-1].close)
        while not all([s.ready() for s in scraped]):
            time.sleep(0.2)
        time.sleep(1)
        requests = [windows.request(s.at) for s in scraped]  # the watch's own request
        recordings = []
        for s, req in zip(scraped, requests):  # warm-up, and what the decision asks
            recordings.append(_Recording(s.prom.url, timeout=600))
            diagnose(recordings[-1], req, windows.thresholds)
        heads = [int(self_metrics(s.prom.url)["head"]) for s in scraped]
        wall: list[list[float]] = [[] for _ in scraped]
        cpu: list[list[float]] = [[] for _ in scraped]
        engine: list[list[float]] = [[] for _ in scraped]
        floor: list[list[float]] = [[] for _ in scraped]
        floors = [floor_queries(rec) for rec in recordings]
        for _ in range(plan.evaluations):
            for k, s in enumerate(scraped):  # the floor: the same reads, nothing computed
                before = self_metrics(s.prom.url)
                with ThreadPoolExecutor(max_workers=8) as pool:  # as diagnose runs them
                    list(pool.map(lambda q, url=s.prom.url: _api(url, *q), floors[k]))
                floor[k].append(self_metrics(s.prom.url)["cpu"] - before["cpu"])
            for k, (s, req) in enumerate(zip(scraped, requests)):
                client = Prometheus(s.prom.url, timeout=600)
                before = self_metrics(s.prom.url)
                start = time.perf_counter()
                diagnose(client, req, windows.thresholds)
                wall[k].append(time.perf_counter() - start)
                after = self_metrics(s.prom.url)
                cpu[k].append(after["cpu"] - before["cpu"])
                engine[k].append(after["engine"] - before["engine"])
                log(f"{s.series:,}: evaluation in {wall[k][-1]:.2f} s, Prometheus CPU "
                    f"{cpu[k][-1]:.2f} s")
        rows = []
        for k, (s, rec) in enumerate(zip(scraped, recordings)):
            exprs = [expr for expr, _ in rec.asked]
            stats = query_stats(s.prom.url, exprs, s.at)
            rows.append(Row(target=s.series, head_series=heads[k],
                            series_read=series_read(s.prom.url, exprs, s.at),
                            samples_read=sum(q.samples for q in stats),
                            queries=len(exprs), rows_returned=sum(r for _, r in rec.asked),
                            wall=wall[k], engine=median(engine[k]), cpu=cpu[k],
                            heaviest=tuple(stats), floor=tuple(floor[k])))
            log(f"{s.series:,}: {rows[-1].head_series:,} head series, {rows[-1].series_read:,} "
                f"read, CPU {rows[-1].cpu}, wall {rows[-1].wall}")
    return rows


# --- the fit and the section -------------------------------------------------------------------

def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def section(rows: list[Row], plan: Plan) -> list[str]:
    """The markdown lines: the table, the fits and the growth verdict (at least two sizes)."""
    from bench.__main__ import machine

    queries = rows[0].queries
    lines = [
        f"One evaluation of the decision is one `diagnose()` call with the watch's own request "
        f"(`Windows.request`: every selector scoped to the exporter's job) ({queries} instant "
        f"queries: "
        f"{2 * (len(SIGNALS) + len(LOGGED)) + 2} signal, bucket and upstream queries over both "
        f"windows, 8 at a time, the baseline's choice among its candidate windows, and the "
        f"histogram-mode check; a baseline chosen further back adds its window's), here with "
        f"the alerting window "
        f"{plan.window:g} s and the baseline {plan.offset:g} s earlier, against a real "
        f"Prometheus {_prometheus_version()} that scraped the exporter's families every "
        f"{plan.interval:g} s ({plan.models} models × {plan.routes} routes × the tenants, "
        f"rendered by the exporter; the counters grow at a steady rate). Each size has its own "
        f"Prometheus, all scraping at once; the scrapes stop before the evaluations, so a "
        f"Prometheus' CPU is the queries' alone, and the {plan.evaluations} timed evaluations "
        f"per size are interleaved (each round evaluates every size once). The query engine's "
        f"seconds add up the queries running side by side (8 on 2 cores), so they exceed the "
        f"wall time; Prometheus' CPU seconds are the cost.", "",
        f"Measured {time.strftime('%Y-%m-%d')}; {machine()[0][2:]} (nproc "
        f"{os.cpu_count()}), shared with other work while it ran. Reproduce: "
        f"`python -m bench --only bench.cause_cost` (`make bench` runs every section).", "",
        "| head series | series the decision reads | samples it reads | seconds per evaluation "
        "(median; min, max) | Prometheus CPU s per evaluation (median; min, max) | "
        "query engine s per evaluation (median) | CPU µs per series read | floor: CPU s "
        "reading the same series and samples once (median) | decision / floor |",
        "| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.head_series:,} | {r.series_read:,} | {r.samples_read:,} | "
                     f"{r.wall_median:.2f} ({min(r.wall):.2f}, {max(r.wall):.2f}) | "
                     f"{r.cpu_median:.2f} ({min(r.cpu):.2f}, {max(r.cpu):.2f}) | "
                     f"{r.engine:.2f} | {r.cpu_median / r.series_read * 1e6:.0f} | "
                     f"{r.floor_median:.2f} | {r.cpu_median / r.floor_median:.1f}× |")
    cpu = [r.cpu_median for r in rows]
    a, b = fit([r.head_series for r in rows], cpu)
    sa, sb = fit([r.series_read for r in rows], cpu)
    wa, wb = fit([r.head_series for r in rows], [r.wall_median for r in rows])
    small, large = rows[0], rows[-1]
    ratio = (large.cpu_median / large.series_read) / (small.cpu_median / small.series_read)
    head_ratio = (large.cpu_median / large.head_series) / (small.cpu_median / small.head_series)
    log_c, k = fit([math.log(r.series_read) for r in rows], [math.log(c) for c in cpu])
    _, floor_k = fit([math.log(r.series_read) for r in rows],
                     [math.log(r.floor_median) for r in rows])
    over_floor = [r.cpu_median / r.floor_median for r in rows]
    steps = ", ".join(f"{_exponent(x, y):.2f} from {x.head_series:,} to {y.head_series:,}"
                      for x, y in zip(rows, rows[1:]))
    lines += ["", f"Formula (least squares over the {len(rows)} sizes; N = head series, "
              f"S = series the decision reads, {small.series_read / small.head_series:.0%} to "
              f"{large.series_read / large.head_series:.0%} of N here):", "",
              f"- Prometheus CPU per evaluation ≈ {a:.3f} s + {b * 1e6:.2f} µs × N "
              f"= {sa:.3f} s + {sb * 1e6:.2f} µs × S",
              f"- as a power: Prometheus CPU per evaluation ≈ {math.exp(log_c) * 1e6:.2f} µs × "
              f"S^{k:.2f} (the exponent between consecutive sizes: {steps})",
              f"- wall time per evaluation ≈ {wa:.3f} s + {wb * 1e6:.2f} µs × N", "",
              f"Growth: CPU per series read at {large.head_series:,} head series is "
              f"{ratio:.2f}× that at {small.head_series:,} (per head series {head_ratio:.2f}×): "
              + ("at most linear." if ratio <= 1.1 else "MORE than linear."),
              "", f"The floor (`floor_queries`: every range selector of the decision read once "
              f"at its time by `count(count_over_time(...))`, 8 at a time as diagnose runs "
              f"them) grows as S^{floor_k:.2f}: Prometheus' selecting and decoding the same "
              f"series and samples, with no arithmetic of the decision's. The decision costs "
              f"{min(over_floor):.1f}–{max(over_floor):.1f}× its floor across the sizes "
              f"({', '.join(f'{x:.1f}×' for x in over_floor)}): "
              + ("its multiple of the floor does not grow with the series, so what grows "
                 "faster than linear is Prometheus' selecting and reading them, which any "
                 "query of these series pays, not the decision's arithmetic."
                 if over_floor[-1] <= 1.1 * over_floor[0]
                 else "the decision's own work grows faster than its reads."),
              "", *_heaviest(large),
              "", f"The cost is per evaluation: `ttft-exporter watch` pays it once per "
              f"evaluation interval. Samples per series scale it too: each window held "
              f"{plan.window / plan.interval:g} scrapes here; the default window (300 s) at a "
              f"15 s scrape holds 20, which adds the samples' decoding on top (the samples "
              f"column)."]
    return lines


def _heaviest(row: Row, shown: int = 4) -> list[str]:
    """The queries that cost the most at `row`'s size, each run alone."""
    total = sum(q.samples for q in row.heaviest) or 1
    top = row.heaviest[:shown]
    lines = [f"At {row.head_series:,} head series the {len(top)} heaviest of the {row.queries} "
             f"queries read {sum(q.samples for q in top) / total:.0%} of the samples (each run "
             f"alone, Prometheus' own statistics):", ""]
    for q in top:
        text = " ".join(q.expr.split())
        cut = text if len(text) <= 150 else text[:text.rfind(" ", 0, 150)] + " …"
        lines.append(f"- {q.samples:,} samples, {q.seconds:.1f} s: `{cut}`")
    return lines


def _exponent(x: Row, y: Row) -> float:
    """k of CPU ∝ S^k between two sizes."""
    return math.log(y.cpu_median / x.cpu_median) / math.log(y.series_read / x.series_read)


def _prometheus_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True,
                             timeout=10)
    except OSError:
        return "version unknown"
    found = re.search(r"version (\S+)", out.stdout or out.stderr)
    return found.group(1) if found else "version unknown"


def run(quick: bool = False) -> list[str]:
    """The section's lines; `quick` (the suite's smoke run) skips it: the three sizes take
    ~15 minutes and 6 GB (tests/test_bench_smoke.py measures a tiny size)."""
    if quick:
        return ["(not run with --quick: the three sizes take ~15 minutes; "
                "tests/test_bench_smoke.py measures 2,000 series)"]
    import sys

    rows = measure(list(SCALES), FULL, lambda s: print(f"bench.cause_cost: {s}",
                                                       file=sys.stderr, flush=True))
    return section(rows, FULL)


if __name__ == "__main__":
    print("\n".join(run()))
