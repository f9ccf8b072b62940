"""The demo's incident day, compressed for the suite and the benchmark: played once under a
real Prometheus (1 s scrapes, the generated rules loaded), then read from it.

    with played_day(cfg, rule_files) as day:   # ~2 minutes: the day itself
        day.prom, day.start, day.end, day.schedule, day.log

tests/test_incident_day.py holds every panel, rule, diagnose and LLMTTFTLikelyCause to it;
bench/diagnose.py measures diagnose on it. docs/decisions.md says why each number is what it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.demo.incidents import IncidentDay
from exporter._internal.demo.latency import LatencyModel
from exporter._internal.demo.loadgen import MODELS, LoadShape
from exporter._internal.evidence.thresholds import UNKNOWN
from tests.support.calm_run import free_port
from tests.support.demo_load import DemoLoad
from tests.support.prometheus import PrometheusServer, scrape_config

CALM, PHASE, AFTER = 50.0, 25.0, 5.0
SCALE = 1 / 120
#: The rules' window: the tenant alerts' and the watch's decision's (20 s: ~22 calls per (model,
#: route); the decision's standard-error gate assumes a window's mean is near normal, and over
#: ~12-16 calls a heavy-tailed route's is not: 16 s windows named a cause in 1-3 of ~50 calm
#: window pairs, 26 s ones in none).
WINDOW = 20.0
CONFIG = {
    # The cold-cache incident shows on one tenant's cached share only with tenant on tokens.
    "labels": {"tenant_families": [names.INPUT_TOKENS.name, names.CACHED_INPUT_TOKENS.name]},
    "alerting": {"window_scale": SCALE,
                 "tenant_window_seconds": WINDOW / SCALE,  # enough calls per tenant
                 # One phase back: the rules compare an incident with the phase before it, on
                 # a real day the hour before (the incidents here are back to back).
                 "tenant_baseline_offset_seconds": PHASE / SCALE,
                 "regression_offset_seconds": 4800,  # 40 s: "last week" is before the change
                 "min_calls": 5},
}


@dataclass(frozen=True)
class PlayedDay:
    prom: PrometheusServer
    schedule: IncidentDay
    start: float  # unix seconds
    end: float
    log: list[str]  # what the day printed


@contextlib.contextmanager
def watch_process(cfg: Config, prometheus_url: str, port: int) -> Iterator[str]:
    """`ttft-exporter watch` deciding every second on `port`, a process of its own as users
    run it (in the demo's process its decisions, ~40 queries' JSON a second, took the GIL
    from the load whose timings the day measures); its /metrics URL while the block runs."""
    with tempfile.TemporaryDirectory(prefix="ttft-watch-") as directory:
        config = Path(directory) / "watch.yaml"
        alerting = {k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(cfg.alerting).items()}
        config.write_text(yaml.safe_dump({"alerting": alerting}), encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "watch", "--prometheus", prometheus_url,
             "--config", str(config), "--port", str(port), "--interval", "1s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            announced = proc.stdout.readline()
            if not announced.startswith("ttft-exporter watch serving"):
                proc.kill()
                raise RuntimeError(f"the watch did not start: {announced}{proc.stderr.read()}")
            yield announced.split()[3].rstrip(",")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def compressed_demo(cfg: Config, rule_files: Iterable[Path] = (), agents: bool = False
                    ) -> Iterator[tuple[DemoLoad, PrometheusServer]]:
    """The demo's load and exporter under the compressed day's knobs, scraped every second by
    a Prometheus with `rule_files`, which scrapes a `ttft-exporter watch` deciding every second
    too (`cfg` is the runtime's, configured by the caller); with `agents`, the demo's agent
    tasks too."""
    # Answers a third as long: the SDKs' per-chunk parsing is what costs CPU on a shared box.
    # The calls spread evenly over the models: deepseek-r1's share of the demo's mix leaves
    # its routes a handful of calls per compressed window.
    shape = LoadShape(rate=10.0, models=tuple((model, 1.0) for model in MODELS))
    with DemoLoad(far_region=True, model=LatencyModel.default().shorter(0.3),
                  shape=shape, agents=agents) as demo:
        port = free_port()
        scrape = scrape_config(demo.target, job=cfg.alerting.exporter_job,
                               watch=f"127.0.0.1:{port}")
        with PrometheusServer(scrape, rule_files=rule_files) as prom, \
                watch_process(cfg, prom.url, port):
            prom.wait_for(f'up{{job="{cfg.alerting.exporter_job}"}} == 1', timeout=30)
            # The neighbour's freezes compressed too: 3.5 s out of every 3.75. The answers are
            # short, and a stream stalls only when a freeze starts while it runs: most streams
            # outlast the quarter second between two freezes. A call that arrives in a
            # freeze's first 1.5 s waits past the 2 s TTFT objective: 40 % of the calls, so the
            # 30 s long window of the fast burn holds more than 14.4 % from 11 s in.
            demo.knobs.freeze_seconds, demo.knobs.freeze_every_seconds = 3.5, 3.75
            # Prompts 8x, not 4x: the provider caches each tenant's last prompt, so only the
            # growth past it is prefilled, and a compressed window holds a dozen calls a route.
            demo.knobs.surge_factor = 8.0
            yield demo, prom


@contextlib.contextmanager
def played_day(cfg: Config, rule_files: Iterable[Path] = ()) -> Iterator[PlayedDay]:
    """Play the day (`cfg` is the runtime's, configured by the caller); the load is stopped
    when the block starts, Prometheus and the exporter serve until it ends."""
    with compressed_demo(cfg, rule_files) as (demo, prom):
        log: list[str] = []
        schedule = IncidentDay(demo.knobs, CALM, PHASE, out=log.append, recover_seconds=AFTER)
        start = time.time()
        demo.play(schedule).result(timeout=schedule.seconds + 60)
        end = time.time()
        demo.stop_load()  # the day is over: the readers read what Prometheus recorded
        yield PlayedDay(prom, schedule, start, end, log)


# --- judging a finding on the day ------------------------------------------------------------

#: Seconds skipped at a phase's start: calls started before it end in its first seconds.
SKIP = 4.0
#: Calls a (model, route) needs in each window: each gets ~1.1 calls/s, ~23 in a 21 s incident
#: window and fewer while a tenant idles. The decision's standard-error gate, not this
#: minimum, keeps a few calls' noise from reading as a rise.
MIN_CALLS = 5

#: How long after its phase an incident may still be named: its last calls end (a surged
#: prompt on deepseek-r1 takes seconds), the rules' windows follow and their chain (signals,
#: decision, alert: a few evaluations of 1 s, more on a loaded machine), and a cold tenant's
#: caches rewarm.
TAIL = 2 * WINDOW + 5
#: Seconds past a window after the day before its alerts are read: the rules' last
#: evaluations recorded.
SETTLE = 3.0

#: Each incident's target: the findings that may name its cause (and its tenants).
TARGETS = {
    "prefill_surge": lambda f: f["route"] == "search",
    "cold_cache": lambda f: f["tenants"] == ["tenant-01"],
    "noisy_neighbour": lambda f: f["model"] == "llama-3-8b" and f["tenants"] == [],
    "route_change": lambda f: f["model"] == "deepseek-r1" and f["tenants"] == [],
}


def live(schedule: IncidentDay, start: float, end: float) -> list[str]:
    """The incidents whose phase, or its TAIL, overlaps [start, end] (seconds into the day)."""
    return [p.incident for p in schedule.phases
            if p.incident and p.start <= end and start <= p.start + p.seconds + TAIL]


def acceptable(f: dict[str, Any], incidents: list[str]) -> bool:
    """A named cause is right only as the cause of a live incident, on its target.
    `unknown` (a rise that fits no cause: the decision names nothing) is accepted while an
    incident is live, anywhere: one process runs the load, the provider and the
    exporter on a shared machine, and an incident moves more than its target (a cold tenant's
    caches rewarm after its phase, on every model). In the calm, nothing is accepted."""
    if f["cause"] == UNKNOWN:
        return bool(incidents)
    return any(TARGETS[i](f) and f["cause"] == i for i in incidents)


def alert_findings(prom: PrometheusServer, start: float, end: float
                   ) -> Iterator[tuple[float, dict[str, Any]]]:
    """(seconds into the day, finding as diagnose prints it) for every second LLMTTFTLikelyCause
    fired, from when the rules compare the calm with itself (a window and the offset in) to a
    window after the day's `end` (unix seconds), waited for: the watch still judges the day's
    last seconds then (the load stops with the day, Prometheus and the watch do not), and its
    findings reach the alert seconds after its windows (an evaluation, a scrape, the rule's
    evaluation and its `for`), so an incident at the day's end is named after it."""
    until = end + WINDOW
    time.sleep(max(0.0, until + SETTLE - time.time()))
    for series in prom.query_range(
            'ALERTS{alertname="LLMTTFTLikelyCause", alertstate="firing"}',
            start + WINDOW + PHASE, until, 1.0):
        m = series["metric"]
        f = {"model": m["model"], "route": m["route"], "cause": m["cause"],
             "tenants": [m["tenant"]] if "tenant" in m else []}
        for at, _ in series["values"]:
            yield float(at) - start, f
