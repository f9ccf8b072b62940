"""Outcome classes with the real SDKs: the provider's failures told apart from the caller's own.

Each HTTP status comes from the demo provider (`x-demo-script: {"status": ...}`), so the
exception is the one the real openai and anthropic SDKs raise for it; the recorded outcome is
checked against the class it belongs to, and a real Prometheus running the generated recording
rules shows that the caller's 4xx and 429s leave the error SLI at 0 where 5xx spend it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import aiohttp
import anthropic
import httpx2
import openai
import pytest

import exporter
from exporter._internal import names, promql, runtime
from exporter._internal.config import loader as config_loader
from exporter._internal.generate.files import RECORDING_FILE, generate
from exporter._internal.record.outcome import outcome_of
from tests import test_shim_support as support
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config
from tests.test_shim_support import Recorded, script

server, recorded, instrumented = support.server, support.recorded, support.instrumented

MESSAGES = [{"role": "user", "content": "hello"}]

#: status -> (outcome, openai's exception, anthropic's exception)
STATUSES = {
    400: (names.CLIENT_ERROR, openai.BadRequestError, anthropic.BadRequestError),
    401: (names.CLIENT_ERROR, openai.AuthenticationError, anthropic.AuthenticationError),
    403: (names.CLIENT_ERROR, openai.PermissionDeniedError, anthropic.PermissionDeniedError),
    404: (names.CLIENT_ERROR, openai.NotFoundError, anthropic.NotFoundError),
    408: (names.TIMEOUT, openai.APIStatusError, anthropic.APIStatusError),
    413: (names.CLIENT_ERROR, openai.APIStatusError, anthropic.APIStatusError),
    422: (names.CLIENT_ERROR, openai.UnprocessableEntityError,
          anthropic.UnprocessableEntityError),
    429: (names.RATE_LIMITED, openai.RateLimitError, anthropic.RateLimitError),
    500: (names.PROVIDER_ERROR, openai.InternalServerError, anthropic.InternalServerError),
    503: (names.PROVIDER_ERROR, openai.InternalServerError, anthropic.InternalServerError),
    529: (names.PROVIDER_ERROR, openai.InternalServerError, anthropic.OverloadedError),
}


def _openai(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0, **kw)


def _anthropic(server, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="test", max_retries=0, **kw)


def openai_stream(c: openai.OpenAI, **s) -> None:
    for _ in c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                       extra_headers=script(**s)):
        pass


def anthropic_stream(c: anthropic.Anthropic, **s) -> None:
    with c.messages.stream(model="m", max_tokens=50, messages=MESSAGES,
                           extra_headers=script(**s)) as stream:
        for _ in stream:
            pass


@pytest.mark.parametrize("status", sorted(STATUSES))
def test_each_status_is_its_class_with_both_sdks(server, recorded, status):
    outcome, openai_error, anthropic_error = STATUSES[status]
    with pytest.raises(openai_error) as raised:
        openai_stream(_openai(server), status=status)
    assert raised.value.status_code == status
    with pytest.raises(anthropic_error) as raised_anthropic:
        anthropic_stream(_anthropic(server), status=status)
    assert raised_anthropic.value.status_code == status
    # not streamed too
    with pytest.raises(openai_error):
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="t", max_retries=0) \
            .chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(
                status=status))
    assert [t.outcome for t in recorded.all()] == [outcome] * 3


def test_connection_failures_and_timeouts(server, recorded):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"http://127.0.0.1:{closed}/v1", api_key="t", max_retries=0) \
            .chat.completions.create(model="m", messages=MESSAGES)
    with pytest.raises(anthropic.APIConnectionError):
        anthropic.Anthropic(base_url=f"http://127.0.0.1:{closed}", api_key="t",
                            max_retries=0).messages.create(model="m", max_tokens=5,
                                                           messages=MESSAGES)
    # cut mid-stream: openai wraps it (APIConnectionError), anthropic before 2.17 lets httpx2's
    # through
    with pytest.raises(openai.APIConnectionError):
        openai_stream(_openai(server), tokens=8, gap=0.01, disconnect_after=3)
    with pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)):  # (2.17+)
        anthropic_stream(_anthropic(server), tokens=8, gap=0.01, disconnect_after=3)
    with pytest.raises(openai.APITimeoutError):
        openai_stream(_openai(server, timeout=0.2), server_wait=1.0)
    with pytest.raises(anthropic.APITimeoutError):
        anthropic_stream(_anthropic(server, timeout=0.2), server_wait=1.0)
    assert [t.outcome for t in recorded.all()] == [names.CONNECTION_ERROR] * 4 + \
        [names.TIMEOUT] * 2


def _response(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("POST", "http://127.0.0.1/v1"))


class APITimeoutError(Exception):
    """Named like openai's: recognised without importing the SDK."""


