"""`ttft-exporter view` without a browser: the pages carry the committed dashboards' JSON as
written, the server passes Prometheus' read API through (a real Prometheus) and nothing else,
the findings are diagnose's, and the shipped uPlot is the lockfile's build.

tests/test_view_browser.py draws the pages in a real Chromium."""

from __future__ import annotations

import html
import http.client
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from exporter.cli import main
from exporter._internal import runtime
from exporter._internal.config.settings import Config
from exporter._internal.demo.page import dashboards_page
from exporter._internal.expose.http_thread import address_problem
from exporter._internal.view import security
from exporter._internal.view.backend import Findings
from exporter._internal.view.boards import BoardsError, load_boards
from exporter._internal.view.server import STATIC, UPLOT, ViewServer, create_app
from tests.support import skip_or_fail
from tests.support.prometheus import PrometheusServer, require_prometheus

ROOT = Path(__file__).parent.parent
DASHBOARDS = ROOT / "dashboards"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus():
    require_prometheus()
    with PrometheusServer("global:\n  scrape_interval: 1s\n") as prom:
        yield prom


@pytest.fixture(scope="module")
def view(prometheus):
    server = ViewServer(create_app(load_boards(DASHBOARDS), prometheus.url)).start()
    yield server
    server.stop()


def test_the_landing_page_links_every_committed_dashboard(view):
    status, page = get(view.url)
    assert status == 200
    files = sorted(DASHBOARDS.glob("*.json"))
    assert len(files) >= 5
    for path in files:
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert f'href="/d/{doc["uid"]}"' in page
        assert html.escape(doc["title"]) in page


def test_a_dashboard_page_carries_its_file_as_written(view):
    for path in sorted(DASHBOARDS.glob("*.json")):
        uid = json.loads(path.read_text(encoding="utf-8"))["uid"]
        status, page = get(f"{view.base_url}/d/{uid}")
        assert status == 200
        embedded = re.search(r'<script type="application/json" id="dashboard">(.*?)</script>',
                             page, re.S)
        assert embedded is not None
        assert embedded.group(1).replace("<\\/", "</") == path.read_text(encoding="utf-8")
    status, page = get(f"{view.base_url}/d/no-such-board")
    assert status == 404 and "landing page" in page


def test_prometheus_read_api_passes_through_and_nothing_else(view):
    status, body = get(f"{view.base_url}/api/v1/query?query=vector(42)")
    assert status == 200
    assert json.loads(body)["data"]["result"][0]["value"][1] == "42"
    status, body = get(f"{view.base_url}/api/v1/query?query=rate(up%5B")  # a bad query
    assert status == 400 and json.loads(body)["errorType"] == "bad_data"
    status, body = get(f"{view.base_url}/api/v1/alerts")
    assert status == 200 and json.loads(body)["data"]["alerts"] == []
    status, _ = get(f"{view.base_url}/api/v1/admin/tsdb/snapshot")
    assert status == 404
    for static in ("view.js", "panels.js", "units.js", "view.css", *UPLOT):
        assert get(f"{view.base_url}/static/{static}")[0] == 200


def test_findings_say_why_there_are_none(view):
    status, body = get(f"{view.base_url}/api/findings")
    answer = json.loads(body)
    assert status == 200 and answer["findings"] == []
    assert "no llm_client_time_to_first_token_seconds series" in answer["error"]


def test_an_unreachable_prometheus_is_one_clear_answer():
    url = f"http://127.0.0.1:{closed_port()}"
    server = ViewServer(create_app(load_boards(DASHBOARDS), url, findings=Findings(url))).start()
    try:
        status, body = get(f"{server.base_url}/api/v1/query?query=up")
        assert status == 502 and f"cannot reach Prometheus at {url}" in json.loads(body)["error"]
        answer = json.loads(get(f"{server.base_url}/api/findings")[1])
        assert f"cannot query Prometheus at {url}" in answer["error"]
    finally:
        server.stop()


def test_boards_are_json_dashboards(tmp_path):
    with pytest.raises(BoardsError, match="no dashboards directory"):
        load_boards(tmp_path / "missing")
    with pytest.raises(BoardsError, match=r"no dashboards \(\*\.json\)"):
        load_boards(tmp_path)
    (tmp_path / "x.json").write_text('{"title": "no uid"}')
    with pytest.raises(BoardsError, match="not a Grafana dashboard"):
        load_boards(tmp_path)


