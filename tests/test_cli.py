"""The command line as a user runs it: serve stops cleanly on SIGTERM, demo shows live numbers."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

CLI = [sys.executable, "-m", "exporter.cli"]


def read_until(proc, pattern, timeout):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match, seen
    raise AssertionError(f"{pattern!r} not printed within {timeout} s:\n{''.join(seen)}")


def test_serve_answers_and_stops_cleanly_on_sigterm(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("labels:\n  max_tenants: 5\n")
    proc = subprocess.Popen([*CLI, "serve", "--config", str(config), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        match, _ = read_until(proc, r"serving (http://\S+/metrics)", 10)
        url = match.group(1)
        assert urllib.request.urlopen(url.replace("/metrics", "/healthz")).read() == b"ok\n"
        assert b"ttft_exporter_series 0.0" in urllib.request.urlopen(url).read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


def test_serve_with_a_bad_config_exits_2(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("labels:\n  max_tenants: -1\n")
    run = subprocess.run([*CLI, "serve", "--config", str(config), "--port", "0"],
                         capture_output=True, text=True, timeout=20)
    assert run.returncode == 2 and "labels.max_tenants" in run.stderr
    assert "Traceback" not in run.stderr


def test_demo_prints_the_page_then_the_metrics_url_a_live_table_and_a_summary():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*CLI, "demo", "--port", "0", "--seconds", "12"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first, seen = read_until(proc, r"^dashboards: (http://127\.0\.0\.1:\d+/)$", 30)
        assert len(seen) == 1, seen  # the page's URL is the first line, before the table
        page = urllib.request.urlopen(first.group(1)).read().decode()
        assert 'href="/d/ttft-overview"' in page
        match, more = read_until(proc, r"metrics:\s+(http://\S+/metrics)", 15)
        seen += more
        url = match.group(1)
        # (the agent tasks' calls carry no tenant: `unknown` may lead the line)
        _, more = read_until(proc, r"^slowest tenants by TTFT p99 \(last 60 s\): .*tenant-", 40)
        table = "".join(seen + more)
        assert "incident day:" in table  # the schedule is printed first
        assert re.search(r"^TTFT and stall quantiles: last 60 s \(the exporter's sliding "
                         r"window\); req/s: last \d+ s$", table, re.M), table
        assert re.search(r"^llama-3-8b\s+chat\s+\d+\.\d\ds", table, re.M), table
        assert b"llm_client_time_to_first_token_seconds_bucket" in \
            urllib.request.urlopen(url).read()
        match, _ = read_until(proc, r"^summary of the whole run \(0\.\d min\): (\d+) calls", 30)
        assert int(match.group(1)) > 24  # ~10 calls/s for 12 s; ≥ 2/s on a loaded machine
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_demo_rate_must_be_a_positive_number():
    for rate, why in (("0", "must be above 0, got 0"), ("fast", "not a number: 'fast'")):
        run = subprocess.run([*CLI, "demo", "--rate", rate], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2 and run.stdout == ""
        assert why in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
