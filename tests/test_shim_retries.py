"""The SDKs' own retries, through the real openai and anthropic SDKs against the demo provider
scripted to fail some attempts (503, 529, 429, a dropped connection, a hang): the failed
attempts and the SDK's backoff are the call's `retry` phase, never its `queue`; the retried
attempts are counted by what ended them; the call is counted once, with its final outcome,
and its time to first token still counts from the call's start."""

from __future__ import annotations

import asyncio

import anthropic
import httpx2
import openai
import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.demo.provider import ATTEMPT_HEADER
from exporter._internal.record.timeline import derive
from exporter._internal.shim.manual import retry_reason
from tests import test_shim_support as support
from tests.support.timing import timing
from tests.test_shim_support import script

# Shared fixtures of tests/test_shim_support.py.
server, recorded, instrumented = support.server, support.recorded, support.instrumented
trace_extension = support.trace_extension

MESSAGES = [{"role": "user", "content": "why is my first token slow?"}]
#: What each failed attempt costs in the script below: the provider's wait before it answers
#: the failure, and the backoff its `retry-after-ms` asks for (the SDKs honour it exactly).
FAIL_WAIT, BACKOFF = 0.05, 0.03
#: Client-side time a failed attempt may add on top (the SDK building it again, a new
#: connection: the SDK closes an error response unread): up to ~80 ms measured on a two-core
#: machine under a load of 10.
SLACK = 0.1
#: The final attempt's wait before its headers: longer than the slack of both failed attempts,
#: so a retry phase holding any of the final attempt is out of bounds.
FINAL_WAIT = 0.3


def call(server, sdk: str, is_async: bool, stream: bool, max_retries: int = 2,
         timeout: float | None = None, **keys: object) -> None:
    """One call of `sdk`'s chat endpoint, `keys` scripting the provider; read to its end."""
    headers = script(**keys)
    options = {"api_key": "test", "max_retries": max_retries,
               **({"timeout": timeout} if timeout else {})}
    if sdk == "openai":
        kind = openai.AsyncOpenAI if is_async else openai.OpenAI
        client = kind(base_url=server.base_url + "/v1", **options)
        request = {"model": "gpt-test", "messages": MESSAGES, "stream": stream,
                   "extra_headers": headers}
        create = client.chat.completions.create
    else:
        kind = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
        client = kind(base_url=server.base_url, **options)
        request = {"model": "claude-test", "max_tokens": 100, "messages": MESSAGES,
                   "stream": stream, "extra_headers": headers}
        create = client.messages.create
    if not is_async:
        result = create(**request)
        if stream:
            for _ in result:
                pass
        return

    async def run() -> None:
        result = await create(**request)
        if stream:
            async for _ in result:
                pass

    asyncio.run(run())


def retries_total() -> dict:
    return dict(runtime.state().recorder.rows[names.RETRIES.name])


def requests_total() -> dict:
    return {row: n for row, n in runtime.state().recorder.rows[names.REQUESTS_TOTAL].items()
            if n}


SDKS = [pytest.param(sdk, is_async, stream, id=f"{sdk}-{'async' if is_async else 'sync'}-"
                     f"{'stream' if stream else 'body'}")
        for sdk in ("openai", "anthropic") for is_async in (False, True)
        for stream in (True, False)]


@pytest.mark.usefixtures("trace_extension")
@pytest.mark.parametrize("sdk, is_async, stream", SDKS)
@timing
def test_the_sdks_retries_are_the_retry_phase_not_the_queue(server, recorded, sdk, is_async,
                                                            stream):
    overloaded = 503 if sdk == "openai" else 529  # each provider's way of saying it
    model = "gpt-test" if sdk == "openai" else "claude-test"
    run = dict(fail_attempts=[overloaded, 429], fail_wait=FAIL_WAIT,
               retry_after_ms=BACKOFF * 1000, server_wait=FINAL_WAIT, prefill=0.05, tokens=3)
    call(server, sdk, is_async, stream, **run)  # the SDK's first use: not measured
    recorded.all()
    before = retries_total()
    call(server, sdk, is_async, stream, **run)
    t = recorded.one()
    d = derive(t)
    assert t.outcome == names.OK and t.retries == {"overloaded": 1, "rate_limited": 1}
    # the retry phase is the two failed attempts and the two backoffs the provider asked for,
    # and none of the final attempt
    scripted = 2 * (FAIL_WAIT + BACKOFF)
    assert scripted <= d.phases["retry"] / 1e6 <= scripted + 2 * SLACK, d.phases
    # the queue is the final attempt's own: none of the failed attempts or backoffs in it
    assert d.phases["queue"] / 1e6 < FAIL_WAIT, d.phases
    # the user waited through the retries: time to first token counts from the call's start
    final_attempt = sum(d.phases[p] for p in ("queue", "connect", "send"))
    assert d.ttft >= d.phases["retry"] + final_attempt + FINAL_WAIT * 1e6
    if stream:  # the final attempt's server wait is its server phase; the phases add up
        # (headers to first token alone can read short: a loaded client stamps the headers late)
        assert d.phases["server"] >= FINAL_WAIT * 1e6
        assert d.phases["server"] + d.phases["prefill"] >= (FINAL_WAIT + 0.05) * 1e6, d.phases
        before_token = ("retry", "queue", "connect", "send", "server", "prefill")
        assert abs(d.ttft - sum(d.phases[p] for p in before_token)) <= 10, d.phases
    # the call counted once, with its final outcome; its retried attempts by reason
    assert requests_total()[(model, names.OK, "local", names.UNKNOWN, names.UNKNOWN)] == 2
    after = retries_total()
    for reason in ("overloaded", "rate_limited"):
        row = (model, "local", reason, names.UNKNOWN)
        assert after[row] - before.get(row, 0) == 1


