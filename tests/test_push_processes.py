"""Real processes: a pre-fork master with 4 worker processes pushing to `ttft-exporter serve`.

The master configures push and forks (as gunicorn does); each child records 500 calls with known
TTFT values and exits normally (its atexit push). The aggregator is a real `ttft-exporter serve`
subprocess; it must report exactly 2,000 calls, `le` counts exact at every boundary, and the
p99 of one HdrHistogram fed all 2,000 values, also across a SIGKILL and a SIGTERM restart.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from hdrh.histogram import HdrHistogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from exporter._internal import names
from exporter._internal.config.settings import Config

CLI = [sys.executable, "-m", "exporter.cli"]
WORKERS, CALLS = 4, 500

MASTER = r'''
import json, os, sys, time
import exporter
from exporter._internal import runtime
from exporter._internal.record.timeline import CallTimeline

url, values_path, pace = sys.argv[1], sys.argv[2], float(sys.argv[3])
parent_calls = int(sys.argv[4])
values = json.loads(open(values_path).read())
exporter.configure({"push_url": url, "push": {"interval_seconds": 0.1, "timeout_seconds": 2,
                                              "exit_timeout_seconds": 30}})
parent = runtime.current_flusher().worker
for _ in range(parent_calls):  # the master's own calls, still unpushed when it forks
    t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="master")
    t.token(1000)
    t.end = 2000
    t.outcome = "ok"
    runtime.state().recorder.record_call(t)
pids = []
for vals in values:
    pid = os.fork()
    if pid == 0:  # a worker: fresh recorder, fresh id, its own flusher
        assert runtime.current_flusher() is not None and runtime.current_flusher().worker != parent
        rec = runtime.state().recorder
        for v in vals:
            t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="acme")
            t.token(v * 1000)
            t.end = v * 1000 + 1000
            t.outcome = "ok"
            rec.record_call(t)
            if pace:
                time.sleep(pace)
        sys.exit(0)  # a normal exit: atexit pushes the rest
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
print("children", codes, flush=True)
sys.exit(1 if any(codes) else 0)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`ttft-exporter serve` as a subprocess."""

    def __init__(self, config: Path, port: int = 0):
        self.proc = subprocess.Popen([*CLI, "serve", "--config", str(config), "--port",
                                      str(port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            match = re.search(r"serving (http://\S+)/metrics", line)
            if match:
                self.base = match.group(1)
                return
            if not line and self.proc.poll() is not None:
                break
        self.proc.kill()
        raise AssertionError(f"serve did not start: {line}{self.proc.stderr.read()}")

    def metrics(self) -> dict:
        text = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def stop(self, sig=signal.SIGTERM) -> str:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=20)
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return err


class Lines:
    """A pipe read on a thread, line by line: a test can wait for a line, then read it all."""

    def __init__(self, stream):
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: any(text in l for l in self._lines), timeout)

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self._lines)


def values_for_workers(seed: int = 11) -> list[list[int]]:
    rng = random.Random(seed)
    return [[int(rng.lognormvariate(12.8, 1.1)) + 1 for _ in range(CALLS)]
            for _ in range(WORKERS)]


