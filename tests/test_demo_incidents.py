"""The demo's steady state and its incident day: each incident's knob, the provider and load
that read it, the far region's distance as the SDKs measure it, and the schedule."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics

import openai
import pytest

from exporter._internal.demo import incidents
from exporter._internal.demo.far_region import ONE_WAY_SECONDS, tls_available
from exporter._internal.demo.incidents import INCIDENTS, IncidentDay, Knobs, playing
from exporter._internal.demo.latency import LatencyModel, LatencySimulator, ModelProfile
from exporter._internal.demo.loadgen import MODELS, ROUTES, LoadGenerator, LoadShape
from exporter._internal.demo.provider import ProviderServer
from exporter._internal.record.timeline import derive
from tests import test_shim_support as support
from tests.support import skip_or_fail
from tests.test_shim_support import Recorded, script

# Shared fixtures of tests/test_shim_support.py.
instrumented = support.instrumented

MESSAGES = [{"role": "user", "content": "hi"}]


def test_default_load_keeps_every_queue_stable():
    """Offered load per model (calls/s x mean service time) stays well under its slots, with
    no prompt cache at all: the demo's queues do not grow in steady state."""
    model, shape = LatencyModel.default(), LoadShape()
    mean_input = statistics.fmean(ROUTES.values()) * math.exp(0.5 ** 2 / 2)  # lognormal mean
    for name, share in MODELS.items():
        profile = model.profile(name)
        busy = shape.rate * share * profile.mean_service_seconds(mean_input)
        assert busy / profile.slots < 0.6, (name, busy, profile.slots)
    deepseek = model.profile("deepseek-r1")
    assert 8 < deepseek.mean_service_seconds(mean_input) < 14  # a reasoning model is slow


def test_there_are_four_incidents_with_distinct_targets_and_playing_restores_calm():
    assert list(INCIDENTS) == ["prefill_surge", "cold_cache", "noisy_neighbour",
                               "route_change"]
    assert len({i.target for i in INCIDENTS.values()}) == 4
    knobs, calm = Knobs(), Knobs()
    seen = []
    for name in INCIDENTS:
        with playing(knobs, name, seen.append):
            assert knobs != calm, name
        assert knobs == calm, name
    assert len(seen) == 8 and seen[0].startswith("incident: long-prompt prefill surge")


def test_freeze_windows_repeat_on_the_clock():
    knobs = Knobs(freeze_model="m", freeze_seconds=6.0, freeze_every_seconds=8.0)
    assert knobs.frozen_until("m", 80.0) == 86.0
    assert knobs.frozen_until("m", 85.9) == 86.0
    assert knobs.frozen_until("m", 86.5) == 0.0  # the 2 s the model runs
    assert knobs.frozen_until("other", 80.0) == 0.0


def test_cold_cache_evicts_one_tenant_only():
    knobs = Knobs()
    sim = LatencySimulator(LatencyModel.default(), clock=lambda: 100.0, knobs=knobs)
    for tenant in ("tenant-01", "tenant-02"):
        sim.plan("gpt-4.1", tenant, 1000)
    assert sim.plan("gpt-4.1", "tenant-01", 1000).cached_tokens == 1000  # warm
    with playing(knobs, "cold_cache"):
        assert sim.plan("gpt-4.1", "tenant-01", 1000).cached_tokens == 0
        assert sim.plan("gpt-4.1", "tenant-02", 1000).cached_tokens == 1000
    assert sim.plan("gpt-4.1", "tenant-01", 1000).cached_tokens == 1000


def test_prefill_surge_lengthens_one_routes_prompts():
    knobs = Knobs()
    load = LoadGenerator("http://127.0.0.1:1", LoadShape(seed=3), knobs)
    calm = [load._pick() for _ in range(3000)]
    with playing(knobs, "prefill_surge"):
        surge = [load._pick() for _ in range(3000)]

    def mean_tokens(calls: list, route: str) -> float:
        return statistics.fmean(tokens for _, r, _, tokens in calls if r == route)

    ratio = mean_tokens(surge, "search") / mean_tokens(calm, "search")
    assert knobs.surge_factor * 0.85 < ratio < knobs.surge_factor * 1.15
    assert 0.85 < mean_tokens(surge, "chat") / mean_tokens(calm, "chat") < 1.15


