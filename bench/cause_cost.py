"""The Prometheus-side cost of the likely-cause decision at 10k, 100k and 1M head series.

`ttft-exporter watch` evaluates the decision as one `diagnose(prom, Request(...))` call per
evaluation: its instant queries (`rate(...[window])` over the exporter's histogram and counter
families, grouped by model and route) are all it asks of Prometheus. This benchmark builds a
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
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import median
from typing import Any

from exporter._internal.config.loader import load
from exporter._internal.config.settings import AlertingConfig
from exporter._internal.diagnose.causes import SIGNALS
from exporter._internal.diagnose.run import LOGGED, Prometheus, Request, diagnose
from exporter._internal.expose.text import Renderer
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

SCALES = (10_000, 100_000, 1_000_000)
CALLS_PER_TENANT = 3
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
class Row:
    """One size measured."""

    target: int
    head_series: int
    series_read: int
    samples_read: int
    queries: int
    rows_returned: int
    wall: list[float]
    engine: float  # Prometheus' query engine seconds per evaluation (every slice)
    cpu: float  # Prometheus process CPU seconds per evaluation

    @property
    def wall_median(self) -> float:
        return median(self.wall)


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

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        result = super().query(expr, at)
        self.asked.append((expr, len(result)))
        return result


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


def samples_read(url: str, exprs: list[str], at: float) -> int:
    """Samples Prometheus loaded for the queries (its own `totalQueryableSamples`)."""
    return sum(int(_api(url, expr, at, stats=True).get("stats", {}).get("samples", {})
                   .get("totalQueryableSamples", 0)) for expr in exprs)


# --- one size --------------------------------------------------------------------------------------

def measure(series: int, plan: Plan = FULL, log: Callable[[str], None] = lambda _: None) -> Row:
    """Serve about `series` samples, let Prometheus scrape them for both windows, stop the
    scrapes and time `plan.evaluations` decisions at the last scrape."""
    from tests.support.prometheus import PrometheusServer, scrape_config

    tenants = tenants_for(series, plan.models, plan.routes)
    began = time.perf_counter()
    body = Body(render(tenants, plan.models, plan.routes))
    log(f"{series:,}: {tenants} tenants per (model, route), {body.samples:,} samples, "
        f"rendered in {time.perf_counter() - began:.0f} s")
    target = Target(body)
    stopped = False
    config = scrape_config(target.address, job="ttft-exporter", interval=plan.interval)
    # at 1M series a query among 8 at once on 2 cores can outlast the default 2 minutes
    with PrometheusServer(config, extra_flags=["--query.timeout=10m"]) as prom:
        try:
            deadline = time.monotonic() + plan.interval * (plan.scrapes + 6) + 60
            while len(target.served) < plan.scrapes:
                if time.monotonic() > deadline or not prom.running():
                    raise RuntimeError(f"only {len(target.served)} scrapes served:\n{prom.log}")
                time.sleep(0.2)
            # the next scrape would grow the head; stop here and wait until the last one is
            # stored (its `up` is there) so nothing but the queries runs in Prometheus
            target.stop()
            stopped = True
            at = target.served[-1]
            prom.wait_for(f'up{{job="ttft-exporter"}} == 1 and timestamp(up) >= {at - 1:.3f}',
                          timeout=plan.interval * 3 + 30)
            # the failed scrape after the stop marks the series stale after `at`
            prom.wait_for('up{job="ttft-exporter"} == 0', timeout=plan.interval * 3 + 30)
            time.sleep(1)
            log(f"{series:,}: {len(target.served)} scrapes over "
                f"{target.served[-1] - target.served[0]:.0f} s")
            al = AlertingConfig(tenant_window_seconds=plan.window,
                                tenant_baseline_offset_seconds=plan.offset)
            req = Request(at=at, since=al.tenant_window_seconds, baseline=al.tenant_window_seconds,
                          baseline_at=at - al.tenant_baseline_offset_seconds)
            recording = _Recording(prom.url, timeout=600)
            diagnose(recording, req, alerting=al)  # warm-up, and what it asks
            exprs = [expr for expr, _ in recording.asked]
            client = Prometheus(prom.url, timeout=600)
            before = self_metrics(prom.url)
            wall = []
            for _ in range(plan.evaluations):
                start = time.perf_counter()
                diagnose(client, req, alerting=al)
                wall.append(time.perf_counter() - start)
            after = self_metrics(prom.url)
            read = series_read(prom.url, exprs, at)
            samples = samples_read(prom.url, exprs, at)
        finally:
            if not stopped:
                target.stop()
    row = Row(target=series, head_series=int(before["head"]), series_read=read,
              samples_read=samples, queries=len(exprs),
              rows_returned=sum(rows for _, rows in recording.asked), wall=wall,
              engine=(after["engine"] - before["engine"]) / plan.evaluations,
              cpu=(after["cpu"] - before["cpu"]) / plan.evaluations)
    log(f"{series:,}: {row}")
    return row


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
        f"One evaluation of the decision is one `diagnose()` call ({queries} instant queries: "
        f"{2 * (len(SIGNALS) + len(LOGGED)) + 2} signal, bucket and upstream queries over both "
        f"windows, 8 at a time, and the histogram-mode check), here with the alerting window "
        f"{plan.window:g} s and the baseline {plan.offset:g} s earlier, against a real "
        f"Prometheus {_prometheus_version()} that scraped the exporter's families every "
        f"{plan.interval:g} s ({plan.models} models × {plan.routes} routes × the tenants, "
        f"rendered by the exporter; the counters grow at a steady rate). The scrapes stop "
        f"before the {plan.evaluations} timed evaluations, so Prometheus' CPU is the queries' "
        f"alone. The query engine's seconds add up the queries running side by side (8 on 2 "
        f"cores), so they exceed the wall time; CPU seconds are the cost.", "",
        f"Measured {time.strftime('%Y-%m-%d')}; {machine()[0][2:]} (nproc "
        f"{os.cpu_count()}), shared with other work while it ran. Reproduce: "
        f"`python -m bench --only bench.cause_cost` (`make bench` runs every section).", "",
        "| head series | series the decision reads | samples it reads | seconds per evaluation "
        "(median; min, max) | Prometheus query engine s per evaluation | Prometheus CPU s per "
        "evaluation | CPU µs per series read |",
        "| ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.head_series:,} | {r.series_read:,} | {r.samples_read:,} | "
                     f"{r.wall_median:.3f} ({min(r.wall):.3f}, {max(r.wall):.3f}) | "
                     f"{r.engine:.3f} | {r.cpu:.3f} | {r.cpu / r.series_read * 1e6:.1f} |")
    cpu = [r.cpu for r in rows]
    a, b = fit([r.head_series for r in rows], cpu)
    sa, sb = fit([r.series_read for r in rows], cpu)
    wa, wb = fit([r.head_series for r in rows], [r.wall_median for r in rows])
    small, large = rows[0], rows[-1]
    ratio = (large.cpu / large.series_read) / (small.cpu / small.series_read)
    exponent = math.log(large.cpu / small.cpu) / math.log(large.series_read / small.series_read)
    lines += ["", f"Formula (least squares over the {len(rows)} sizes; N = head series, "
              f"S = series the decision reads, {small.series_read / small.head_series:.0%} to "
              f"{large.series_read / large.head_series:.0%} of N here):", "",
              f"- Prometheus CPU per evaluation ≈ {a:.3f} s + {b * 1e6:.2f} µs × N "
              f"= {sa:.3f} s + {sb * 1e6:.2f} µs × S",
              f"- wall time per evaluation ≈ {wa:.3f} s + {wb * 1e6:.2f} µs × N", "",
              f"Growth: CPU per series read at {large.head_series:,} head series is "
              f"{ratio:.2f}× that at {small.head_series:,} (CPU ∝ S^{exponent:.2f}): "
              + ("at most linear." if ratio <= 1.1 else "MORE than linear."),
              "", f"The cost is per evaluation: `ttft-exporter watch` pays it once per "
              f"evaluation interval. Samples per series scale it too: each window held "
              f"{plan.window / plan.interval:g} scrapes here; the default window (300 s) at a "
              f"15 s scrape holds 20, which adds the samples' decoding on top (the samples "
              f"column)."]
    return lines


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
    ~15 minutes (tests/test_bench_smoke.py measures a tiny size)."""
    if quick:
        return ["(not run with --quick: the three sizes take ~15 minutes; "
                "tests/test_bench_smoke.py measures 2,000 series)"]
    import sys

    rows = [measure(n, FULL, lambda s: print(f"bench.cause_cost: {s}", file=sys.stderr,
                                              flush=True)) for n in SCALES]
    return section(rows, FULL)


if __name__ == "__main__":
    print("\n".join(run()))
