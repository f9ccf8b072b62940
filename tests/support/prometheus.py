"""A real Prometheus server for tests, run as a plain child process on loopback.

Dashboards and rules are only proven when a real Prometheus evaluates them (no Grafana server
can be installed here), so tests start the `prometheus` binary, point it at a temporary config
and query its HTTP API. A new target is first scraped ~5-7 s after start: use `wait_for`, which
polls, never a fixed sleep.

    require_prometheus()
    with PrometheusServer(config_yaml, rule_files=[rules]) as prom:
        prom.wait_for('up{job="exporter"}', timeout=20)
        prom.query("sum(rate(llm_client_requests_total[1m]))")
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from exporter._internal.demo import prometheus
from exporter._internal.generate.check import metric_names  # noqa: F401 (for the tests)
from tests.support import skip_or_fail

PROMETHEUS = prometheus.PROMETHEUS
PROMTOOL = "promtool"
PrometheusError = prometheus.PrometheusError
scrape_config = prometheus.scrape_config


def require_prometheus() -> None:
    """Skip the calling test when prometheus/promtool are missing; fail instead on CI.

    CI (`CI=true`) must never silently skip the tests that prove queries and rules.
    """
    missing = [b for b in (PROMETHEUS, PROMTOOL) if shutil.which(b) is None]
    if not missing:
        return
    skip_or_fail(f"{' and '.join(missing)} not on PATH; install the Debian package "
                 f"`prometheus` (make prometheus)")


class PrometheusServer(prometheus.PrometheusProcess):
    """The demo's Prometheus process (exporter/_internal/demo/prometheus.py) with the HTTP API
    the tests query."""

    # --- API ------------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str] | None = None, timeout: float = 10.0
             ) -> Any:
        """GET an `/api/v1/...` endpoint and return its `data`; raise on an error status."""
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:  # 400/422 carry a JSON error body
            try:
                body = json.load(e)
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {e.code}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None, timeout: float = 10.0
              ) -> list[dict[str, Any]]:
        """Instant query (now, or at Unix time `at`); the result vector (or a one-element list
        for a scalar/string)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params, timeout)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float,
                    timeout: float = 10.0) -> list[dict[str, Any]]:
        """Range query (Unix times, step in seconds): a matrix, one entry per series."""
        return self._get("/api/v1/query_range", {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
            timeout)["result"]

    def wait_for(self, expr: str, timeout: float = 30.0,
                 predicate: Callable[[list[dict[str, Any]]], bool] = bool,
                 interval: float = 0.25) -> list[dict[str, Any]]:
        """Poll `expr` until `predicate(result)` holds (default: non-empty); return the result."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expr!r} did not satisfy the predicate within {timeout} s; "
                                   f"last result: {result!r}")
            if not self.running():
                raise PrometheusError(f"prometheus exited:\n{self.log}")
            time.sleep(interval)

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) from `/api/v1/alerts`."""
        return self._get("/api/v1/alerts")["alerts"]

    def rules(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Rule groups with their rules' health and last error, from `/api/v1/rules`."""
        return self._get("/api/v1/rules", timeout=timeout)["groups"]

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with health and last error, from `/api/v1/targets`."""
        return self._get("/api/v1/targets")["activeTargets"]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values of `label` (optionally among the series `match` selects), like Grafana's
        `label_values(match, label)` variable query."""
        params = {"match[]": match} if match else None
        return self._get(f"/api/v1/label/{label}/values", params)


# --- PromQL helpers for tests -------------------------------------------------------------------


def grafana_expr(expr: str, rate_interval: str = "10s", time_range: str = "1m",
                 interval: str = "5s") -> str:
    """A panel query as Grafana sends it with every template variable set to All."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__range", time_range)
            .replace("$__interval", interval)
            .replace("$model", ".*").replace("$route", ".*").replace("$tenant", ".*")
            .replace("$job", ".*").replace("$task", ".*"))
