"""Scenarios diagnose got wrong, scripted call by call for tests/test_diagnose.py, which
records them beside its own models and holds diagnose to naming each by how a call's TTFT is
made: retry (earlier attempts and their backoff) + queue + connect + send + server wait +
prefill of the *uncached* tokens (a real engine sends its headers first, so its own queue and
hidden reasoning land here too) + first decode.

Issue 20:
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

Issue 32 (the wrong answers on a provider with a per-tenant prefix cache):
- m-cache-fleet: a deploy puts a timestamp at the top of route `a`'s system prompt: every
  tenant's prefix ends at the first token, its cached share 85 % -> 0 with the input unchanged
  (TTFT ×4.5); route `b` of the same tenants keeps its cache: a cold cache, whoever it hits.
- m-saturate: uncached tokens per call 4k -> 40k on an engine whose prefill per token grows
  with the position (attention): seconds per 1k uncached tokens ×2.4, and its chunked prefills
  stall half the other streams for a chunk: a surge.
- m-overload: the provider is overloaded: 1 call in 15 is answered 529 once and retried after
  the SDK's backoff (the retry phase), prefill ×1.8, a 1 s stall on a third of the calls; the
  calls hold their connections longer, so a third wait for the client's pool (the queue
  phase): a noisy neighbour (the provider's batch), not a starved client.
- m-reasoning: a reasoning model thinks 3 s longer before its first visible token, hidden
  (headers at once, no token events, usage counts the reasoning tokens); input, cache, stalls
  and decode unchanged: `unknown`, not a neighbour.
- m-loop: a neighbour on the model (2 s freezes, its prefill chunk ahead of each call) while
  the client's event loop, loaded by the frozen streams, answers each new loopback connection
  late (8 -> 70 ms, and more calls open one): a noisy neighbour, not a route change.
- m-rollout: a new system fingerprint on every call (a rollout) during a surge of the prompts'
  new part, at the same speed: a surge, not a route change.
- m-behind: the provider's front door (the same address and region header) sends the calls to
  a backend of another build farther behind it (a new system fingerprint, the server wait
  50 -> 250 ms); prompts, cache and decode unchanged: a route change behind one address.
"""

from __future__ import annotations

from exporter._internal import names
from exporter._internal.record.timeline import CallTimeline

MS = 1_000_000  # ns
#: (model, route) -> the cause diagnose must name
PHYSICS = {("m-surge-cached", "r"): "prefill_surge", ("m-surge-tenant", "r"): "prefill_surge",
           ("m-noisy-connect", "r"): "noisy_neighbour", ("m-two", "near"): "unknown",
           ("m-two", "moved"): "route_change", ("m-cache-fleet", "a"): "cold_cache",
           ("m-saturate", "r"): "prefill_surge", ("m-overload", "r"): "noisy_neighbour",
           ("m-reasoning", "r"): "unknown", ("m-loop", "r"): "noisy_neighbour",
           ("m-rollout", "r"): "prefill_surge", ("m-behind", "r"): "route_change"}
#: (model, route)s recorded beside them that nothing degrades: no finding
CALM = (("m-cache-fleet", "b"),)
#: the provider's prefill speed: 0.2 ms per uncached token
PREFILL_MS_PER_TOKEN = 0.2
#: m-saturate's engine: ms per token at position 0, and the position at which attention has
#: doubled it
SATURATE_MS_PER_TOKEN, ATTENTION_DOUBLES_AT = 0.05, 10_000


def saturated_prefill_ms(cached: int, uncached: int) -> float:
    """Prefill of `uncached` tokens after `cached` ones, each at SATURATE_MS_PER_TOKEN ×
    (1 + position / ATTENTION_DOUBLES_AT): the linear part and attention over the context."""
    end = cached + uncached
    return SATURATE_MS_PER_TOKEN * (uncached + (end * end - cached * cached)
                                    / (2 * ATTENTION_DOUBLES_AT))


def physics_call(model: str, route: str, tenant: str, degraded: bool, n: int
                 ) -> CallTimeline:
    """Call `n` of (model, route) for `tenant`; `degraded` plays its scenario."""
    cached, user, connect, server, freeze = 1200, 300, 0.0, 50.0, 0.0
    queue, retry, hidden, output = 1.0, 0.0, 0.0, 10
    address, region, fingerprint = "10.0.0.1:443", "near", "fp_1"
    prefill = None  # ms; None: the uncached part at PREFILL_MS_PER_TOKEN
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
    elif model == "m-cache-fleet":
        cached, user = 3400, 600
        if degraded and route == "a":  # the prefix now ends at the first token
            cached, user = 0, 4000
    elif model == "m-saturate":
        cached, user = 1000, 40_000 if degraded else 4000
        prefill = saturated_prefill_ms(cached, user)
        if degraded and n % 2:  # a chunk of another call's prefill ahead of this stream
            freeze = 300.0
    elif model == "m-overload" and degraded:
        prefill = 1.8 * user * PREFILL_MS_PER_TOKEN
        freeze = 1000.0 if n % 3 == 0 else 0.0
        queue = 80.0 if n % 3 == 1 else 1.0  # every pooled connection held by a longer call
        retry = 700.0 if n % 15 == 0 else 0.0  # a 529 after ~200 ms, the SDK's ~0.5 s backoff
    elif model == "m-reasoning" and degraded:
        hidden, output = 3000.0, 310
    elif model == "m-loop":
        opens = n % 10 < (4 if degraded else 2)
        connect = (70.0 if degraded else 8.0) if opens else 0.0
        if degraded:
            server, freeze, prefill = 37.0, 2000.0, 1500.0 + user * PREFILL_MS_PER_TOKEN
        else:
            server = 30.0
    elif model == "m-rollout":
        cached, user = 1536, 8000 if degraded else 400
        fingerprint = "fp_2" if degraded else "fp_1"
    elif model == "m-behind" and degraded:
        fingerprint, server = "fp_2", 250.0
    if prefill is None:
        prefill = user * PREFILL_MS_PER_TOKEN  # the uncached part prefilled
    t = CallTimeline(start=0, model=model, provider="p", route=route, tenant=tenant)
    attempt = round(retry * MS)
    if retry:
        t.attempt_start, t.retries = attempt, {names.RETRY_OVERLOADED: 1}
    t.dispatched = attempt + round(queue * MS)
    t.connected = t.dispatched + round(connect * MS)
    t.sent = t.connected + MS
    t.headers = t.sent + round(server * MS)
    at = t.headers + round((prefill + hidden) * MS)
    for i in range(10):
        t.token(at)
        at += round((freeze if i == 4 and freeze else 20.0) * MS)
    t.end = at
    t.outcome = "ok"
    t.input_tokens, t.cached_input_tokens, t.output_tokens = cached + user, cached, output
    if hidden:
        t.reasoning_output_tokens = output - 10
    t.upstream_address, t.upstream_region, t.fingerprint = address, region, fingerprint
    return t
