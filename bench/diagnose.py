"""`ttft-exporter diagnose` on the demo's incident day: how long a run takes against a real
Prometheus, and which cause it names for each incident's target (a confusion table).

The day is the one tests/test_incident_day.py plays (20 s calm, 15 s per incident, answers a
third as long, the neighbour's freezes 3 s of every 3.5); each incident is diagnosed over its
last 11 s against the calm start (`--at`, `--baseline-at`, `--min-calls 3`), in-process (the
command's own code, without the interpreter's start-up).

    python -m bench.diagnose        # prints the markdown lines
"""

from __future__ import annotations

import time
from statistics import median

from exporter._internal import config_loader, runtime
from exporter._internal.causes import CAUSES, DEFAULT, Finding
from exporter._internal.demo.incidents import IncidentDay
from exporter._internal.demo.latency import LatencyModel
from exporter._internal.diagnose import Prometheus, Request, diagnose

CALM, PHASE, SKIP, RUNS = 20.0, 15.0, 4.0, 5
SCRAPE = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: ttft-exporter
    static_configs:
      - targets: ["{target}"]
"""


def on_target(incident: str, f: Finding) -> bool:
    """The (model, route) findings an incident's cause belongs to."""
    return {"prefill_surge": f.route == "search", "cold_cache": "tenant-01" in f.tenants,
            "noisy_neighbour": f.model == "llama-3-8b",
            "route_change": f.model == "deepseek-r1"}[incident]


def run(quick: bool = False) -> list[str]:
    """The markdown lines; `quick` (the suite's smoke run) skips it: the day takes 85 s."""
    if quick:
        return ["(not run with --quick: it plays the 85 s incident day)"]
    from tests.support.demo_load import DemoLoad
    from tests.support.prometheus import PrometheusServer

    runtime.configure(config_loader.load({}))
    with DemoLoad(rate=10.0, far_region=True, model=LatencyModel.default().shorter(0.3)) as demo:
        with PrometheusServer(SCRAPE.format(target=demo.target)) as prom:
            prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
            demo.knobs.freeze_seconds, demo.knobs.freeze_every_seconds = 3.0, 3.5
            day = IncidentDay(demo.knobs, CALM, PHASE, out=lambda _: None, recover_seconds=5)
            start = time.time()
            demo.play(day).result(timeout=day.seconds + 60)
            demo.stop_load()
            client = Prometheus(prom.url)
            thresholds = DEFAULT.__class__(**{**DEFAULT.__dict__, "min_calls": 3})
            seconds: list[float] = []
            rows = []
            for phase in day.phases:
                if phase.incident is None:
                    continue
                req = Request(at=start + phase.start + phase.seconds, since=PHASE - SKIP,
                              baseline=CALM - SKIP, baseline_at=start + CALM)
                for _ in range(RUNS):
                    began = time.perf_counter()
                    findings = diagnose(client, req, thresholds)
                    seconds.append(time.perf_counter() - began)
                target = [f for f in findings if on_target(phase.incident, f)]
                other = [f for f in findings if not on_target(phase.incident, f)]
                rows.append((phase.incident, target, other))
    runtime.configure(None)
    lines = [f"A diagnose run (19 instant queries in up to 8 threads, then the decision): median "
             f"{median(seconds) * 1000:.0f} ms, max {max(seconds) * 1000:.0f} ms over "
             f"{len(seconds)} runs against the incident day's Prometheus.", "",
             "Findings per incident: on its target (the cause named for each target (model, "
             "route)), and elsewhere.", "",
             "| incident | " + " | ".join(CAUSES) + " | elsewhere |",
             "| --- |" + " --- |" * (len(CAUSES) + 1)]
    for incident, target, other in rows:
        counts = [sum(f.cause == cause for f in target) for cause in CAUSES]
        elsewhere = ", ".join(f"{f.model}/{f.route}: {f.cause}" for f in other) or "-"
        lines.append(f"| {incident} | " + " | ".join(map(str, counts)) + f" | {elsewhere} |")
    return lines + ["", "Off target, `unknown` is a starved client (one process runs the load, "
                    "the provider and the exporter on a loaded 2-core machine); `prefill_surge` "
                    "off the surge route is a mean over ~5-8 calls of heavy-tailed prompt "
                    "sizes, or surge calls still ending after the phase (docs/diagnose.md, "
                    "\"Known blind spots\")."]


if __name__ == "__main__":
    print("\n".join(run()))