@pytest.mark.parametrize("sdk, is_async, stream", [SDKS[0], SDKS[6]])
def test_a_call_whose_every_attempt_fails_is_one_error_its_retries_counted(
        server, recorded, sdk, is_async, stream):
    status = 503 if sdk == "openai" else 529
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as caught:
        call(server, sdk, is_async, stream, max_retries=2, fail_attempts=[status] * 3,
             fail_wait=0.01, retry_after_ms=10)
    assert caught.value.status_code == status
    t = recorded.one()
    model = t.model
    assert t.outcome == names.PROVIDER_ERROR and t.retries == {"overloaded": 2}
    assert derive(t).phases["retry"] >= 2 * (10_000 + 10_000)
    assert requests_total() == {
        (model, names.PROVIDER_ERROR, "local", names.UNKNOWN, names.UNKNOWN): 1}
    assert retries_total() == {(model, "local", "overloaded", names.UNKNOWN): 2}


@pytest.mark.parametrize("sdk, is_async", [("openai", False), ("anthropic", True)])
def test_a_dropped_connection_and_a_timeout_are_retry_reasons(server, recorded, sdk, is_async):
    # the SDK backs off on its own here (no response, no retry-after): ~0.5 s, then ~1 s
    call(server, sdk, is_async, True, max_retries=2, timeout=0.3,
         fail_attempts=["disconnect", "hang"], tokens=2)
    t = recorded.one()
    assert t.outcome == names.OK and t.retries == {"connection": 1, "timeout": 1}
    d = derive(t)
    assert d.phases["retry"] >= 300_000 + 375_000  # the hang until the timeout; a backoff
    assert d.phases["queue"] < 50_000, d.phases
    assert sum(retries_total().values()) == 2


def test_the_span_says_how_many_times_the_request_was_resent(server, instrumented, spans):
    call(server, "openai", False, True, fail_attempts=[503, 503], fail_wait=0.01,
         retry_after_ms=10, tokens=2)
    call(server, "openai", False, True, tokens=2)
    retried, once = spans.get_finished_spans()
    assert retried.attributes[names.ATTR_RESEND_COUNT] == 2
    assert retried.attributes[names.ATTR_PHASE_PREFIX + "retry"] >= 0.04
    assert names.ATTR_RESEND_COUNT not in once.attributes
    assert names.ATTR_PHASE_PREFIX + "retry" not in once.attributes


def test_a_call_without_retries_has_no_retry_phase_and_no_retry_rows(server, recorded):
    call(server, "anthropic", False, True, tokens=2)
    t = recorded.one()
    assert t.retries is None and t.attempt_start is None
    assert "retry" not in derive(t).phases and "queue" in derive(t).phases
    assert retries_total() == {}


def test_the_manual_api_marks_its_own_retries():
    with exporter.track(model="m", provider="p", route="r") as c:
        c.dispatched()
        c.retried(503)
        c.retried(openai.APITimeoutError(request=httpx2.Request("POST", "http://x")))
        c.dispatched()
        c.token()
    t = c.timeline
    assert t.retries == {"overloaded": 1, "timeout": 1}
    assert list(derive(t).phases)[:2] == ["retry", "queue"]
    assert retries_total() == {("m", "p", "overloaded", "r"): 1, ("m", "p", "timeout", "r"): 1}


@pytest.mark.parametrize("cause, reason", [
    (429, "rate_limited"), (503, "overloaded"), (529, "overloaded"), (500, "server_error"),
    (502, "server_error"), (408, "timeout"), (409, "other"), (None, "other"), (True, "other"),
    (httpx2.ReadTimeout("slow"), "timeout"), (httpx2.ConnectError("refused"), "connection"),
    (httpx2.RemoteProtocolError("cut"), "connection"),
    (openai.APIConnectionError(request=httpx2.Request("POST", "http://x")), "connection"),
    (ValueError("?"), "other")])
def test_retry_reasons_are_a_closed_set(cause, reason):
    assert retry_reason(cause) == reason in names.RETRY_REASONS


def test_the_provider_fails_the_scripted_attempts_with_the_scripted_retry_headers(server):
    url = server.base_url + "/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES}

    def post(attempt: int, **keys: object) -> httpx2.Response:
        return httpx2.post(url, json=body, headers={**script(**keys),
                                                    ATTEMPT_HEADER: str(attempt)})

    failing = dict(fail_attempts=[503, None, 429], retry_after_ms=30, retry_after=None)
    first, second, third, fourth = (post(k, **failing) for k in range(4))
    assert (first.status_code, second.status_code, third.status_code, fourth.status_code) == \
        (503, 200, 429, 200)
    assert first.headers["retry-after-ms"] == "30.0" and "retry-after" not in first.headers
    assert post(0, fail_attempts=[529]).headers["retry-after"] == "1"  # the default
    assert post(0, fail_share=1.0, fail_status=500).status_code == 500
    assert post(0, fail_share=0.0).status_code == 200
    assert post(0, fail_attempts=[200]).status_code == 400  # not a failure: refused
    with pytest.raises(httpx2.RemoteProtocolError):
        post(0, fail_attempts=["disconnect"])
