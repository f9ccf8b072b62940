"""Issue #5 figures: aggregator CPU for 64 pushing workers, push payload bytes per series; and
issue 31's: what each `aggregator.durability` costs a push.

The workers are simulated in-process: 64 recorders fed calls with the demo's label cardinality
(3 models × 3 routes × 20 Zipf-popular tenants × 2 providers, the label sets of docs/metrics.md) and the
demo's shapes (reasoning model, token streams, phases), each drained and encoded as its flusher
would. The aggregator is the real one (`create_app` + `Aggregator`) on a loopback port; the CPU
it spends is read from its server thread's own CPU clock while the 64 bodies of one 5-second
interval are POSTed to it, so the figure covers HTTP parsing, the handler, validation and the
exact merge, and excludes the client.

The durability figures time whole pushes (the client's POST to the 200) against the real
aggregator with no journal, `durability: process` and `durability: machine`, interleaved in
rounds in one run, one pusher at a time (each push pays its own fsync) and eight at once (they
share them). The journal is on the file system of the temporary directory.
"""

from __future__ import annotations

import gc
import http.client
import random
import socket
import sys
import tempfile
import threading
import time
from dataclasses import replace

from exporter._internal import names
from exporter._internal.config.settings import AggregatorConfig, Config
from exporter._internal.demo.loadgen import ANTHROPIC_SHARE, MODELS, ROUTES, TENANTS
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator, tune_gc
from exporter._internal.fleet.journal import StateFiles
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

from .harness import Stat, interleaved, ratios

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


DURABILITY = ("no journal", "process", "machine")


def durability_round(mode: str, bodies: list[list[bytes]], folder: str) -> tuple[float, int]:
    """Wall seconds for `bodies` (one list per concurrent pusher) POSTed to an aggregator
    with `mode`; and the fsyncs it made."""
    agg_config = AggregatorConfig() if mode == "no journal" else AggregatorConfig(
        snapshot_path=f"{folder}/state-{mode}-{time.monotonic_ns()}", durability=mode,
        snapshot_interval_seconds=3600)
    agg = Aggregator(replace(Config(), aggregator=agg_config))
    server = ExporterServer(create_app(lambda: Renderer(agg.recorder, agg.families), agg),
                            "127.0.0.1", 0).start()
    go = threading.Barrier(len(bodies) + 1)

    def pusher(mine: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as a worker's would
        go.wait()
        for body in mine:
            conn.request("POST", wire.PUSH_PATH, body=body,
                         headers={"Content-Type": wire.CONTENT_TYPE})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        conn.close()

    threads = [threading.Thread(target=pusher, args=(mine,)) for mine in bodies]
    try:
        for t in threads:
            t.start()
        go.wait()
        started = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
    finally:
        server.stop()
    return elapsed, agg.group_sync.syncs if agg.group_sync is not None else 0


def durability_cost(pushes: int, rounds: int) -> list[str]:
    """Wall µs per push (elapsed / pushes) and pushes per second of each durability, side by
    side."""
    layouts = Recorder().schema.layouts()
    delta = worker_deltas(1, 1, seed=7)[0]  # a small push: the journal's share is the largest
    lines = []
    with tempfile.TemporaryDirectory(prefix="ttft-bench-journal-") as folder:
        lines += journal_cost(folder, _encode_seq(delta, 1, layouts), pushes, rounds)
        for concurrency in (1, 8):
            per_push: dict[str, list[float]] = {mode: [] for mode in DURABILITY}
            syncs = 0
            for r in range(rounds):
                for mode in DURABILITY[r % 3:] + DURABILITY[:r % 3]:  # no first-place bias
                    bodies = []
                    for c in range(concurrency):
                        delta.worker = f"bench-{mode}-{r}-{c}"
                        bodies.append([_encode_seq(delta, seq, layouts)
                                       for seq in range(1, pushes // concurrency + 1)])
                    elapsed, made = durability_round(mode, bodies, folder)
                    n = sum(len(b) for b in bodies)
                    per_push[mode].append(elapsed / n * 1e6)
                    if mode == "machine":
                        syncs += made
            for mode in DURABILITY:
                stat = Stat.of(per_push[mode])
                note = "" if mode == "no journal" else \
                    f"{ratios(per_push[mode], per_push['no journal']).median:.2f}x no journal"
                if mode == "machine":
                    note += f"; {syncs / (rounds * pushes):.2f} fsyncs per push"
                lines.append(f"| push, durability `{mode}`, {concurrency} pusher"
                             f"{'s' if concurrency > 1 else ''} at once | "
                             f"{stat.fmt('µs per push', 0)}; "
                             f"{1e6 / stat.median:.0f} pushes/s | | {note} |")
    return lines


def journal_cost(folder: str, body: bytes, records: int, rounds: int) -> list[str]:
    """The journal alone: µs per append (`process`), per append + fdatasync (`machine`)."""
    files = StateFiles(f"{folder}/journal-only")
    list(files.replay())  # opens the journal for appends

    def appends(n: int) -> None:
        for _ in range(n):
            files.append(body)

    def synced(n: int) -> None:
        for _ in range(n):
            files.append(body)
            files.sync()

    try:
        times = interleaved({"process": appends, "machine": synced}, records, rounds)
    finally:
        files.close()
    append, sync = Stat.of(times["process"]), Stat.of(times["machine"])
    return [f"| journal append of a {len(body):,} B push (`process`) | "
            f"{Stat(append.median / 1e3, append.low / 1e3, append.high / 1e3).fmt('µs', 1)} "
            f"| | |",
            f"| journal append + fdatasync (`machine`) | "
            f"{Stat(sync.median / 1e3, sync.low / 1e3, sync.high / 1e3).fmt('µs', 0)} | | "
            f"{sync.median / append.median:.0f}x the append |"]


def _encode_seq(delta: wire.Delta, seq: int, layouts) -> bytes:
    delta.seq = seq
    return wire.encode(delta, layouts)


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
    lines += durability_cost(16 if quick else 400, 1 if quick else 6)
    return lines


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
