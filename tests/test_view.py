"""`ttft-exporter view` without a browser: the pages carry the committed dashboards' JSON as
written, the server passes Prometheus' read API through (a real Prometheus) and nothing else,
the findings are diagnose's, and the shipped uPlot is the lockfile's build.

tests/test_view_browser.py draws the pages in a real Chromium."""

from __future__ import annotations

import html
import json
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from exporter.cli import main
from exporter._internal.config.settings import Config
from exporter._internal.demo.page import dashboards_page
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