def start_master(tmp_path: Path, url: str, values, pace: float, parent_calls: int = 0
                 ) -> subprocess.Popen:
    script = tmp_path / "master.py"
    script.write_text(MASTER)
    data = tmp_path / "values.json"
    data.write_text(json.dumps(values))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_EXPORTER_")}
    return subprocess.Popen([sys.executable, str(script), url, str(data), str(pace),
                             str(parent_calls)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def calls(m: dict) -> float:
    return sum(v for (name, _), v in m.items() if name == names.REQUESTS_TOTAL)


def check_exact(m: dict, values: list[list[int]], window: bool = True) -> None:
    flat = [v for vals in values for v in vals]
    labels = (("model", "m"), ("provider", "p"), ("route", "r"), ("tenant", "acme"))
    ttft = names.TTFT.name
    assert calls(m) == WORKERS * CALLS
    assert m[(ttft + "_count", labels)] == len(flat)
    assert m[(ttft + "_sum", labels)] == float(floatToGoString(sum(flat) / 1e6))
    for boundary in Config().seconds_buckets():  # every le count exact, not HDR-rounded
        key = (ttft + "_bucket", tuple(sorted(labels + (("le", floatToGoString(boundary)),))))
        assert m[key] == sum(1 for v in flat if v <= round(boundary * 1e6)), boundary
    if not window:  # a restart empties the sliding window (it refills within window.seconds)
        return
    reference = HdrHistogram(1, 3_600_000_000, 2)
    for v in flat:
        reference.record_value(v)
    p99 = m[(names.TTFT.window_name, tuple(sorted(labels + (("quantile", "0.99"),))))]
    assert p99 == reference.get_value_at_percentile(99) / 1e6


def test_four_worker_processes_one_exact_scrape_target(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("window:\n  seconds: 600\n")
    serve = Serve(config)
    try:
        values = values_for_workers()
        master = start_master(tmp_path, serve.base, values, pace=0)
        out, err = master.communicate(timeout=60)
        assert master.returncode == 0, out + err
        assert "children [0, 0, 0, 0]" in out
        m = serve.metrics()
        check_exact(m, values)
        assert sum(v for (n, _), v in m.items() if n == names.SELF_PUSH_REJECTED) == 0
        assert m[(names.SELF_PUSH_LOST, ())] == 0
        assert m[(names.SELF_PUSH_WORKERS, ())] == 0  # every worker's last push said final
        assert m[(names.SELF_PUSH_BATCHES, (("result", "applied"),))] >= WORKERS + 1
    finally:
        assert "Traceback" not in serve.stop()


def test_aggregator_killed_and_restarted_mid_run_loses_nothing(tmp_path):
    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(f"window:\n  seconds: 600\naggregator:\n  snapshot_path: "
                      f"{tmp_path / 'state'}\n  snapshot_interval_seconds: 1\n")
    serve = Serve(config, port)
    values = values_for_workers(12)
    master = start_master(tmp_path, serve.base, values, pace=0.004)
    errors = Lines(master.stderr)
    try:
        deadline = time.monotonic() + 20
        seen = 0.0
        while time.monotonic() < deadline:  # kill once the aggregator has some of the calls
            seen = calls(serve.metrics())
            if seen >= 300:
                break
            time.sleep(0.05)
        assert 0 < seen < WORKERS * CALLS, seen
        serve.stop(signal.SIGKILL)  # no final snapshot: the journal must carry the rest
        # the aggregator stays down until a worker failed to push (it keeps its deltas)
        assert errors.wait_for("cannot push to", 30), errors.text()
        serve = Serve(config, port)
        restored = calls(serve.metrics())
        assert restored >= seen  # Prometheus sees no counter reset
        master.wait(timeout=90)
        assert master.returncode == 0, master.stdout.read() + errors.text()
        check_exact(serve.metrics(), values, window=False)
        # and a SIGTERM restart (final snapshot, empty journal) keeps the totals too
        assert "Traceback" not in serve.stop()
        assert os.path.getsize(tmp_path / "state.journal") == 0
        serve = Serve(config, port)
        m = serve.metrics()
        assert calls(m) == WORKERS * CALLS
        assert m[(names.SELF_PUSH_FAILURES, ())] > 0  # the outage was seen and reported
        assert m[(names.SELF_PUSH_LOST, ())] == 0
    finally:
        if master.poll() is None:
            master.kill()
        serve.stop()


def test_forked_children_do_not_push_the_parents_calls(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("{}\n")
    serve = Serve(config)
    try:
        master = start_master(tmp_path, serve.base, [[1000] * 5, [2000] * 5], pace=0,
                              parent_calls=7)
        out, err = master.communicate(timeout=60)
        assert master.returncode == 0, out + err
        m = serve.metrics()
        by_tenant = {dict(labels)["tenant"]: v for (name, labels), v in m.items()
                     if name == names.REQUESTS_TOTAL}
        assert by_tenant == {"master": 7, "acme": 10}
    finally:
        serve.stop()
