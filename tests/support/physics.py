"""The issue-20 scenarios diagnose got wrong, scripted call by call for tests/test_diagnose.py,
which records them beside its own models and holds diagnose to naming each by how a call's
TTFT is made (queue + connect + send + server wait + prefill of the *uncached* tokens + first
decode).

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
"""

from __future__ import annotations

from exporter._internal.record.timeline import CallTimeline

MS = 1_000_000  # ns
#: (model, route) -> the cause diagnose must name (None: not degraded)
PHYSICS = {("m-surge-cached", "r"): "prefill_surge", ("m-surge-tenant", "r"): "prefill_surge",
           ("m-noisy-connect", "r"): "noisy_neighbour", ("m-two", "near"): "unknown",
           ("m-two", "moved"): "route_change"}
#: the provider's prefill speed: 0.2 ms per uncached token
PREFILL_MS_PER_TOKEN = 0.2


def physics_call(model: str, route: str, tenant: str, degraded: bool, n: int
                 ) -> CallTimeline:
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
