"""`ttft-exporter diagnose` names the causes the issue-20 scenarios got wrong, read by two real
Prometheus servers (classic and native histograms): the decision reads how a call's TTFT is
made (queue + connect + send + server wait + prefill of the *uncached* tokens + first decode).

- m-surge-cached: the user part of the prompt grows from 400 to 8,000 tokens while a 1,536-token
  prefix stays cached (input ×4.9, uncached ×20, prefill ×20 at the same speed): a surge.
- m-surge-tenant: tenant t0's prompts grow from 300 to 8,000 uncached tokens, its cached
  prefix still cached; the other tenants unchanged: a surge confined to t0, naming it.
- m-noisy-connect: a neighbour freezes every stream and its longer streams make the pool open
  a connection for 8 of 10 calls instead of 1 (each costing the same 100 ms: the connect mean
  10 -> 80 ms): a noisy neighbour, not a route change.
- m-two: route `moved` reaches another host (new address and region, a farther round trip)
  while route `near` gets a server-wait step on the same upstream: `moved` is a route change,
  `near` is `unknown` (per model, half of m-two's calls moved, which named `near` a route
  change too).

Calls are `CallTimeline`s recorded straight into the exporter's recorder, 4 s windows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from exporter._internal import runtime
from exporter._internal.config import loader as config_loader
from exporter._internal.record.timeline import CallTimeline
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config

MS = 1_000_000  # ns
WINDOW = 4.0
#: (model, route) -> the cause diagnose must name (None: not degraded)
EXPECTED = {("m-surge-cached", "r"): "prefill_surge", ("m-surge-tenant", "r"): "prefill_surge",
            ("m-noisy-connect", "r"): "noisy_neighbour", ("m-two", "near"): "unknown",
            ("m-two", "moved"): "route_change"}
TENANTS = ("t0", "t1", "t2", "t3")
#: the provider's prefill speed: 0.2 ms per uncached token
PREFILL_MS_PER_TOKEN = 0.2


def scripted(model: str, route: str, tenant: str, degraded: bool, n: int) -> CallTimeline:
    """Call `n` of (model, route) for `tenant`; `degraded` plays its scenario."""
    cached, user, connect, server, freeze = 1200, 300, 0.0, 50.0, 0.0
    address, region = "10.0.0.1:443", "near"
    if model == "m-surge-cached":
        cached, user = 1536, 8000 if degraded else 400
    elif model == "m-surge-tenant" and degraded and tenant == "t0":
        user = 8000
    elif model == "m-noisy-connect":
        opens = n % 10 < (8 if degraded else 1)  # the pool opens a connection for this call
        connect = 100.0 if opens else 0.0
        if degraded:
            server, freeze = 500.0, 2000.0
    elif model == "m-two" and degraded:
        if route == "moved":
            address, region, connect, server = "10.9.9.9:443", "far", 120.0, 210.0
        else:
            server = 450.0
    t = CallTimeline(start=0, model=model, provider="p", route=route, tenant=tenant)
    t.dispatched = MS
    t.connected = t.dispatched + round(connect * MS)
    t.sent = t.connected + MS
    t.headers = t.sent + round(server * MS)
    at = t.headers + round(user * PREFILL_MS_PER_TOKEN * MS)  # the uncached part prefilled
    for i in range(10):
        t.token(at)
        at += round((freeze if i == 4 and freeze else 20.0) * MS)
    t.end = at
    t.outcome = "ok"
    t.input_tokens, t.cached_input_tokens, t.output_tokens = cached + user, cached, 10
    t.upstream_address, t.upstream_region, t.fingerprint = address, region, "fp_1"
    return t


@pytest.fixture(scope="module")
def run() -> Iterator[dict[str, Any]]:
    require_prometheus()
    runtime.configure(config_loader.load({}))
    server = runtime.start_http_server(port=0)
    target = server.url.split("//", 1)[1].split("/", 1)[0]
    stop, degraded = threading.Event(), threading.Event()
    proms: dict[str, PrometheusServer] = {}

    def feed() -> None:  # every (model, route) and tenant 4 calls/s
        recorder = runtime.state().recorder
        calls = dict.fromkeys(EXPECTED, 0)
        while not stop.wait(0.25):
            for model, route in EXPECTED:
                for tenant in TENANTS:
                    calls[(model, route)] += 1
                    recorder.record_call(scripted(model, route, tenant, degraded.is_set(),
                                                  calls[(model, route)]))

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        for mode, flags in (("classic", []), ("native", ["--enable-feature=native-histograms"])):
            proms[mode] = PrometheusServer(scrape_config(target), extra_flags=flags)
        for prom in proms.values():
            prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
        feeder.start()
        time.sleep(2 * WINDOW)  # the calm baseline
        changed = time.time()
        degraded.set()
        time.sleep(WINDOW + 2)
        yield {"proms": proms, "at": time.time(), "changed": changed}
    finally:
        stop.set()
        for prom in proms.values():
            prom.stop()
        server.stop()
        runtime.configure(None)


@pytest.mark.parametrize("mode", ["classic", "native"])
def test_diagnose_names_each_scenario_by_how_ttft_is_made(run: dict[str, Any],
                                                           mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "diagnose", "--prometheus", run["proms"][mode].url,
         "--json", "--at", f"{run['at']:.3f}", "--since", f"{WINDOW:g}s", "--baseline",
         f"{WINDOW:g}s", "--baseline-at", f"{run['changed'] - 1:.3f}", "--min-calls", "5"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    findings = {(f["model"], f["route"]): f for f in json.loads(proc.stdout)}
    assert {k: f["cause"] for k, f in findings.items()} == EXPECTED, findings
    surge = findings[("m-surge-cached", "r")]["evidence"]
    # the prefill grew with the uncached work, at the server's usual speed (0.2 s per 1k;
    # rate() extrapolates each series at the window's edges: ratios of two are a little off)
    # (a scrape stamped just before the change may be served after it: a few calls off)
    assert surge["uncached_input_tokens_per_call_now"] == pytest.approx(8000, rel=0.1)
    assert surge["uncached_input_tokens_per_call_baseline"] == pytest.approx(400, rel=0.25)
    for key in ("now", "baseline"):
        assert surge[f"prefill_seconds_per_1k_uncached_tokens_{key}"] == \
            pytest.approx(PREFILL_MS_PER_TOKEN, rel=0.15)
    assert findings[("m-surge-tenant", "r")]["tenants"] == ["t0"]
    assert findings[("m-surge-cached", "r")]["tenants"] == []
    assert findings[("m-two", "near")]["evidence"]["new_upstream_share"] == 0
