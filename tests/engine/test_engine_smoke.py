"""Calls through a real inference engine (llama.cpp's llama-server serving the tiny model,
bench/engine/), with the real openai SDK patched by `exporter.instrument()`, read back from the
exporter's /metrics as a user's Prometheus would read them.

`make engine-smoke` builds the engine first; `make test` leaves this folder out. Without the
build the tests skip (fail on CI). What the engine answers and why the numbers below hold:
docs/engine.md.
"""

from __future__ import annotations

import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import exporter
from bench.engine import build, prompts
from bench.engine.server import LlamaServer, Options
from bench.engine.upstreams import FAR_HOST, FarUpstream
from exporter._internal import names
from tests.support import skip_or_fail

ROUTE = "engine-smoke"
#: The network and SDK phases of a call (the reasoning and decode phases come after TTFT).
TTFT_PHASES = ("queue", "connect", "send", "server", "prefill")
SYSTEM_TOKENS = 2400

Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def engine() -> LlamaServer:
    built = build.installed()
    if built is None:
        skip_or_fail("the engine is not built: make engine (or make engine-smoke)")
    with LlamaServer(built.server, built.model, Options(parallel=2, threads=1)) as server:
        yield server


@pytest.fixture
def metrics_url() -> str:
    exporter.instrument()
    server = exporter.start_http_server(port=0)
    yield server.url
    server.stop()
    exporter.uninstrument()


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def client(engine: LlamaServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.openai_base_url, api_key="none", max_retries=0)


