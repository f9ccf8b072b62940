"""Debian's Prometheus as a child process on loopback: the demo's (and the tests') own.

The demo shows the generated dashboards and alerts, and only a real Prometheus evaluates them,
so it starts the `prometheus` binary with a temporary config and TSDB, scraping the exporter
and loading the generated rules, and stops it with the demo. The port is Prometheus' own
choice (`--web.listen-address=127.0.0.1:0`), read from its log. tests/support/prometheus.py
adds the HTTP API the tests query.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

PROMETHEUS = "prometheus"
#: What a user without the binary is told to run (Debian's package brings it and promtool).
INSTALL = "sudo apt-get install prometheus (or make prometheus)"

_LISTENING = re.compile(r'msg="Listening on".*?address=(\S+)')
_Self = TypeVar("_Self", bound="PrometheusProcess")


class PrometheusError(RuntimeError):
    """Prometheus is missing, did not start, or its API answered with an error status."""


#: The job of `ttft-exporter watch`'s scrape target (the likely cause the alert reads).
WATCH_JOB = "ttft-exporter-watch"


def scrape_config(*targets: str, job: str = "ttft-exporter", interval: float = 1.0,
                  evaluation: float | None = None, watch: str | None = None,
                  scraper: str | None = None) -> str:
    """A Prometheus config scraping `targets` (host:port) every `interval` seconds, and the
    `watch` target (host:port of `ttft-exporter watch`) as job WATCH_JOB, rules evaluated every
    `evaluation` seconds (the scrape interval when None). `scraper` names this Prometheus to
    the exporter (the `scraper` parameter): servers scraping from one address each see every
    new series at zero first (expose/debut.py)."""
    jobs = [(job, targets), *([(WATCH_JOB, (watch,))] if watch else [])]
    out = (f"global:\n  scrape_interval: {interval:g}s\n"
           f"  evaluation_interval: {evaluation or interval:g}s\nscrape_configs:\n")
    params = f"    params:\n      scraper: [{scraper}]\n" if scraper else ""
    for name, listed in jobs:
        quoted = ", ".join(f'"{t}"' for t in listed)
        out += (f"  - job_name: {name}\n{params}"
                f"    static_configs:\n      - targets: [{quoted}]\n")
    return out


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the thread that started it ends (the
    demo's and the tests' main thread), even by SIGKILL, so a killed demo or test leaves no
    Prometheus behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def missing() -> str | None:
    """One line saying the binary is missing and how to install it; None when it is there."""
    if shutil.which(PROMETHEUS) is not None:
        return None
    return f"{PROMETHEUS} not found on PATH; install it with: {INSTALL}"


class PrometheusProcess:
    """A `prometheus` process with its own temporary config and TSDB; stop it with `stop()`.

    `rule_files` are appended to the config as a `rule_files:` list (absolute paths), so the given
    config must not have one. The process log (stderr) is kept in `log` for failure messages.

    It runs at `niceness` 10: deployed, Prometheus has machines of its own, and here its rule
    evaluations and the watch's queries must not take the CPU from the processes whose timings
    are measured (the demo's load, provider and exporter).
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
            text=True, cwd=self._dir,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        os.setpriority(os.PRIO_PROCESS, self._proc.pid, niceness)
        # Drain stderr on a thread: a full pipe would block Prometheus, and the port is in there.
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self._wait_started(start_timeout)
        except BaseException:
            self.stop()
            raise

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

    def running(self) -> bool:
        return self._proc.poll() is None

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

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
