"""`ttft-exporter watch`: the decision of `diagnose`, run every interval and served as a metric
for the `LLMTTFTLikelyCause` alert.

The alert and `diagnose` must never name different causes. A PromQL copy of the decision did
drift from the Python one (one expression of 7,104 characters, kept in step by tests) and cost
Prometheus 0.5-2.3 s of a core per evaluation. Here the decision exists once: this process runs
`diagnose.run.diagnose` over `alerting.tenant_window_seconds` against the same window
`alerting.tenant_baseline_offset_seconds` earlier (the windows the alert's text names), and
serves one `llm_ttft_likely_cause{model,route,cause,tenant} 1` per finding (per cold tenant
for a cold cache). Prometheus scrapes it like any target; the alert only selects the series.

An evaluation that fails (Prometheus unreachable, a query error) clears the findings rather
than serve stale ones as current, and is counted by outcome; `up` and the evaluations counter
tell on-call the watch itself is blind.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from aiohttp import web

from ..config.settings import AlertingConfig
from ..expose import self_metrics
from ..expose.connection_guard import Limits
from ..expose.families import render_family
from ..expose.http_thread import HttpThread
from ..expose.self_metrics import family
from ..promql import scope_matchers
from .causes import Finding
from ..evidence.thresholds import DEFAULT, Thresholds
from .run import DiagnoseError, Prometheus, Request, diagnose

#: Evaluation outcomes, the label of `self_metrics.WATCH_EVALUATIONS`.
OUTCOMES = ("ok", "error")


@dataclass(frozen=True)
class Windows:
    """The decision's windows under a config: `since` seconds now against the same length
    ending `offset` seconds earlier, over the rules' scope (job and `alerting.selector`)."""

    since: float
    offset: float
    matchers: tuple[str, ...]
    thresholds: Thresholds

    @classmethod
    def of(cls, al: AlertingConfig) -> "Windows":
        scale = al.window_scale
        return cls(al.tenant_window_seconds * scale, al.tenant_baseline_offset_seconds * scale,
                   tuple(scope_matchers(al)), replace(DEFAULT, min_calls=al.min_calls))

    def request(self, at: float) -> Request:
        return Request(at=at, since=self.since, baseline=self.since,
                       baseline_at=at - self.offset, matchers=self.matchers)


class Watch:
    """The latest findings and the watch's own counts; `evaluate` runs one decision and swaps
    them in, `render` reads them (under one lock: a scrape sees one evaluation whole)."""

    def __init__(self, prom: Prometheus | None, windows: Windows,
                 clock: Callable[[], float] = time.time):
        """`prom` None: no decision yet (set it before `evaluate`; the demo starts the watch
        before the Prometheus that scrapes it)."""
        self.prom = prom
        self.windows = windows
        self.clock = clock
        self._lock = threading.Lock()
        self._findings: list[Finding] = []
        self._evaluations = dict.fromkeys(OUTCOMES, 0)
        self._seconds = 0.0
        self._last_success = 0.0
        self.last_error = ""

    def evaluate(self) -> bool:
        """One decision at the clock's now; False (findings cleared, error kept) on failure."""
        assert self.prom is not None, "no Prometheus to read"
        started = time.monotonic()
        at = self.clock()
        try:
            findings = diagnose(self.prom, self.windows.request(at), self.windows.thresholds)
            error = ""
        except DiagnoseError as e:
            findings, error = [], str(e)
        except Exception as e:  # a bug must not end the watch: counted, said, tried again
            findings, error = [], f"{type(e).__name__}: {e}"
            print(f"ttft-exporter watch: the decision failed: {error}", file=sys.stderr,
                  flush=True)
        seconds = time.monotonic() - started
        with self._lock:
            self._findings = findings
            self._evaluations["error" if error else "ok"] += 1
            self._seconds = seconds
            if not error:
                self._last_success = at
            self.last_error = error
        return not error

    def render(self) -> str:
        """The text exposition (version 0.0.4) of the findings and the watch's counts."""
        with self._lock:
            findings = list(self._findings)
            evaluations = dict(self._evaluations)
            seconds, last_success = self._seconds, self._last_success
        return "".join(render_family(metric, openmetrics=False) for metric in (
            family(self_metrics.LIKELY_CAUSE, {(f.cause, f.model, f.route, tenant): 1.0
                                               for f in findings for tenant in f.tenants or [""]}),
            family(self_metrics.WATCH_EVALUATIONS, {(o,): n for o, n in evaluations.items()}),
            family(self_metrics.WATCH_SECONDS, seconds),
            family(self_metrics.WATCH_LAST_SUCCESS, last_success)))

    def run(self, interval: float, stop: threading.Event) -> None:
        """Evaluate every `interval` seconds until `stop` is set (the first one at once)."""
        while not stop.is_set():
            started = time.monotonic()
            self.evaluate()
            stop.wait(max(0.0, interval - (time.monotonic() - started)))


def create_app(watch: Watch) -> web.Application:
    """`/metrics` (the findings) and `/healthz`."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=watch.render().encode(), headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


class WatchService:
    """The watch served over HTTP on its own thread, and deciding on another once it has a
    Prometheus: what `ttft-exporter watch`, the demo and the tests run."""

    def __init__(self, watch: Watch, addr: str, port: int, limits: Limits = Limits()):
        self.watch = watch
        self.server = HttpThread(create_app(watch), addr, port, name="ttft-exporter-watch-http",
                                 limits=limits)
        self._stop = threading.Event()
        self._deciding: threading.Thread | None = None

    @property
    def target(self) -> str:
        """host:port, for a scrape config."""
        return self.server.base_url.split("://", 1)[1]

    def start(self, interval: float) -> "WatchService":
        """Serve now; decide every `interval` seconds once `decide` has a Prometheus (at once
        when the watch has one)."""
        self.interval = interval
        self.server.start()
        if self.watch.prom is not None:
            self.decide(self.watch.prom)
        return self

    def decide(self, prom: Prometheus) -> None:
        self.watch.prom = prom
        self._deciding = threading.Thread(target=self.watch.run, args=(self.interval, self._stop),
                                          daemon=True, name="ttft-exporter-watch-decision")
        self._deciding.start()

    def stop(self) -> None:
        self._stop.set()
        if self._deciding is not None:
            self._deciding.join(timeout=30)
        self.server.stop()
