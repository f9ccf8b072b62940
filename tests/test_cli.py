"""The command line as a user runs it: serve stops cleanly on SIGTERM, demo shows live numbers."""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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


# --- secure by default: /push beyond loopback needs a token; secrets follow their files ---

def _env_without_token() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TTFT_EXPORTER_PUSH_TOKEN"}


def test_serve_beyond_loopback_without_a_push_token_refuses_to_start(tmp_path):
    """One line naming the setting that allows it; nothing listens and nothing is written (the
    snapshot folder stays empty). The address is never bound: the refusal comes first."""
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "c.yaml"
    config.write_text(f"aggregator:\n  snapshot_path: {state / 'snap'}\n")
    for addr in ("0.0.0.0", "::", "10.255.255.254"):  # (the last: not even this host's)
        run = subprocess.run([*CLI, "serve", "--config", str(config), "--addr", addr,
                              "--port", "0"], capture_output=True, text=True, timeout=30,
                             env=_env_without_token())
        if addr == "10.255.255.254":  # the address is refused first, as before
            assert run.returncode == 2 and "--addr: cannot listen" in run.stderr
            continue
        assert run.returncode == 2, (addr, run.stderr)
        assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr
        assert "aggregator.allow_unauthenticated_push: true" in run.stderr
        assert "aggregator.push_token_file" in run.stderr and "TTFT_EXPORTER_PUSH_TOKEN" in \
            run.stderr
    assert list(state.iterdir()) == []
    # check-config names the same problem at the same key, and the settings that lift it
    open_config = tmp_path / "open.yaml"
    open_config.write_text("server:\n  addr: 0.0.0.0\n")
    run = subprocess.run([*CLI, "check-config", str(open_config)], capture_output=True,
                         text=True, timeout=30, env=_env_without_token())
    assert run.returncode == 2 and "aggregator.allow_unauthenticated_push: true" in run.stderr
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    for extra in ("  allow_unauthenticated_push: true\n", f"  push_token_file: {token}\n"):
        open_config.write_text(f"server:\n  addr: 0.0.0.0\naggregator:\n{extra}")
        run = subprocess.run([*CLI, "check-config", str(open_config)], capture_output=True,
                             text=True, timeout=30, env=_env_without_token())
        assert run.returncode == 0, run.stderr
    open_config.write_text("server:\n  addr: 0.0.0.0\n")
    run = subprocess.run([*CLI, "check-config", str(open_config)], capture_output=True,
                         text=True, timeout=30,
                         env={**_env_without_token(), "TTFT_EXPORTER_PUSH_TOKEN": "s3cret"})
    assert run.returncode == 0, run.stderr


def test_only_loopback_addresses_may_serve_an_open_push():
    from exporter._internal.config.settings import Config
    from exporter._internal.fleet.access import is_loopback, open_push_problem

    assert all(is_loopback(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "", "10.0.0.1", "example.com"))
    env = os.environ.pop("TTFT_EXPORTER_PUSH_TOKEN", None)
    try:
        assert open_push_problem(Config(), "127.0.0.1") is None
        assert "allow_unauthenticated_push" in open_push_problem(Config(), "10.0.0.1")
    finally:
        if env is not None:
            os.environ["TTFT_EXPORTER_PUSH_TOKEN"] = env


def _peer_certificate(port: int, ca: Path) -> bytes:
    """The certificate a new TLS connection to 127.0.0.1:port is served (DER)."""
    import socket
    import ssl

    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # (rotated: any CA)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def _push(base: str, token: str, ca: Path, seq: int) -> int:
    """A real worker's push (one call) to `base` with `token`: the HTTP status."""
    import ssl
    import urllib.error

    from exporter._internal import names
    from exporter._internal.fleet import wire
    from exporter._internal.fleet.take import take
    from exporter._internal.record.recorder import Recorder
    from exporter._internal.record.timeline import CallTimeline

    rec = Recorder()
    t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="t")
    t.token(1_000_000)
    t.end, t.outcome = 2_000_000, names.OK
    rec.record_call(t)
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = "rotation-test", seq, 5.0
    request = urllib.request.Request(base + wire.PUSH_PATH, method="POST",
                                     data=wire.encode(delta, rec.schema.layouts()),
                                     headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def _replace(target: Path, data: bytes) -> None:
    """Write `target` as a rotation does: a new file moved over the old one."""
    fresh = target.with_suffix(".new")
    fresh.write_bytes(data)
    os.replace(fresh, target)


def _eventually(check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def test_serve_follows_a_rotated_token_and_a_renewed_certificate_without_restart(tmp_path):
    """A real `serve` over TLS: the token file is replaced, the old token is refused and the
    new one taken; the certificate and key are replaced, a new connection gets the new
    certificate. The process never restarts."""
    import ssl

    from exporter._internal.demo.far_region import self_signed

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    cert_a, key_a = self_signed(first)
    cert_b, key_b = self_signed(second)
    cert, key, token = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "token"
    cert.write_bytes(cert_a.read_bytes())
    key.write_bytes(key_a.read_bytes())
    token.write_text("old-token\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"aggregator:\n  push_token_file: {token}\n  tls_cert_file: {cert}\n"
                      f"  tls_key_file: {key}\n")
    proc = subprocess.Popen([*CLI, "serve", "--config", str(config), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env_without_token())
    try:
        match, _ = read_until(proc, r"serving (https://\S+)/metrics", 20)
        base = match.group(1)
        port = int(base.rsplit(":", 1)[1])
        der_a = ssl.PEM_cert_to_DER_cert(cert_a.read_text())
        der_b = ssl.PEM_cert_to_DER_cert(cert_b.read_text())
        assert der_a != der_b
        assert _peer_certificate(port, cert) == der_a
        assert _push(base, "old-token", cert, 1) == 200
        assert _push(base, "new-token", cert, 2) == 401

        _replace(token, b"new-token\n")
        assert _eventually(lambda: _push(base, "old-token", cert, 3) == 401)
        assert _push(base, "new-token", cert, 4) == 200

        _replace(key, key_b.read_bytes())
        _replace(cert, cert_b.read_bytes())
        assert _eventually(lambda: _peer_certificate(port, cert) == der_b)
        assert _push(base, "new-token", cert, 5) == 200  # over the new certificate
        assert proc.poll() is None  # the same process all along
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
