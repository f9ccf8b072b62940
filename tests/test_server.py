"""The aiohttp exporter on a real loopback port: negotiation, gzip, health, promtool lint."""

import gzip
import http.client
import subprocess
import urllib.request

import pytest

import exporter
from exporter._internal import names
from exporter._internal.expose.server import wants_openmetrics
from exporter._internal.expose.textformat import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from tests.support.prometheus import PROMTOOL, require_prometheus

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                     "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.fixture
def server():
    srv = exporter.start_http_server(port=0)
    with exporter.labels(route="search", tenant="acme"):
        with exporter.track(model="llama-3-8b", provider="vllm") as call:
            call.sent()
            call.headers()
            call.token()
            call.token()
            call.usage(input=10, output=2)
    yield srv
    srv.stop()


def get(url, **headers):
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
        return response.status, dict(response.headers), response.read()


def test_text_format_by_default(server):
    status, headers, body = get(server.url)
    assert status == 200 and headers["Content-Type"] == TEXT_CONTENT_TYPE
    assert b"# EOF" not in body
    assert f'{names.TTFT.name}_count{{model="llama-3-8b",provider="vllm",route="search",' \
           f'tenant="acme"}} 1.0'.encode() in body


def test_openmetrics_and_gzip_when_asked(server):
    status, headers, body = get(server.url, Accept=PROMETHEUS_ACCEPT, **{"Accept-Encoding": "gzip"})
    assert headers["Content-Type"] == OPENMETRICS_CONTENT_TYPE
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body)
    assert text.endswith(b"# EOF\n")
    assert b"# TYPE llm_client_requests counter\n" in text


def test_head_sends_the_headers_of_get_and_no_body(server):
    """On one kept-alive connection: a body after HEAD's headers would be read as the next
    answer's status line."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("HEAD", "/metrics")
        head = connection.getresponse()
        assert head.status == 200 and head.read() == b""
        connection.request("GET", "/metrics")
        get = connection.getresponse()
        body = get.read()
        assert get.status == 200 and int(get.headers["Content-Length"]) == len(body)
        # (the two renders differ by the previous scrape's duration: a few bytes)
        assert abs(int(head.headers["Content-Length"]) - len(body)) < 100 < len(body)
    finally:
        connection.close()


def test_healthz(server):
    assert get(server.url.replace("/metrics", "/healthz"))[2] == b"ok\n"


def test_accept_parsing():
    assert wants_openmetrics(PROMETHEUS_ACCEPT)
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert not wants_openmetrics("")


def test_promtool_check_metrics_is_clean(server):
    require_prometheus()
    _, _, body = get(server.url)
    run = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == b"" and run.stderr.strip() == b""


def test_busy_port_is_a_clear_error(server):
    with pytest.raises(OSError):
        exporter.start_http_server(port=server.port)
