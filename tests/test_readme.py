"""The README's service snippet runs as written against the demo provider, streams with token
usage, and its claims about the port hold."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import exporter
from exporter._internal import names
from exporter._internal.demo.provider import ProviderServer

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def snippet() -> str:
    """The first Python block of "## Use it", exactly as the README shows it."""
    section = README.split("## Use it", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_opens_with_make_demo_and_make_test() -> None:
    opening = README.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in opening[:2]] == [["make", "demo"], ["make", "test"]]


def test_the_service_snippet_runs_as_written_against_the_demo_provider() -> None:
    """The snippet in a fresh interpreter, then a scrape of the /metrics it started: the call
    is recorded with its route, tenant and the token usage of the stream."""
    port = free_port()
    scrape = (f"\nimport urllib.request\n"
              f"print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())\n")
    with ProviderServer() as provider:
        env = {**os.environ, "OPENAI_BASE_URL": provider.base_url + "/v1",
               "OPENAI_API_KEY": "demo", "METRICS_PORT": str(port)}
        run = subprocess.run([sys.executable, "-c", snippet() + scrape], env=env,
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    answer, metrics = run.stdout.split("\n", 1)
    assert answer.startswith("Time to first token is what a user waits for")
    labels = 'model="gpt-4.1",provider="local",route="support-bot"'
    for family in (names.INPUT_TOKENS, names.OUTPUT_TOKENS, names.CACHED_INPUT_TOKENS):
        assert f"{family.name}_count{{{labels}}} 1.0" in metrics, family.name
    assert re.search(rf'{names.TTFT.name}_count\{{{labels},tenant="acme"\}} 1\.0', metrics)


def test_a_taken_port_raises_oserror_and_nothing_else_does() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError) as error:
            exporter.start_http_server(port=port)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in str(error.value)
    assert "cannot listen on 127.0.0.1:9469: Address already in use" in README
    assert 'port=int(os.environ.get("METRICS_PORT", "9469"))' in snippet()
    assert "stream_options={\"include_usage\": True}" in snippet()


def test_configure_raises_config_error_for_a_bad_config_as_the_readme_says() -> None:
    """The one other exception the README admits to: a bad config, every mistake at once."""
    from exporter._internal.config.settings import ConfigError

    with pytest.raises(ConfigError) as error:
        exporter.configure({"labels": {"max_tenants": 0}, "server": {"port": -1}})
    assert {path for path, _ in error.value.errors} == {"labels.max_tenants", "server.port"}
    prose = " ".join(README.split())
    assert "`exporter.configure()` raises `ConfigError` for a bad config" in prose
    assert "Nothing else in the exporter raises into your code." in prose
