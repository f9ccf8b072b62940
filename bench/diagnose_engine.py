"""`diagnose` on a real engine: the scenarios of bench/engine/scenarios.py, each a mechanism on
llama.cpp's llama-server, driven by the real openai SDK through the in-process exporter, scraped
by a real Prometheus every second, named by `diagnose()` over the run's route.

    python -m bench.diagnose_engine                 (make diagnose-engine: the held-out runs)
    python -m bench.diagnose_engine --quick         (one run per scenario, a choosing seed)
    python -m bench.diagnose_engine --scenarios calm,cold_cache --seeds 101:104
    python -m bench.diagnose_engine --report FILE   (the matrix of runs recorded before)

Each run has its own route label (runs never mix in Prometheus), a fresh engine (and far
upstream or gateway), a fresh exporter and Prometheus (bench/diagnose_prometheus.py's: each
window bounded by the timestamps of the scrapes before its first call and after its last).
Seeds: CHOOSE for any parameter picked by looking (load, windows, sizes); HELD_OUT for the
reported matrix, never looked at before the parameters were fixed. Each run is one JSON line
in `--out` as it ends (a cut run keeps the ones done).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import exporter
from bench.diagnose_eval import seed_range
from bench.diagnose_prometheus import bounds, exporter as scraped_exporter, scraped, scrapes
from bench.engine import build, model, scenarios
from bench.engine.scenarios import SCENARIOS, World, drive, warm
from exporter._internal.evidence.thresholds import CAUSES, Thresholds
from exporter._internal.evidence.signals import SIGNALS_BY_KEY
from exporter._internal.diagnose.run import Prometheus, Request, diagnose
from exporter._internal.promql import CLASSIC, MODEL_ROUTE, duration, eq

#: Seconds of calls in each window, and the calls a route needs in each (RATE × WINDOW ≈ 36).
WINDOW = 12.0
THRESHOLDS = Thresholds(min_calls=20)
CHOOSE = range(1, 4)
HELD_OUT = range(101, 111)
#: Held-out runs per scenario: the four causes 10, each look-alike 3, calm 5.
RUNS = {"cause": 10, "look-alike": 3, "calm": 5}


def kind(name: str) -> str:
    return "calm" if name == "calm" else "cause" if SCENARIOS[name].cause else "look-alike"


#: What each window's calls were, beside the finding (a miss is explained with them).
MEASURED = ("ttft", "uncached_per_call", "stall", "phase")


def measured(prom: Prometheus, route: str, at: float, window: float) -> dict[str, float]:
    """The route's signals over one window, as diagnose reads them (means, per phase)."""
    out: dict[str, float] = {}
    for key in MEASURED:
        expr = SIGNALS_BY_KEY[key].expr(duration(window), [eq("route", route)], MODEL_ROUTE,
                                        mode=CLASSIC)
        for row in prom.query(expr, at):
            name = row["metric"].get("phase", key)
            out[name] = round(float(row["value"][1]), 4)
    return out


def run_one(engine: build.Engine, name: str, seed: int, window: float = WINDOW
            ) -> dict[str, Any]:
    """One scenario on a fresh engine, exporter and Prometheus, each window `window` seconds
    of calls: its record."""
    scenario = SCENARIOS[name]
    route = f"{name}-{seed}"
    started = time.monotonic()
    with scraped_exporter(("classic",)) as proms, ExitStack() as stack:
        prom = proms["classic"]
        world = World(engine, seed, stack)
        baseline, incident = scenario.setup(world)
        warm(world)
        b_first, b_last, b_counts = drive(baseline, route, engine.model, seed, window)
        scraped(proms, b_last)
        refused_before = world.gateway.refused if world.gateway else 0
        n_first, n_last, n_counts = drive(incident, route, engine.model, seed + 50_000,
                                          window)
        scraped(proms, n_last)
        stack.close()
        samples = scrapes(prom, time.time())
        base = bounds(samples, 0.0, b_first, b_last)
        now = bounds(samples, b_last, n_first, n_last)
        findings = diagnose(prom, Request(at=now[1] / 1000, since=(now[1] - now[0]) / 1000,
                                          baseline=(base[1] - base[0]) / 1000,
                                          baseline_at=base[1] / 1000, route=route), THRESHOLDS)
        signals = [measured(prom, route, end / 1000, (end - start) / 1000)
                   for start, end in (base, now)]
    found = findings[0] if findings else None
    cause = found.cause if found else None
    return {"scenario": name, "seed": seed, "route": route, "cause": cause,
            "right": cause in scenario.allowed, "tenants": found.tenants if found else [],
            "evidence": found.evidence if found else {}, "signals": signals,
            "calls": [b_counts.calls, n_counts.calls], "errors": [b_counts.errors, n_counts.errors],
            "refused_503": [refused_before, world.gateway.refused - refused_before]
            if world.gateway else None,
            "seconds": round(time.monotonic() - started, 1), "load": os.getloadavg()[0],
            "window": window}


