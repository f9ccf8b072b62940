"""Issue #5 figures: aggregator CPU for 64 pushing workers, push payload bytes per series.

The workers are simulated in-process: 64 recorders fed calls with the demo's label cardinality
(3 models × 3 routes × 20 Zipf-popular tenants × 2 providers, the label sets of docs/metrics.md) and the
demo's shapes (reasoning model, token streams, phases), each drained and encoded as its flusher
would. The aggregator is the real one (`create_app` + `Aggregator`) on a loopback port; the CPU
it spends is read from its server thread's own CPU clock while the 64 bodies of one 5-second
interval are POSTed to it, so the figure covers HTTP parsing, the handler, validation and the
exact merge, and excludes the client.
"""

from __future__ import annotations

import gc
import http.client
import random
import sys
import time

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.demo.loadgen import ANTHROPIC_SHARE, MODELS, ROUTES, TENANTS
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator, tune_gc
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

from .harness import Stat

PUSH_INTERVAL = 5.0
MS = 1_000_000  # ns


def demo_call(rng: random.Random, weights: list[float]) -> CallTimeline:
    """One call shaped like the demo's: label mix, phases, a token stream."""
    model = rng.choices(tuple(MODELS), tuple(MODELS.values()))[0]
    route = rng.choice(tuple(ROUTES))
    tenant = rng.choices(TENANTS, weights)[0]
    provider = "anthropic" if rng.random() < ANTHROPIC_SHARE else "openai"
    t = CallTimeline(start=0, model=model, provider=provider, route=route, tenant=tenant)
    t.dispatched = t.connected = int(rng.uniform(0.01, 0.5) * MS)
    t.sent = t.connected + int(rng.uniform(0.05, 0.5) * MS)
    t.headers = t.sent + int(rng.lognormvariate(3.5, 0.5) * MS)
    now = t.headers + int(ROUTES[route] / 20 * rng.lognormvariate(0, 0.3) * MS)
    if model == "deepseek-r1":
        for _ in range(rng.randint(20, 60)):
            t.token(now, names.REASONING)
            now += int(rng.lognormvariate(3, 0.3) * MS)
    for _ in range(rng.randint(20, 120)):
        t.token(now)
        now += int(rng.lognormvariate(3, 0.4) * MS)
    t.end = now + MS
    t.outcome = names.OK if rng.random() > 0.02 else names.ERROR
    t.input_tokens = int(ROUTES[route] * rng.lognormvariate(0, 0.5))
    t.output_tokens = len(t.token_times)
    t.cached_input_tokens = t.input_tokens // 2 if rng.random() < 0.6 else 0
    return t


def worker_deltas(workers: int, calls_per_push: int, seed: int) -> list[wire.Delta]:
    """One push interval's delta from each simulated worker."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) for k in range(len(TENANTS))]
    out = []
    for w in range(workers):
        rec = Recorder()
        for _ in range(calls_per_push):
            rec.record_call(demo_call(rng, weights))
        for _ in range(rng.randint(0, 3)):
            rec.started(rng.choice(tuple(MODELS)), "openai", rng.choice(tuple(ROUTES)))
        delta = take(rec)
        delta.worker, delta.interval = f"bench-{seed}-{w}", PUSH_INTERVAL
        out.append(delta)
    return out


def encoded(deltas: list[wire.Delta], seq: int, layouts) -> list[bytes]:
    bodies = []
    for delta in deltas:
        delta.seq = seq
        bodies.append(wire.encode(delta, layouts))
    return bodies


def aggregator_cpu(workers: int, calls_per_push: int, rounds: int
                   ) -> tuple[Stat, Stat, int, int, float, int]:
    """Server-thread CPU seconds per wall second at 64 workers/5 s; bytes per series; scrape."""
    config = Config()
    target = Recorder(config)
    agg = Aggregator(config, target)
    renderer = Renderer(target, agg.families)
    thresholds = gc.get_threshold()
    tune_gc()  # as `ttft-exporter serve` does
    server = ExporterServer(create_app(lambda: renderer, agg), "127.0.0.1", 0).start()
    clock = time.pthread_getcpuclockid(server._thread.ident)  # type: ignore[arg-type]
    layouts = target.schema.layouts()
    shares, per_push_ms = [], []
    body_bytes = series = 0
    conn = None
    try:
        for r in range(rounds):
            deltas = worker_deltas(workers, calls_per_push, seed=r)
            series = sum(len(d.histograms) for d in deltas)
            bodies = encoded(deltas, 1, layouts)
            body_bytes = sum(len(b) for b in bodies)
            # A connection per round: on a busy machine making the deltas can outlast the
            # server's keep-alive header timeout, which closes an idle connection.
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            start = time.clock_gettime(clock)
            for body in bodies:
                conn.request("POST", wire.PUSH_PATH, body=body,
                             headers={"Content-Type": wire.CONTENT_TYPE})
                response = conn.getresponse()
                response.read()
                assert response.status == 200, response.status
            cpu = time.clock_gettime(clock) - start
            shares.append(cpu / PUSH_INTERVAL * 100)
            per_push_ms.append(cpu / len(bodies) * 1000)
        started = time.perf_counter()
        renderer.render()
        scrape_ms = (time.perf_counter() - started) * 1000
    finally:
        if conn is not None:
            conn.close()
        server.stop()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    return Stat.of(shares), Stat.of(per_push_ms), body_bytes, series, scrape_ms, \
        target.series_count


def worker_cost(calls_per_push: int, runs: int) -> Stat:
    """The flusher's drain + encode per push (the worker's side of the bargain), ms."""
    rng = random.Random(99)
    weights = [1 / (k + 1) for k in range(len(TENANTS))]
    layouts = Recorder().schema.layouts()
    out = []
    for _ in range(runs):
        rec = Recorder()
        for _ in range(calls_per_push):
            rec.record_call(demo_call(rng, weights))
        started = time.perf_counter()
        delta = take(rec)
        delta.worker, delta.seq = "w", 1
        wire.encode(delta, layouts)
        out.append((time.perf_counter() - started) * 1000)
    return Stat.of(out)


def run(quick: bool) -> list[str]:
    workers = 8 if quick else 64
    rounds = 1 if quick else 5
    lines = ["| figure | measured (median of runs; min, max) | goal | status |",
             "| --- | --- | --- | --- |"]
    for label, calls in (("10 calls/s per worker", 50), ("100 calls/s per worker", 500)):
        share, per_push, body_bytes, series, scrape_ms, held = aggregator_cpu(
            workers, calls if not quick else calls // 10, rounds)
        goal = "< 5 % of one core" if calls == 50 else ""
        status = ("met" if share.median < 5 else "missed") if goal else ""
        if quick:
            status = "(quick: 8 workers)" if goal else ""
        lines.append(f"| aggregator CPU, {workers} workers pushing every 5 s, {label}, demo "
                     f"cardinality | {share.fmt('% of a core', 2)} | {goal} | {status} |")
        lines.append(f"| (aggregator CPU per push: HTTP, validation, exact merge; {label}) | "
                     f"{per_push.fmt('ms', 2)} | | |")
        lines.append(f"| push payload bytes per series ({label}; {series // workers} series "
                     f"per push) | {body_bytes / series:.0f} B | | |")
        lines.append(f"| aggregator's first scrape after the merges ({label}; {held:,} series, "
                     f"all new) | {scrape_ms:.1f} ms | | |")
    cost = worker_cost(50 if not quick else 5, 3 if quick else 7)
    lines.append(f"| worker flusher per push (drain + encode, 50 calls) | {cost.fmt('ms', 2)} | "
                 f"| off the app's threads |")
    return lines


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