async def test_noisy_neighbour_freezes_every_stream_of_its_model():
    profile = ModelProfile("m", slots=8, prefill_tokens_per_s=1e9, decode_tokens_per_s=50,
                           jitter=0.0, output_tokens=(40, 40), server_overhead_s=0.0)
    model = dataclasses.replace(LatencyModel.default(), models=(profile,))
    knobs = Knobs(freeze_seconds=0.4, freeze_every_seconds=0.6)
    with ProviderServer(model, knobs=knobs) as provider:
        async with openai.AsyncOpenAI(base_url=provider.base_url + "/v1", api_key="t",
                                      max_retries=0) as client:
            calm = await _gaps(client)
            with playing(knobs, "noisy_neighbour"):
                knobs.freeze_model = "m"  # the demo's target is llama-3-8b; this model is "m"
                frozen = await _gaps(client)
    assert max(calm) < 0.1  # 50 tokens/s: 20 ms apart
    assert max(frozen) > 0.25  # 0.8 s of tokens cross at least one 0.4 s freeze


async def _gaps(client: openai.AsyncOpenAI) -> list[float]:
    loop = asyncio.get_running_loop()
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    times = [loop.time() async for chunk in stream if chunk.choices and
             chunk.choices[0].delta.content]
    return [b - a for a, b in zip(times, times[1:])]


def test_far_region_moves_the_connect_and_server_phases_only(instrumented):  # noqa: F811
    """The same scripted call near and far: connect (TLS handshake) and server (request to
    headers) each take about one round trip more; prefill and decode do not move."""
    if not tls_available():
        skip_or_fail("neither cryptography nor openssl is available for the far region")
    recorded = Recorded()
    timings = script(server_wait=0.05, prefill=0.05, tokens=10, gap=0.01)
    with ProviderServer(far_region=True) as provider:
        assert provider.far is not None and provider.far.base_url.startswith("https://")
        near = openai.OpenAI(base_url=provider.base_url + "/v1", api_key="t", max_retries=0)
        far = openai.OpenAI(base_url=provider.far.base_url + "/v1", api_key="t",
                            max_retries=0, http_client=openai.DefaultHttpxClient(
                                verify=provider.far.tls_client_context()))
        phases = {}
        for name, client in (("near", near), ("far", far), ("far again", far)):
            list(client.chat.completions.create(model="gpt-4.1", messages=MESSAGES,
                                                stream=True, extra_headers=timings))
            phases[name] = {k: v / 1e6 for k, v in derive(recorded.one()).phases.items()}
    rtt = 2 * ONE_WAY_SECONDS
    for far_call in ("far", "far again"):  # the far region closes every connection
        far_phases = phases[far_call]
        assert far_phases["connect"] >= rtt * 0.9, phases
        assert far_phases["server"] - phases["near"]["server"] >= rtt * 0.8, phases
        for same in ("prefill", "decode"):
            assert abs(far_phases[same] - phases["near"][same]) < 0.03, (same, phases)
    assert phases["near"]["connect"] < rtt / 2


def test_incident_day_schedule_and_cold_tenant_idling():
    lines: list[str] = []
    knobs = Knobs()
    day = IncidentDay(knobs, calm_seconds=0.05, incident_seconds=0.1, out=lines.append,
                      idle_share=0.5)
    assert [p.incident for p in day.phases] == [None, *INCIDENTS, None]
    assert day.seconds == pytest.approx(0.05 * 2 + 0.1 * 4)
    idle_seen = []

    async def watch() -> None:
        while True:  # samples the knobs while the day plays
            idle_seen.append(knobs.idle_tenants)
            await asyncio.sleep(0.01)

    async def main() -> None:
        watcher = asyncio.create_task(watch())
        await day.run()
        watcher.cancel()

    asyncio.run(main())
    assert day.played == list(INCIDENTS) and knobs == Knobs()
    assert frozenset({"tenant-01"}) in idle_seen  # the cold tenant idled for a while
    text = "\n".join(lines)
    assert "incident day:" in text and "00:00:00  calm" in text
    assert text.count("incident: ") == 4 and text.count("recovered: ") == 4
    assert "incident day over" in text


def test_unknown_incident_names_are_refused():
    with pytest.raises(ValueError, match="unknown incidents"):
        IncidentDay(Knobs(), order=("meteor",))
    with pytest.raises(KeyError):
        with incidents.playing(Knobs(), "meteor"):
            pass