@pytest.mark.parametrize("exc, outcome", [
    (None, names.OK), (asyncio.CancelledError(), names.CANCELLED),
    (GeneratorExit(), names.ABANDONED), (APITimeoutError(), names.TIMEOUT),
    # an error event inside a 200 stream: the SDKs raise it with the event's body
    (anthropic.APIStatusError("overloaded", response=_response(200), body={
        "type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
     names.PROVIDER_ERROR),
    (anthropic.APIStatusError("limited", response=_response(200), body={
        "type": "error", "error": {"type": "rate_limit_error", "message": "x"}}),
     names.RATE_LIMITED),
    (openai.APIError("boom", httpx2.Request("POST", "http://127.0.0.1/v1"),
                     body={"type": "server_error", "message": "x"}), names.PROVIDER_ERROR),
    (openai.APIResponseValidationError(_response(200), body={}), names.PROVIDER_ERROR),
    # a 504 is the provider's failure, though anthropic names its class "GatewayTimeoutError"
    (anthropic.GatewayTimeoutError("gw", response=_response(504), body=None),
     names.PROVIDER_ERROR),
    # the manual API around aiohttp: raise_for_status() and a refused connection
    (aiohttp.ClientResponseError(aiohttp.RequestInfo(
        "http://127.0.0.1/", "POST", {}, "http://127.0.0.1/"), (), status=422),
     names.CLIENT_ERROR),
    (ConnectionRefusedError(), names.CONNECTION_ERROR),
    (httpx2.ConnectError("refused"), names.CONNECTION_ERROR),
    (httpx2.ReadTimeout("slow"), names.TIMEOUT),
    (TimeoutError(), names.TIMEOUT),
    (ValueError("the caller's own bug"), names.ERROR),
])
def test_exceptions_read_without_the_sdks(exc, outcome):
    assert outcome_of(exc) == outcome


def test_outcome_classes_are_bounded_and_split_between_provider_and_caller():
    assert set(names.PROVIDER_FAILURES) < set(names.OUTCOMES)
    assert set(promql.ERROR_OUTCOMES) == set(names.PROVIDER_FAILURES)
    mine = {names.CLIENT_ERROR, names.RATE_LIMITED, names.CANCELLED, names.ABANDONED, names.OK}
    assert mine.isdisjoint(names.PROVIDER_FAILURES)
    assert mine | set(names.PROVIDER_FAILURES) == set(names.OUTCOMES)


def test_the_callers_400s_never_burn_the_error_budget(server, tmp_path: Path):
    """Real SDK calls (400s, 401s, 429s on one route, 500s and 529s on another, ok calls on
    both) through the exporter into a real Prometheus running the generated recording rules:
    the errors SLI is 0 on the caller's route and 0.5 on the provider's."""
    require_prometheus()
    cfg = config_loader.load({"alerting": {"window_scale": 1 / 60}})
    runtime.configure(cfg)
    generate(cfg, tmp_path)
    exporter.instrument()
    metrics = exporter.start_http_server(port=0)
    stop = threading.Event()
    failing = {"caller": (400, 401, 429), "provider": (500, 529)}

    def load() -> None:
        oai, claude = _openai(server), _anthropic(server)
        while not stop.is_set():
            for route, statuses in failing.items():
                with exporter.labels(route=route):
                    for status in statuses:
                        for call in (openai_stream, anthropic_stream):
                            try:
                                call(oai if call is openai_stream else claude, status=status)
                            except (openai.APIStatusError, anthropic.APIStatusError):
                                pass
                    for _ in range(len(statuses)):  # as many ok calls as failed ones
                        openai_stream(oai, tokens=2)
                        anthropic_stream(claude, tokens=2)
            time.sleep(0.05)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        target = metrics.url.split("//", 1)[1].split("/", 1)[0]
        with PrometheusServer(scrape_config(target, job=cfg.alerting.exporter_job),
                              rule_files=[tmp_path / "alerts" / RECORDING_FILE]) as prom:
            record = promql.sli_record(300)
            ratio = f'{record}{{sli="errors",route=~"caller|provider"}}'
            found = prom.wait_for(ratio, timeout=60, predicate=lambda r: len(r) == 2)
            by_route = {r["metric"]["route"]: float(r["value"][1]) for r in found}
            assert by_route["caller"] == 0.0, by_route
            assert 0.3 < by_route["provider"] < 0.7, by_route
            rows = runtime.state().recorder.rows[names.REQUESTS_TOTAL]
            seen = {key[1] for key in rows if key[3] == "caller" and rows[key]}
            assert {names.CLIENT_ERROR, names.RATE_LIMITED, names.OK} <= seen
    finally:
        stop.set()
        worker.join(timeout=30)
        metrics.stop()
        exporter.uninstrument()
