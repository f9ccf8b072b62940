"""The server's own timings, where a chat completion carries them (issue 32, item 5): vLLM's
per-request `metrics` and llama.cpp's `timings`, as the demo provider renders them (engines.py)
with the times it really spent, read through the real openai SDK. The server's queue and
prefill are recorded beside the client's phases, and what of a streamed call's time to first
token lies outside them is a measurement: a region one round trip away adds that round trip
to it and nothing to the server's phases."""

from __future__ import annotations

import openai
import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.demo.engines import LLAMA_CPP, VLLM
from exporter._internal.demo.far_region import ONE_WAY_SECONDS
from exporter._internal.record.timeline import derive
from exporter._internal.shim import openai as shim_openai
from tests import test_shim_support as support
from tests.support.timing import timing
from tests.test_shim_support import Recorded, assert_near, client_side, drops, script

instrumented = support.instrumented
pytestmark = pytest.mark.usefixtures("instrumented")

MESSAGES = [{"role": "user", "content": "why is my first token slow?"}]
#: The server waits (its queue) 100 ms, then takes 150 ms to its first token.
ANSWER = {"server_wait": 0.1, "prefill": 0.15, "tokens": 4, "gap": 0.01, "input_tokens": 50,
          "cached_tokens": 20}
#: Where each engine puts its account.
ENGINES = {LLAMA_CPP: "timings", VLLM: "metrics"}


provider = support.far_provider  # (a shared fixture)


def _clients(provider) -> dict[str, openai.OpenAI]:
    far = provider.far
    return {"near": openai.OpenAI(base_url=provider.base_url + "/v1", api_key="t",
                                  max_retries=0),
            "far": openai.OpenAI(base_url=far.base_url + "/v1", api_key="t", max_retries=0,
                                 http_client=openai.DefaultHttpxClient(
                                     verify=far.tls_client_context()))}


def _ask(client: openai.OpenAI, engine: str, stream: bool, include_usage: bool = True
         ) -> dict:
    """One call; the engine's account as the response carried it (`timings` or `metrics`)."""
    headers = script(engine=engine, **ANSWER)
    if not stream:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, extra_headers=headers)
        return raw.http_response.json()[ENGINES[engine]]
    last = None
    for last in client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers=headers,
            stream_options={"include_usage": include_usage}):
        pass
    return last.model_extra[ENGINES[engine]]


def _ns(ms: float) -> int:
    return round(ms * 1_000_000)


@timing
def test_vllm_metrics_near_and_far(provider):
    clients = _clients(provider)
    recorded = Recorded()
    for client in clients.values():  # first use of each client, not measured
        _ask(client, "vllm", stream=True)
    recorded.all()
    reported = [_ask(client, "vllm", stream=True) for client in clients.values()]
    timelines = recorded.all()
    for t, metrics in zip(timelines, reported):  # read as the server said them
        assert (t.server_queue, t.server_prefill) == (
            _ns(metrics["queue_time_ms"]), _ns(metrics["time_to_first_token_ms"]))
    near, far = (derive(t) for t in timelines)
    for d in (near, far):
        assert d.outside_server == d.ttft - d.server_queue - d.server_prefill
        assert_near(d.server_queue, 0.1, "server queue")  # what the provider really spent
        assert_near(d.server_prefill, 0.15, "server prefill")
    # near: what the client spent before the request left, and a loopback hop or two
    assert 0 <= near.outside_server - client_side(near) <= 15_000, near
    # far: a round trip more for the request and its first token, a TLS handshake more
    rtt_us = 2 * ONE_WAY_SECONDS * 1e6
    assert far.outside_server - near.outside_server >= 1.8 * rtt_us, (near, far)
    assert drops() == 0


@timing
def test_llama_cpp_timings_and_its_counts_without_usage(provider):
    client = _clients(provider)["near"]
    recorded = Recorded()
    _ask(client, "llama.cpp", stream=True, include_usage=False)
    recorded.all()
    timings = _ask(client, "llama.cpp", stream=True, include_usage=False)
    t = recorded.one()
    d = derive(t)
    assert (t.server_queue, t.server_prefill) == (None, _ns(timings["prompt_ms"]))
    assert_near(d.server_prefill, 0.15, "server prefill")
    # llama.cpp reports no wait for a slot: the server's wait is outside its account
    assert_near(d.outside_server - client_side(d), 0.1, "outside the server")
    # no usage in the stream: llama.cpp's counts stand in
    assert (t.input_tokens, t.cached_input_tokens, t.output_tokens) == (50, 20, 4)


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_a_non_streamed_call_records_the_servers_phases_only(provider, engine):
    client = _clients(provider)["near"]
    _ask(client, engine, stream=False)
    recorder = runtime.state().recorder
    labels = ("m", "local", names.UNKNOWN)  # (model, provider, route)
    recorded = {fam: {s.values: h.count for s, h in recorder.folded_copies(
        recorder.families[fam.name])} for fam in (names.SERVER_QUEUE, names.SERVER_PREFILL,
                                                  names.OUTSIDE_SERVER)}
    assert recorded == {names.SERVER_QUEUE: {labels: 1} if engine == "vllm" else {},
                        names.SERVER_PREFILL: {labels: 1},
                        names.OUTSIDE_SERVER: {}}  # its first token is its whole body


def test_a_server_account_out_of_bounds_is_not_recorded():
    """Values no server sends (negative, not numbers, absurd) record nothing, raise nothing."""
    for bad in (-1, "12", True, float("nan"), float("inf"), 1e15, None, [3], {}):
        with exporter.track(model="m") as call:
            shim_openai.server_account(call, {"prompt_ms": bad, "cache_n": bad, "prompt_n": 1},
                                       {"queue_time_ms": bad, "time_to_first_token_ms": bad})
            t = call.timeline
            assert (t.server_queue, t.server_prefill, t.input_tokens, t.cached_input_tokens) \
                == (None, None, None, None), bad
    assert drops() == 0