def streamed_call(c: openai.OpenAI, system: str) -> dict:
    """A streamed chat call with usage; returns the engine's own `timings` (an extra field
    of the usage chunk)."""
    timings: dict = {}
    with exporter.labels(route=ROUTE, tenant="smoke"):
        stream = c.chat.completions.create(
            model="any-name", stream=True, stream_options={"include_usage": True},
            max_tokens=8, extra_body={"ignore_eos": True},
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": "Where does the time to first token go?"}])
        for chunk in stream:
            timings = (chunk.model_extra or {}).get("timings") or timings
    return timings


def one_call(after: Samples, before: Samples) -> dict[str, float]:
    """The call recorded between two scrapes: its TTFT, its phases, its token counts."""
    route = {"route": ROUTE}
    assert delta(after, before, names.TTFT.name + "_count", **route) == 1
    call = {"ttft": delta(after, before, names.TTFT.name + "_sum", **route),
            "input": delta(after, before, names.INPUT_TOKENS.name + "_sum", **route),
            "cached": delta(after, before, names.CACHED_INPUT_TOKENS.name + "_sum", **route)}
    for phase in TTFT_PHASES:
        count = delta(after, before, names.PHASE_FAMILY.name + "_count", phase=phase, **route)
        if count:
            assert count == 1, phase
            call[phase] = delta(after, before, names.PHASE_FAMILY.name + "_sum", phase=phase,
                                **route)
    return call


def test_a_long_prompt_cold_then_warm_through_the_real_engine(engine, metrics_url):
    vocab = engine.model
    system = prompts.text(vocab, SYSTEM_TOKENS, seed=32)
    c = client(engine)
    before = scrape(metrics_url)
    cold_timings = streamed_call(c, system)
    after_cold = scrape(metrics_url)
    warm_timings = streamed_call(c, system)
    after_warm = scrape(metrics_url)
    cold, warm = one_call(after_cold, before), one_call(after_warm, after_cold)

    # the engine's own account: the first call prefilled the prompt, the second read it back
    assert cold_timings["cache_n"] == 0 and cold_timings["prompt_n"] > SYSTEM_TOKENS
    assert warm_timings["cache_n"] >= SYSTEM_TOKENS and warm_timings["prompt_n"] <= 2
    # ... and what the exporter recorded of it, from the SDK's usage
    assert cold["input"] == warm["input"] == cold_timings["prompt_n"]
    assert cold["cached"] == 0
    assert warm["cached"] == warm_timings["cache_n"] >= 0.95 * warm["input"]
    # TTFT: the client waited at least for the engine's prefill, and less once it was cached
    assert cold["ttft"] >= cold_timings["prompt_ms"] / 1000
    assert warm["ttft"] < cold["ttft"]
    # the cold call opened the connection: every phase up to the first token was stamped
    assert set(TTFT_PHASES) <= cold.keys(), cold
    for call in (cold, warm):
        assert {"queue", "send", "server", "prefill"} <= call.keys(), call
        phases = [call[p] for p in TTFT_PHASES if p in call]
        assert all(p >= 0 for p in phases), call
        assert sum(phases) <= call["ttft"] + 1e-6, call  # (µs rounding of each phase)
    # the engine's prefill happened after the request was sent, before the first token
    assert cold["server"] + cold["prefill"] >= cold_timings["prompt_ms"] / 1000
    # labels: the response's model (the engine's alias, not the name asked), the upstream
    assert value(after_warm, names.REQUESTS_TOTAL, model=engine.options.alias, route=ROUTE,
                 outcome="ok") == 2
    assert value(after_warm, names.UPSTREAM_REQUESTS, route=ROUTE,
                 address=f"127.0.0.1:{engine.port}") == 2


def test_a_non_streamed_call_through_the_real_engine(engine, metrics_url):
    system = prompts.text(engine.model, 600, seed=33)
    before = scrape(metrics_url)
    with exporter.labels(route=ROUTE, tenant="smoke"):
        completion = client(engine).chat.completions.create(
            model="any-name", max_tokens=4,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
    after = scrape(metrics_url)
    usage = completion.usage
    assert completion.system_fingerprint == build.fingerprint_of(build.PRIMARY_BUILD)
    route = {"route": ROUTE}
    assert delta(after, before, names.REQUESTS_TOTAL, outcome="ok",
                 model=engine.options.alias, **route) == 1
    assert delta(after, before, names.DURATION.name + "_count", **route) == 1
    duration = delta(after, before, names.DURATION.name + "_sum", **route)
    assert duration >= completion.model_extra["timings"]["prompt_ms"] / 1000
    assert delta(after, before, names.INPUT_TOKENS.name + "_sum", **route) == \
        usage.prompt_tokens > 600
    assert delta(after, before, names.OUTPUT_TOKENS.name + "_sum", **route) == \
        usage.completion_tokens == 4
    assert delta(after, before, names.CACHED_INPUT_TOKENS.name + "_sum", **route) == \
        usage.prompt_tokens_details.cached_tokens



def test_the_far_upstream_differs_on_the_wire(metrics_url):
    """The second upstream (bench/engine/upstreams.py): another address, another build's
    fingerprint, and a round trip of 2 x `one_way` more before the response's headers."""
    built = build.installed()
    if built is None:
        skip_or_fail("the engine is not built: make engine (or make engine-smoke)")
    one_way = 0.1
    with FarUpstream(built, one_way=one_way) as far:
        address = far.base_url.removeprefix("http://")
        c = openai.OpenAI(base_url=far.openai_base_url, api_key="none", max_retries=0)
        before = scrape(metrics_url)
        with exporter.labels(route=ROUTE, tenant="smoke"):
            chunks = list(c.chat.completions.create(
                model="any-name", stream=True, max_tokens=4,
                messages=[{"role": "user", "content": "Which region answers?"}]))
        after = scrape(metrics_url)
    assert address.startswith(FAR_HOST + ":")
    assert {chunk.system_fingerprint for chunk in chunks} == \
        {build.fingerprint_of(build.ALTERNATE_BUILD)}
    assert delta(after, before, names.UPSTREAM_REQUESTS, route=ROUTE, address=address) == 1
    server_phase = delta(after, before, names.PHASE_FAMILY.name + "_sum", phase="server",
                         route=ROUTE)
    assert server_phase >= 2 * one_way


#: What a loopback call may spend outside the engine's own queue and prefill: the SDK and the
#: shim, the engine's HTTP layer, templating and tokenizing, and the first decode step
#: (docs/engine.md: headers 114 ms after a cold 2,021-token request on a loaded machine).
LOOPBACK_OUTSIDE = 0.5


def test_the_clients_phases_bracket_the_servers_own(engine, metrics_url):
    """Issue 32 item 5: the engine's `timings` recorded beside the client's phases. The client
    sees the first token only after the server prefilled the prompt, so client TTFT >= server
    queue + server prefill; the rest (the network and everything outside the engine's
    scheduler) is measured, >= 0 and small on loopback."""
    system = prompts.text(engine.model, SYSTEM_TOKENS, seed=34)
    before = scrape(metrics_url)
    timings = streamed_call(client(engine), system)
    after = scrape(metrics_url)
    route = {"route": ROUTE}

    def family(f: names.Family) -> tuple[float, float]:
        return (delta(after, before, f.name + "_count", **route),
                delta(after, before, f.name + "_sum", **route))

    ttft_calls, ttft = family(names.TTFT)
    prefill_calls, prefill = family(names.SERVER_PREFILL)
    queue_calls, queue = family(names.SERVER_QUEUE)
    outside_calls, outside = family(names.OUTSIDE_SERVER)
    assert ttft_calls == prefill_calls == outside_calls == 1
    assert queue_calls == 0  # llama.cpp reports no queue time (vLLM's metrics do)
    assert prefill == pytest.approx(timings["prompt_ms"] / 1000, abs=1e-5)
    assert ttft >= queue + prefill
    assert outside == pytest.approx(ttft - queue - prefill, abs=1e-5)
    assert 0 <= outside < LOOPBACK_OUTSIDE, (ttft, prefill, outside)