def plan(names: list[str], seeds: range | None, quick: bool, runs: dict[str, int] = RUNS
         ) -> list[tuple[str, int]]:
    """(scenario, seed) in run order: seeds interleaved across scenarios, so a cut run still
    has every scenario."""
    if quick:
        return [(n, CHOOSE[0]) for n in names]
    per = {n: list(seeds) if seeds is not None else list(HELD_OUT[:runs[kind(n)]])
           for n in names}
    depth = max(len(s) for s in per.values())
    return [(n, per[n][i]) for i in range(depth) for n in names if i < len(per[n])]


def _name(cause: str | None) -> str:
    return cause or "nothing"


def matrix(records: list[dict[str, Any]]) -> list[str]:
    columns: list[str | None] = [None, *CAUSES, *(["error"] if any(
        r["cause"] == "error" for r in records) else [])]
    lines = ["| scenario | allowed | n | " + " | ".join(_name(c) for c in columns)
             + " | right | seconds a run | load average |",
             "| --- | --- | ---: |" + " ---: |" * len(columns) + " ---: | ---: | ---: |"]
    for name, scenario in SCENARIOS.items():
        rows = [r for r in records if r["scenario"] == name]
        if not rows:
            continue
        named = Counter(r["cause"] for r in rows)
        allowed = ", ".join(sorted(_name(c) for c in scenario.allowed))
        lines.append(f"| {name} | {allowed} | {len(rows)} | "
                     + " | ".join(str(named[c]) for c in columns)
                     + f" | {sum(r['right'] for r in rows)}/{len(rows)} | "
                     f"{sum(r['seconds'] for r in rows) / len(rows):.0f} | "
                     f"{statistics.median(r.get('load', 0) for r in rows):.1f} |")
    return lines


def header(engine: build.Engine) -> list[str]:
    shape = model.SHAPE
    return [f"Engine: llama.cpp `llama-server` {build.LLAMA_CPP_COMMIT} (llama-cpp-python "
            f"{build.SDIST_VERSION} sdist), builds `{build.fingerprint_of(build.PRIMARY_BUILD)}`"
            f" / `{build.fingerprint_of(build.ALTERNATE_BUILD)}`; model {engine.model.name}: "
            f"{shape.blocks} blocks, embedding {shape.embedding}, {shape.heads} heads, "
            f"feed-forward {shape.feed_forward}, random weights; `--parallel "
            f"{scenarios.ENGINE.parallel} --threads {scenarios.ENGINE.threads} --ctx-size "
            f"{scenarios.ENGINE.context}`. Load: {scenarios.TENANTS} tenants, "
            f"{scenarios.RATE:g} calls/s from {scenarios.THREADS} client threads, windows of "
            f"{WINDOW:g} s, min calls {THRESHOLDS.min_calls}; {os.cpu_count()} cores.", ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--seeds", type=seed_range, default=None,
                   help="a:b for every scenario (default: the held-out seeds, RUNS per kind)")
    p.add_argument("--quick", action="store_true", help=f"one run per scenario, seed {CHOOSE[0]}")
    p.add_argument("--runs", default=",".join(map(str, RUNS.values())),
                   help="held-out runs per cause, per look-alike, of calm (default 10,3,5)")
    p.add_argument("--window", type=float, default=WINDOW,
                   help=f"seconds of calls in each window (default {WINDOW:g})")
    p.add_argument("--out", type=Path, default=Path("build/diagnose-engine.jsonl"))
    p.add_argument("--report", type=Path, help="print the matrix of a recorded --out file")
    args = p.parse_args(argv)
    engine = build.installed()
    if engine is None:
        raise SystemExit("the engine is not built: make engine")
    if args.report:
        records = [json.loads(line) for line in args.report.read_text().splitlines() if line]
        print("\n".join(header(engine) + matrix(records)))
        return 0
    names = args.scenarios.split(",")
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"no such scenario: {', '.join(sorted(unknown))}")
    exporter.instrument()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    todo = plan(names, args.seeds, args.quick,
                dict(zip(RUNS, map(int, args.runs.split(",")))))
    for k, (name, seed) in enumerate(todo, 1):
        try:
            record = run_one(engine, name, seed, args.window)
        except Exception as e:  # a run that broke is reported, the others still run
            record = {"scenario": name, "seed": seed, "cause": "error", "right": False,
                      "error": repr(e), "seconds": 0, "calls": [], "errors": []}
        records.append(record)
        with args.out.open("a") as out:
            out.write(json.dumps(record) + "\n")
        print(f"[{k}/{len(todo)}] {name} seed {seed}: {_name(record['cause'])} "
              f"({'right' if record['right'] else 'WRONG'}) calls {record['calls']} errors "
              f"{record['errors']} in {record['seconds']:.0f} s", file=sys.stderr, flush=True)
    print("\n".join(header(engine) + matrix(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
