"""`ttft-exporter watch` as a user runs it: its command-line mistakes are one line and exit 2;
blind (Prometheus unreachable) it serves no cause and counts each failed decision, and it
stops cleanly on SIGTERM. tests/test_diagnose.py and tests/test_incident_day.py check what it
decides, scraped by a real Prometheus, against `diagnose` and the alert."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter._internal import names


def watch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "exporter.cli", "watch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, said", [
    (["--prometheus", "ftp://127.0.0.1:9090"], "must be an http(s) URL"),
    (["--prometheus", "http://127.0.0.1:port"], "bad port"),
    (["--prometheus", "http://127.0.0.1:9090", "--interval", "0.5s"], "too short"),
    (["--prometheus", "http://127.0.0.1:9090", "--interval", "often"], "not a duration"),
    (["--prometheus", "http://127.0.0.1:9090", "--port", "70000"], "70000"),
    (["--prometheus", "http://127.0.0.1:9090", "--addr", "no such host!"], "--addr"),
    (["--prometheus", "http://127.0.0.1:9090", "--timeout", "-1"], "above 0"),
    ([], "--prometheus"),
])
def test_mistakes_are_one_line_and_exit_2(args: list[str], said: str) -> None:
    proc = watch(*args)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_a_baseline_that_overlaps_the_window_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("alerting:\n  tenant_window_seconds: 600\n"
                      "  tenant_baseline_offset_seconds: 300\n")
    proc = watch("--prometheus", "http://127.0.0.1:9090", "--config", str(config))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "baseline" in err and "must end by the start" in err, err


def test_blind_it_serves_no_cause_counts_each_failure_and_stops_on_sigterm() -> None:
    proc = watch("--prometheus", f"http://127.0.0.1:{closed_port()}", "--port", "0",
                 "--interval", "1s", "--timeout", "1")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ttft-exporter watch serving http://127.0.0.1:"), line
        url = line.split()[3].rstrip(",")
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=10) as r:
            assert r.read() == b"ok\n"
        time.sleep(2.5)  # three decisions at least (the first at once)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        evaluations = names.WATCH_EVALUATIONS
        assert samples[(evaluations, (("outcome", "error"),))] >= 2
        assert samples[(evaluations, (("outcome", "ok"),))] == 0
        assert not [k for k in samples if k[0] == names.LIKELY_CAUSE]
        assert samples[(names.WATCH_LAST_SUCCESS, ())] == 0
        assert 0 <= samples[(names.WATCH_SECONDS, ())] < 5
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def pipelined_never_reading(base: str, requests: int = 400) -> socket.socket:
    """A client that sends `requests` pipelined scrapes and reads none of the answers (a tiny
    receive buffer): the server's send buffer fills, its responses are unread."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect((host, int(port)))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
    return s


def reset_within(sock: socket.socket, seconds: float) -> bool:
    poll = select.poll()
    poll.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poll.poll(seconds * 1000))


def test_the_server_settings_of_the_config_bound_its_connections(tmp_path: Path) -> None:
    """`server.write_timeout_seconds` and `server.max_unread_responses` of the config hold on
    the watch's server as on serve's: a client that leaves its answers unread is reset after
    1 s (not the default 30 s), and a second one sheds the first at once (1 unread, not 8)."""
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  write_timeout_seconds: 1\n  max_unread_responses: 1\n")
    proc = watch("--prometheus", f"http://127.0.0.1:{closed_port()}", "--port", "0",
                 "--config", str(config))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[3].rstrip(",")
        base = url.removesuffix("/metrics")
        first = pipelined_never_reading(base)
        assert not reset_within(first, 0.5)  # unread, held for the write timeout
        second = pipelined_never_reading(base)
        assert reset_within(first, 0.5)  # shed: one unread response at most
        started = time.monotonic()
        assert reset_within(second, 10)
        assert time.monotonic() - started < 3  # the write timeout of the config
        first.close()
        second.close()
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=10) as r:
            assert r.read() == b"ok\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
