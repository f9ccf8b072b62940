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
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from exporter._internal.generate.check import metric_names  # noqa: F401 (for the tests)
from tests.support import skip_or_fail

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"

_LISTENING = re.compile(r'msg="Listening on".*?address=(\S+)')


def scrape_config(*targets: str, job: str = "ttft-exporter") -> str:
    """A Prometheus config scraping `targets` (host:port) every second, rules evaluated every
    second: the tests' compressed time."""
    listed = ", ".join(f'"{t}"' for t in targets)
    return ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: {job}\n"
            f"    static_configs:\n      - targets: [{listed}]\n")


def require_prometheus() -> None:
    """Skip the calling test when prometheus/promtool are missing; fail instead on CI.

    CI (`CI=true`) must never silently skip the tests that prove queries and rules.
    """
    missing = [b for b in (PROMETHEUS, PROMTOOL) if shutil.which(b) is None]
    if not missing:
        return
    skip_or_fail(f"{' and '.join(missing)} not on PATH; install the Debian package "
                 f"`prometheus` (make prometheus)")


class PrometheusError(RuntimeError):
    """Prometheus did not start, or its API answered with an error status."""


class PrometheusServer:
    """A `prometheus` process with its own temporary config and TSDB; stop it with `stop()`.

    `rule_files` are appended to the config as a `rule_files:` list (absolute paths), so the given
    config must not have one. The process log (stderr) is kept in `log` for failure messages.

    It runs at `niceness` 10: deployed, Prometheus has machines of its own, and here its rule
    evaluations (every second, for the compressed windows: the cause rules alone took 1.5-2.3 s
    of a core per evaluation on the incident day) must not take the CPU from the process whose
    timings the tests measure (the demo's load, provider and exporter).
    """

    def __init__(self, config_yaml: str, *, rule_files: Iterable[Path] = (),
                 extra_flags: Iterable[str] = (), start_timeout: float = 30.0,
                 niceness: int = 10):
        self._dir = Path(tempfile.mkdtemp(prefix="ttft-prometheus-"))
        self._log_lines: list[str] = []
        self._port_found = threading.Event()
        self.url = ""
        config_path = self._dir / "prometheus.yml"
        rules = [Path(p) for p in rule_files]
        if rules:
            listed = "\n".join(f"  - {json.dumps(str(p.resolve()))}" for p in rules)
            config_yaml = f"{config_yaml.rstrip()}\nrule_files:\n{listed}\n"
        config_path.write_text(config_yaml, encoding="utf-8")
        self._proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config_path}",
             f"--storage.tsdb.path={self._dir / 'data'}",
             "--web.listen-address=127.0.0.1:0", *extra_flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, cwd=self._dir)
        os.setpriority(os.PRIO_PROCESS, self._proc.pid, niceness)
        # Drain stderr on a thread: a full pipe would block Prometheus, and the port is in there.
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self._wait_started(start_timeout)
        except BaseException:
            self.stop()
            raise

    # --- lifecycle ------------------------------------------------------------------------------

    def _read_log(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._log_lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not self._port_found.is_set():
                self.url = f"http://{match.group(1)}"
                self._port_found.set()

    @property
    def log(self) -> str:
        return "\n".join(self._log_lines)

    def _wait_started(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._port_found.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise PrometheusError(f"prometheus did not start listening:\n{self.log}")
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise PrometheusError(f"prometheus did not become ready:\n{self.log}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the process (kill after 10 s) and remove its temporary directory."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

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
            if self._proc.poll() is not None:
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
