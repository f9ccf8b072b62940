"""The calm demo in the background of a test session, judged by a real Prometheus.

`CalmRun()` starts `ttft-exporter demo --no-incidents` in a child process, at a low rate so its
CPU stays small beside the rest of the suite, and a Prometheus that scrapes it and evaluates the
rules generated from the demo's own config (`DEMO_CONFIG`, real windows: what a user of
`make demo` gets). tests/conftest.py starts it as the session starts, when tests/test_calm_demo.py
is selected, and runs those tests last: by then the demo has run for minutes without making the
suite any longer.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exporter._internal.config import loader as config_loader
from exporter._internal.demo.run import DEMO_CONFIG
from exporter._internal.generate.files import RULE_FILES, generate
from tests.support.prometheus import PrometheusServer

#: Calls per second of the calm demo (the demo's own default is 10): every model and route
#: still makes well over `alerting.min_calls` calls over an alert's long window in 5 minutes.
RATE = 3.0
#: Prometheus' scrape and rule evaluation intervals (s): often enough for the 5m windows and the
#: pages' `for: 2m`, seldom enough to keep the rules' CPU small.
SCRAPE, EVALUATION = 5, 10
#: The demo's niceness (where the test may raise its priority; else it runs at the test's).
#: Its TTFT is measured client-side, where a starved event loop adds its lag to every first
#: token: on two cores shared with the rest of the suite, agent calls scripted at 0.1 s took
#: over 2 s for 7-10 % of them, and the 2 s objective paged. The demo needs a quarter of a
#: core; first claim on it measures the provider, as Prometheus' niceness does for the others.
NICENESS = -10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CalmRun:
    """The demo (child process) and Prometheus; `stop()` ends both."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ttft-calm-"))
        self.config = config_loader.load(DEMO_CONFIG)
        generate(self.config, self.dir)
        port = free_port()
        self.log_path = self.dir / "demo.log"
        with self.log_path.open("w") as log:
            self.demo = subprocess.Popen(
                ["nice", "-n", str(NICENESS),  # without the right, nice says so and runs it
                 sys.executable, "-m", "exporter.cli", "demo", "--no-incidents", "--no-page",
                 "--rate", str(RATE), "--port", str(port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.started = time.time()
        job = self.config.alerting.exporter_job
        scrape = (f"global:\n  scrape_interval: {SCRAPE}s\n"
                  f"  evaluation_interval: {EVALUATION}s\n"
                  f"scrape_configs:\n  - job_name: {job}\n"
                  f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        try:
            self.prom = PrometheusServer(
                scrape, rule_files=[self.dir / "alerts" / name for name in RULE_FILES])
        except BaseException:
            self.demo.kill()
            raise

    @property
    def dashboards(self) -> Path:
        """The dashboards generated from the demo's config."""
        return self.dir / "dashboards"

    def demo_log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_until(self, seconds: float) -> float:
        """Sleep until the demo has run `seconds`; the wall time it has run."""
        left = self.started + seconds - time.time()
        if left > 0:
            time.sleep(left)
        return time.time() - self.started

    def stop(self) -> None:
        if self.demo.poll() is None:
            self.demo.terminate()
            try:
                self.demo.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.demo.kill()
                self.demo.wait()
        self.prom.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