def test_view_without_dashboards_exits_2_with_one_line(tmp_path, capsys):
    assert main(["view", "--prometheus", "http://127.0.0.1:9",
                 "--dashboards", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "pass --dashboards DIR" in err


def test_the_shipped_uplot_is_the_lockfile_build():
    """`make assets` (npm ci) puts uPlot's built files in node_modules; the package ships
    copies of them. Both must be the version package-lock.json pins, byte for byte."""
    lock = json.loads((ROOT / "package-lock.json").read_text(encoding="utf-8"))
    pinned = lock["packages"]["node_modules/uplot"]["version"]
    built = ROOT / "node_modules" / "uplot"
    if not built.is_dir():
        skip_or_fail("node_modules/uplot missing: run `make assets` (npm ci)")
    assert json.loads((built / "package.json").read_text(encoding="utf-8"))["version"] == pinned
    for name in UPLOT:
        assert (STATIC / name).read_bytes() == (built / "dist" / name).read_bytes(), name


def test_a_missing_prometheus_is_one_line_with_its_install_command(monkeypatch, tmp_path,
                                                                   capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no prometheus binary there
    with dashboards_page(Config(), "127.0.0.1:9", 0) as url:
        assert url is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "prometheus not found on PATH" in out and "apt-get install prometheus" in out


# --- safe to open: headers, Host, bounded answers ---------------------------------------------

def exchange(url: str, host: str | None) -> tuple[int, dict[str, str], str]:
    """GET `url` with `host` as its Host header (None: no Host header at all)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                              skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def test_every_answer_carries_the_security_headers(view):
    """Pages, files, API answers and errors alike; the pages run no inline script, so the
    policy needs none (tests/test_view_browser.py draws every panel under it)."""
    policy = security.HEADERS["Content-Security-Policy"]
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    uid = json.loads((DASHBOARDS / "ttft-overview.json").read_text(encoding="utf-8"))["uid"]
    paths = ["/", f"/d/{uid}", "/static/view.js", "/static/uPlot.min.css", "/api/findings",
             "/api/v1/query?query=vector(1)", "/api/v1/query?query=rate(up%5B",
             "/api/v1/admin/tsdb/snapshot", "/d/no-such-board"]
    port = urllib.parse.urlsplit(view.base_url).port
    for path, host in [*((p, f"127.0.0.1:{port}") for p in paths), ("/", "evil.example")]:
        status, headers, body = exchange(view.base_url + path, host)
        assert status in (200, 400, 404, 421), (path, status)
        for name, value in security.HEADERS.items():
            assert headers.get(name) == value, (path, name, headers)
        if path in ("/", f"/d/{uid}") and status == 200:
            scripts = re.findall(r"<script([^>]*)>", body)
            assert scripts and all(' src="/static/' in s or 'type="application/json"' in s
                                   for s in scripts), scripts


def test_a_host_other_than_the_servers_address_is_refused(prometheus):
    """DNS rebinding: a page of another site reaching this server through a name that resolves
    to 127.0.0.1 sends that name as Host."""
    server = ViewServer(create_app(load_boards(DASHBOARDS), prometheus.url,
                                   allowed_hosts=["view.internal"])).start()
    try:
        port = server.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost",
                     f"view.internal:{port}", "VIEW.Internal.:80"):
            assert exchange(server.url, host)[0] == 200, host
        for host in (f"evil.example:{port}", f"127.0.0.1.nip.io:{port}",
                     f"attacker.localhost:{port}", f"127.0.0.2:{port}", f"[::1]:{port}", ""):
            status, _, body = exchange(server.url + "api/v1/query?query=up", host)
            assert status == 421 and "--allow-host NAME" in body, host
        assert exchange(server.url, None)[0] == 400  # aiohttp's parser: HTTP/1.1 needs a Host
    finally:
        server.stop()


def test_an_ipv6_loopback_server_answers_to_its_own_address():
    if not socket.has_ipv6 or address_problem("::1") is not None:
        pytest.skip("no IPv6 loopback here")
    url = f"http://127.0.0.1:{closed_port()}"
    server = ViewServer(create_app(load_boards(DASHBOARDS), url), host="::1").start()
    try:
        port = server.port
        for host, status in ((f"[::1]:{port}", 200), (f"localhost:{port}", 200),
                             (f"127.0.0.1:{port}", 421), (f"example.com:{port}", 421)):
            assert exchange(server.url, host)[0] == status, host
    finally:
        server.stop()


def test_an_answer_over_the_limit_is_refused_with_a_clear_error(prometheus):
    """Three hours of one series at 1 s steps is ~180 kB of JSON (read gzip-compressed, in
    pieces): refused past 20 kB, passed under it."""
    server = ViewServer(create_app(load_boards(DASHBOARDS), prometheus.url,
                                   max_reply_bytes=20_000)).start()
    try:
        end = int(time.time())
        status, body = get(f"{server.base_url}/api/v1/query_range?query=vector(1)"
                           f"&start={end - 10800}&end={end}&step=1")
        answer = json.loads(body)
        assert status == 502 and answer["errorType"] == "too_large", answer
        assert "over the view's limit of 20,000 bytes" in answer["error"]
        assert "narrow the time range" in answer["error"]
        status, body = get(f"{server.base_url}/api/v1/query_range?query=vector(1)"
                           f"&start={end - 600}&end={end}&step=15")
        assert status == 200 and len(json.loads(body)["data"]["result"][0]["values"]) == 41
    finally:
        server.stop()


def test_an_answer_that_is_not_prometheus_json_is_a_clear_error():
    """--prometheus pointing at an exporter instead: its 404 page is no JSON."""
    exporter_server = runtime.start_http_server(port=0, addr="127.0.0.1")
    server = ViewServer(create_app(load_boards(DASHBOARDS), exporter_server.base_url)).start()
    try:
        status, body = get(f"{server.base_url}/api/v1/query?query=up")
        answer = json.loads(body)
        assert status == 502 and answer["errorType"] == "bad_reply", answer
        assert f"{exporter_server.base_url}/api/v1/query answered HTTP 404" in answer["error"]
        assert "not Prometheus' JSON" in answer["error"]
    finally:
        server.stop()
        exporter_server.stop()


def test_view_answers_to_the_names_given_with_allow_host():
    """`ttft-exporter view --allow-host NAME` as a user runs it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "view", "--prometheus", "http://127.0.0.1:9",
         "--dashboards", str(DASHBOARDS), "--port", "0", "--allow-host", "view.internal"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split("dashboards: ", 1)[1].strip()
        port = urllib.parse.urlsplit(url).port
        assert exchange(url, f"view.internal:{port}")[0] == 200
        assert exchange(url, f"other.internal:{port}")[0] == 421
    finally:
        proc.terminate()
        proc.wait(timeout=30)
