"""Randomised (model, route) worlds and what can happen to them: the evaluation generator's
scenarios (bench/diagnose_eval.py runs the real decision on them).

A call's TTFT is built the way a provider makes it: queue + connect (a pooled connection costs
nothing, a new one a few round trips) + send + server wait (a round trip and the provider's
queue) + prefill of the *uncached* input tokens at the server's speed + the first decode step.
Each tenant has a prompt prefix its provider caches while it is warm; the rest of the prompt is
new each call. Latencies are heavy-tailed (lognormal, and a small share of calls far slower).

Each scenario is one (model, route) over two windows, the baseline calm and the diagnosed one
with an `Effect`: an incident (a cause of evidence.thresholds.CAUSES with a magnitude), two at once, a
non-incident that looks like one, or nothing (a calm pair). `window_signals` turns a window's
calls into the `causes.Window` diagnose would read from Prometheus: means from sums and counts,
the log moments from the classic buckets the exporter serves, ratios of the usage counters,
calls per upstream identity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from exporter._internal.config.settings import DEFAULT_SECONDS_BUCKETS, DEFAULT_TOKEN_BUCKETS
from exporter._internal.diagnose.causes import Window
from exporter._internal.evidence.thresholds import (COLD_CACHE, NOISY_NEIGHBOUR, PREFILL_SURGE,
                                                    ROUTE_CHANGE, UNKNOWN)
from exporter._internal.evidence.signals import OPENED
from exporter._internal.diagnose.noise import from_cumulative, log_moments, opened
from exporter._internal.diagnose.upstreams import new_upstream_shares

#: The non-incidents, each with the findings that are not false (None: nothing degraded).
LOOKALIKES: dict[str, frozenset[str | None]] = {
    "calm": frozenset({None}),
    "one_tenant_longer_prompts": frozenset({None, UNKNOWN, PREFILL_SURGE}),
    "server_wait_step": frozenset({None, UNKNOWN}),
    "prompt_template_change": frozenset({None, UNKNOWN}),
    "traffic_mix_shift": frozenset({None}),
    "diurnal_rate_change": frozenset({None}),
    "provider_errors": frozenset({None, UNKNOWN}),
    "client_cpu_starvation": frozenset({None, UNKNOWN}),
}
INCIDENTS = (PREFILL_SURGE, COLD_CACHE, NOISY_NEIGHBOUR, ROUTE_CHANGE)
#: An incident's magnitude, the same for every cause: the mean TTFT the decision judges, now /
#: baseline: the route's, a cold cache's tenants' (its path is per tenant). An incident that
#: adds less than the decision's floor (0.1 s) to that mean is no degradation: counted apart.
MAGNITUDE = "the TTFT mean it raises (the route's; a cold cache's tenants'), now / baseline"
FLOOR = 0.1
#: The send phase of every call: the request's bytes leave the client (seconds).
SEND = 0.001


@dataclass(frozen=True)
class Route:
    """The calm world of one (model, route)."""

    rate: float  # calls per second
    tenants: int
    zipf: float  # tenant popularity exponent
    cached_share: float  # share of a prompt in the tenant's cached prefix, while warm
    prompt: float  # median input tokens per call
    prompt_sigma: float
    speed: float  # prefill seconds per uncached input token
    server: float  # median server wait (seconds)
    server_sigma: float
    rtt: float  # one network round trip (seconds)
    pooled: float  # share of calls on a pooled connection
    stall: float  # median largest stall per call
    tail: float  # share of calls far slower (a heavy tail)


@dataclass(frozen=True)
class Effect:
    """What changed in the diagnosed window (defaults: nothing)."""

    prompt_factor: float = 1.0  # the new part of the prompt × this
    prompt_tenants: int = 0  # ...for the first k tenants only (0: all)
    cold_tenants: int = 0  # the first k tenants' caches miss
    template: bool = False  # a new prefix: each tenant's first call misses, then warm
    speed_factor: float = 1.0  # prefill seconds per token × this
    freeze: float = 0.0  # a neighbour freezes the batch: seconds of stall per call
    server_factor: float = 1.0
    server_add: float = 0.0
    rtt_add: float = 0.0  # a farther route: seconds added to each round trip
    new_identity: bool = False  # ...reached at another upstream identity
    pooled: float | None = None  # share of calls on a pooled connection
    rate_factor: float = 1.0
    failed_share: float = 0.0  # calls that end before a first token (errors, timeouts)
    client_delay: float = 0.0  # a starved client: seconds late at each step it stamps


@dataclass
class Scenario:
    seed: int
    kind: str  # a cause, "two:<a>+<b>", or a LOOKALIKES key
    route: Route
    effect: Effect
    #: the incident's size: MAGNITUDE (set by `windows`), and the seconds it added
    magnitude: float = 0.0
    added: float = 0.0
    #: findings that are right: the cause(s), or the look-alike's allowed findings
    allowed: frozenset[str | None] = field(default_factory=frozenset)
    window_seconds: float = 300.0


def _loguniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def random_route(rng: np.random.Generator) -> Route:
    """A calm world over the ranges the issue names: 0.2-50 calls/s, 1-500 tenants, 0-95 %
    cached, heavy tails."""
    return Route(rate=_loguniform(rng, 0.2, 50), tenants=int(_loguniform(rng, 1, 500)),
                 zipf=float(rng.uniform(0.5, 1.5)), cached_share=float(rng.uniform(0, 0.95)),
                 prompt=_loguniform(rng, 200, 20000), prompt_sigma=float(rng.uniform(0.2, 1.0)),
                 speed=_loguniform(rng, 2e-5, 4e-4), server=_loguniform(rng, 0.02, 0.5),
                 server_sigma=float(rng.uniform(0.2, 1.0)), rtt=_loguniform(rng, 0.001, 0.08),
                 pooled=float(rng.uniform(0.5, 0.98)), stall=_loguniform(rng, 0.02, 0.3),
                 tail=float(rng.uniform(0, 0.03)))


def incident(rng: np.random.Generator, cause: str, route: Route) -> tuple[Effect, float, Route]:
    """An incident of `cause` from barely detectable to severe: its effect and magnitude (and
    the route, made able to show it: a cold cache needs a cached prefix)."""
    if cause == PREFILL_SURGE:
        factor = _loguniform(rng, 1.2, 30)
        confined = int(rng.integers(1, 4)) if rng.random() < 0.3 and route.tenants >= 4 else 0
        return Effect(prompt_factor=factor, prompt_tenants=confined), factor, route
    if cause == COLD_CACHE:
        route = replace(route, cached_share=float(rng.uniform(0.5, 0.95)),
                        tenants=max(route.tenants, 4))
        cold = max(1, int(route.tenants * rng.uniform(0, 0.2)))
        added = route.prompt * route.cached_share * route.speed
        return Effect(cold_tenants=min(cold, 3)), added, route
    if cause == NOISY_NEIGHBOUR:
        freeze = _loguniform(rng, 0.05, 5)
        return Effect(freeze=freeze, server_factor=1 + rng.uniform(0, 2),
                      speed_factor=1 + rng.uniform(0, 1),
                      pooled=route.pooled * float(rng.uniform(0.3, 1))), freeze, route
    if cause == ROUTE_CHANGE:
        added = _loguniform(rng, 0.005, 0.3)
        return Effect(rtt_add=added, new_identity=bool(rng.random() < 0.7)), added, route
    raise ValueError(cause)


def lookalike(rng: np.random.Generator, kind: str, route: Route) -> tuple[Effect, Route]:
    """A change that is no incident of the four causes, sized as it happens in production."""
    if kind == "one_tenant_longer_prompts":
        return Effect(prompt_factor=_loguniform(rng, 1.5, 10), prompt_tenants=1), route
    if kind == "server_wait_step":
        return Effect(server_add=_loguniform(rng, 0.05, 2)), route
    if kind == "prompt_template_change":
        return Effect(template=True, prompt_factor=float(rng.uniform(0.8, 1.25))), route
    if kind == "traffic_mix_shift":  # traffic moves to another route: fewer, colder calls
        return Effect(rate_factor=float(rng.uniform(0.2, 0.6)),
                      pooled=route.pooled * float(rng.uniform(0.5, 1))), route
    if kind == "diurnal_rate_change":
        return Effect(rate_factor=_loguniform(rng, 0.3, 3)), route
    if kind == "provider_errors":
        return Effect(failed_share=float(rng.uniform(0.05, 0.5))), route
    if kind == "client_cpu_starvation":
        return Effect(client_delay=_loguniform(rng, 0.02, 1)), route
    return Effect(), route


def scenario(seed: int) -> Scenario:
    """Scenario `seed`: 40 % one incident, 10 % two at once, 50 % a non-incident (a third of
    them calm pairs)."""
    rng = np.random.default_rng(seed)
    route = random_route(rng)
    draw = rng.random()
    if draw < 0.4:
        cause = INCIDENTS[int(rng.integers(len(INCIDENTS)))]
        effect, magnitude, route = incident(rng, cause, route)
        return Scenario(seed, cause, route, effect, magnitude, allowed=frozenset({cause}))
    if draw < 0.5:
        a, b = rng.choice(len(INCIDENTS), 2, replace=False)
        first, _, route = incident(rng, INCIDENTS[a], route)
        second, _, route = incident(rng, INCIDENTS[b], route)
        merged = replace(first, **{k: v for k, v in vars(second).items()
                                   if v != getattr(Effect(), k)})
        return Scenario(seed, f"two:{INCIDENTS[a]}+{INCIDENTS[b]}", route, merged,
                        allowed=frozenset({INCIDENTS[a], INCIDENTS[b], UNKNOWN}))
    kinds = list(LOOKALIKES)
    kind = "calm" if draw < 0.5 + 0.5 / 3 else kinds[1 + int(rng.integers(len(kinds) - 1))]
    effect, route = lookalike(rng, kind, route)
    return Scenario(seed, kind, route, effect, allowed=LOOKALIKES[kind])


# --- the calls of one window ------------------------------------------------------------------

@dataclass
class Calls:
    """One window's calls as columns (seconds, tokens), and each call's tenant."""

    tenant: np.ndarray
    queue: np.ndarray
    connect: np.ndarray
    server: np.ndarray
    prefill: np.ndarray
    ttft: np.ndarray
    stall: np.ndarray
    input_tokens: np.ndarray
    cached: np.ndarray
    upstream: tuple[str, str, str]


def calls(rng: np.random.Generator, route: Route, effect: Effect, seconds: float) -> Calls:
    """The calls that reached a first token over `seconds` (failed calls have no TTFT)."""
    n = int(rng.poisson(route.rate * effect.rate_factor * seconds * (1 - effect.failed_share)))
    weights = 1 / np.arange(1, route.tenants + 1) ** route.zipf
    tenant = rng.choice(route.tenants, n, p=weights / weights.sum())
    prefix = np.full(n, route.prompt * route.cached_share)
    new_part = route.prompt * (1 - route.cached_share) * rng.lognormal(0, route.prompt_sigma, n)
    grows = tenant < effect.prompt_tenants if effect.prompt_tenants else np.ones(n, bool)
    new_part = np.where(grows, new_part * effect.prompt_factor, new_part)
    warm = rng.random(n) < 0.97  # a rare miss: an evicted prefix
    warm &= tenant >= effect.cold_tenants
    if effect.template:  # each tenant's first call in the window misses
        first = np.zeros(n, bool)
        first[np.unique(tenant, return_index=True)[1]] = True
        warm &= ~first
    input_tokens = np.round(prefix + new_part)
    cached = np.where(warm, np.round(prefix), 0.0)
    uncached = input_tokens - cached
    slow = np.where(rng.random(n) < route.tail, rng.lognormal(1, 1, n), 1.0)
    rtt = route.rtt + effect.rtt_add
    pooled = route.pooled if effect.pooled is None else effect.pooled
    late = effect.client_delay * rng.lognormal(0, 0.5, (4, n)) if effect.client_delay else \
        np.zeros((4, n))
    queue = 0.001 * rng.lognormal(0, 0.5, n) + late[0]
    connect = np.where(rng.random(n) < pooled, 0.0, 3 * rtt * rng.lognormal(0, 0.2, n)) + late[1]
    server = (route.server * rng.lognormal(0, route.server_sigma, n) * effect.server_factor
              + effect.server_add + rtt) * slow + late[2]
    prefill = uncached * route.speed * effect.speed_factor * rng.lognormal(0, 0.25, n) * slow \
        + late[3]
    first_decode = 0.02 * rng.lognormal(0, 0.3, n)
    ttft = queue + connect + SEND + server + prefill + first_decode
    stall = route.stall * rng.lognormal(0, 0.5, n)
    if effect.freeze:
        stall = stall + np.where(rng.random(n) < 0.8, effect.freeze * rng.uniform(0.5, 1.5, n), 0)
    identity = ("10.9.0.2:443", "far", "fp_2") if effect.new_identity else \
        ("10.0.0.1:443", "near", "fp_1")
    return Calls(tenant, queue, connect, server, prefill, ttft, stall, input_tokens, cached,
                 identity)


def _buckets(values: np.ndarray, bounds: tuple[float, ...]) -> list[tuple[float, float, float]]:
    """The classic buckets diagnose reads (as noise.py takes them)."""
    cumulative = [(b, float(np.count_nonzero(values <= b))) for b in bounds]
    cumulative.append((math.inf, float(values.size)))
    return from_cumulative(cumulative)


def window_signals(c: Calls) -> Window:
    """The window as diagnose reads it from Prometheus (one route per model)."""
    n = c.ttft.size
    w = Window(calls=float(n))
    if n == 0:
        return w
    w.ttft = w.first_answer = float(c.ttft.mean())
    w.input_tokens = float(c.input_tokens.mean())
    w.uncached_per_call = float((c.input_tokens - c.cached).mean())
    w.stall = float(c.stall.mean())
    w.phases = {"queue": float(c.queue.mean()), "connect": float(c.connect.mean()),
                "server": float(c.server.mean()),
                "prefill": float(c.prefill.mean())}
    for key, values, bounds in (("ttft", c.ttft, DEFAULT_SECONDS_BUCKETS),
                                ("first_answer", c.ttft, DEFAULT_SECONDS_BUCKETS),
                                ("input_tokens", c.input_tokens, DEFAULT_TOKEN_BUCKETS),
                                ("connect", c.connect, DEFAULT_SECONDS_BUCKETS)):
        buckets = _buckets(values, bounds)
        for name, part in ((key, buckets), *(((OPENED, opened(buckets)),)
                                              if key == "connect" else ())):
            moments = log_moments(part)
            if moments is not None:
                w.logs[name] = moments
    order = np.argsort(c.tenant, kind="stable")
    tenants, starts = np.unique(c.tenant[order], return_index=True)
    for tenant, rows in zip(tenants, np.split(order, starts[1:])):
        name = f"t{tenant}"
        k = float(rows.size)
        given, cached = float(c.input_tokens[rows].sum()), float(c.cached[rows].sum())
        w.tenant_calls[name] = w.tenant_model_calls[name] = k
        w.tenant_ttft[name] = float(c.ttft[rows].mean())
        w.cached_share[name] = cached / given if given else 0.0
        w.cached_per_call[name] = cached / k
        w.tenant_uncached_per_call[name] = (given - cached) / k
    return w


def draw(s: Scenario) -> tuple[Calls, Calls]:
    """The scenario's (diagnosed, baseline) calls: the same for every reader of the seed (the
    signals below, and bench/diagnose_prometheus.py recording them into the exporter)."""
    rng = np.random.default_rng(10_000_019 * s.seed + 7)
    base_calls = calls(rng, s.route, Effect(), s.window_seconds)
    return calls(rng, s.route, s.effect, s.window_seconds), base_calls


def windows(s: Scenario, drawn: tuple[Calls, Calls] | None = None) -> tuple[Window, Window]:
    """The scenario's (diagnosed, baseline) windows, its route's new-upstream share set, from
    its calls (`drawn`: `draw(s)`, if already done)."""
    now_calls, base_calls = draw(s) if drawn is None else drawn
    base, now = window_signals(base_calls), window_signals(now_calls)
    touched = s.effect.cold_tenants
    if s.kind in INCIDENTS:
        a, b = ((c.ttft[c.tenant < touched] if touched else c.ttft)
                for c in (now_calls, base_calls))
        if a.size and b.size:
            s.magnitude, s.added = float(a.mean() / b.mean()), float(a.mean() - b.mean())
    key = ("m", "r")
    shares = new_upstream_shares({(*key, *now_calls.upstream): now.calls},
                                 {(*key, *base_calls.upstream): base.calls})
    now.new_upstream_share = shares.get(key)
    return now, base
