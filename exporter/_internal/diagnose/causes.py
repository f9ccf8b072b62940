"""Which of the four failure modes raised TTFT: the decision (its signals and thresholds are in
evidence/, below both the decision and the rules and panels that tell on-call about it).

README's "Why" names four failures that one slow LLM call hides; each has its own fix and its
own fingerprint in the metrics (docs/diagnose.md):

| cause | signals |
| --- | --- |
| `prefill_surge` | uncached input tokens per call up (the prefill with them, slower per token too at long context) |
| `cold_cache` | cached tokens per call down, on the route or for its slower tenants, whoever it hits |
| `noisy_neighbour` | the largest stall per call or the time per output token up: the batch slows every stream |
| `route_change` | the route's calls reach an upstream (address, region, fingerprint) unseen in the baseline, or its connections cost more, where the new route explains the rise |

A call's TTFT is retry (earlier attempts and their backoff) + queue + connect + send + server
wait + prefill of the *uncached* input tokens (behind the engine's own queue: a real engine
sends its headers before it schedules the prompt) + the first decode step: the decision reads
each term where it can tell the causes apart.

The decision exists once, here: `ttft-exporter diagnose` (run.py) queries the signals over any
two windows and calls `classify`; `ttft-exporter watch` (watch.py) does the same every interval
over `alerting.tenant_window_seconds` against the same window
`alerting.tenant_baseline_offset_seconds` earlier (or earlier still where an incident covers
that one: run.py's baseline candidates), and serves the finding for the `LLMTTFTLikelyCause`
alert. Every signal is a mean (histogram `_sum` / `_count`) or a ratio of
counters: exact in both histogram modes, and steadier than a p99 over a few calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config.settings import AlertingConfig
from ..evidence.signals import CONNECT, NETWORK, OPENED, PHASES, PREFILL, QUEUE, SERVER
from ..evidence.thresholds import (COLD_CACHE, DEFAULT, NOISY_NEIGHBOUR, PREFILL_SURGE,
                                   ROUTE_CHANGE, RUNBOOK, UNKNOWN, Thresholds)
from ..promql import runbook_url
from .noise import LogMoments, rise_in_standard_errors, rise_over_one_call



# --- the decision -----------------------------------------------------------------------------

@dataclass
class Window:
    """The signals of one (model, route) over one window, as numbers (None: no value)."""

    calls: float = 0.0
    ttft: float | None = None
    first_answer: float | None = None
    input_tokens: float | None = None
    stall: float | None = None
    #: time per output token (decode) and output tokens (hidden reasoning counts) per call
    tpot: float | None = None
    output_tokens: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    tenant_calls: dict[str, float] = field(default_factory=dict)
    tenant_ttft: dict[str, float] = field(default_factory=dict)
    #: per tenant over all routes of the model
    cached_share: dict[str, float] = field(default_factory=dict)
    cached_per_call: dict[str, float] = field(default_factory=dict)
    tenant_model_calls: dict[str, float] = field(default_factory=dict)
    #: uncached input tokens per call (usage: input - cached), for the route and per tenant
    uncached_per_call: float | None = None
    tenant_uncached_per_call: dict[str, float] = field(default_factory=dict)
    #: the route's cached share of input tokens and cached tokens per call (all tenants)
    route_cached_share: float | None = None
    route_cached_per_call: float | None = None
    #: the provider's retries per call (PROVIDER_RETRIES)
    retries_per_call: float | None = None
    #: the moments of log values per "ttft", "first_answer", "input_tokens", "connect", and
    #: OPENED: the connect phase of the calls that opened a connection (from the buckets: the
    #: noise gate, noise.py)
    logs: dict[str, LogMoments] = field(default_factory=dict)
    #: route_change: share of the route's calls to an upstream the baseline did not see (only
    #: on the window being diagnosed).
    new_upstream_share: float | None = None
    upstreams: list[dict[str, str]] = field(default_factory=list)


@dataclass
class Finding:
    """One degraded (model, route): the likely cause, and the numbers that decided it."""

    model: str
    route: str
    cause: str
    tenants: list[str]
    evidence: dict[str, float]
    runbook: str

    def as_json(self) -> dict[str, object]:
        return {"model": self.model, "route": self.route, "cause": self.cause,
                "tenants": self.tenants, "evidence": self.evidence, "runbook": self.runbook}


def _rose(now: float | None, base: float | None, factor: float, floor: float) -> bool:
    """`now` is at least `factor`× and `floor` above `base` (False where either is missing)."""
    return now is not None and base is not None and now >= factor * base and \
        now - base >= floor


def rise_z(now: Window, base: Window, key: str) -> float | None:
    """Standard errors of the rise of `key` ("ttft", "first_answer", "input_tokens",
    "connect") on log values from the buckets (noise.py); None where a window has fewer than
    two calls. (A p10..p90 spread read from the same buckets was the fallback: it never had a
    value where the log values had none, and its quantile queries were the decision's four
    heaviest.)"""
    return rise_in_standard_errors(now.logs.get(key), base.logs.get(key))


def _degraded(now: Window, base: Window, key: str, t: Thresholds, gate: float) -> bool:
    """The mean of `key` ("ttft", "first_answer") rose past `degraded_factor`,
    `degraded_min_seconds` and `gate` standard errors."""
    z = rise_z(now, base, key)
    return _rose(getattr(now, key), getattr(base, key), t.degraded_factor,
                 t.degraded_min_seconds) and (z is None or z >= gate)


def work(w: Window) -> float | None:
    """The server's prefill work per call: uncached input tokens (all input tokens where the
    usage counters are missing)."""
    return w.input_tokens if w.uncached_per_call is None else w.uncached_per_call


def prefill_speed(w: Window) -> float | None:
    """The server's prefill time per 1k uncached input tokens (seconds): what a server
    spends on the work its cache did not serve. None without that work."""
    prefill, uncached = w.phases.get(PREFILL), work(w)
    if prefill is None or uncached is None or uncached < 1:
        return None
    return 1000 * prefill / uncached


def _work_rose(now: Window, base: Window, t: Thresholds) -> bool:
    """Uncached input tokens per call rose past `input_factor`, and the prompts' rise is
    clear of their noise (input tokens' log values, where the buckets say)."""
    z = rise_z(now, base, "input_tokens")
    return _rose(work(now), work(base), t.input_factor, 0.0) and \
        (z is None or z >= t.degraded_z)


def _neighbour(now: Window, base: Window, t: Thresholds) -> bool:
    """The batch slows every stream: each call's largest stall rose past `stall_factor` and
    `stall_min_seconds`, or the time per output token past `slower_decode`× with the uncached
    work per call not grown. A neighbour in the batch (a long prefill, more sequences) takes
    every step's time from everyone; a longer wait before the first token alone, with the
    decode and the stalls unchanged, is not one (a reasoning model thinking longer, a queue
    in front of the engine)."""
    decode = _rose(now.tpot, base.tpot, t.slower_decode, 0.0) and \
        not _rose(work(now), work(base), t.input_factor, 0.0)
    return decode or _rose(now.stall, base.stall, t.stall_factor, t.stall_min_seconds)


def _surge(now: Window, base: Window, t: Thresholds) -> bool:
    """More uncached work per call (clear of the prompts' noise), and the prefill rose with
    it. At any speed: attention grows with the position and an engine queues behind longer
    prefills, so a surge to long contexts is slower per token too; only a prefill slower with
    the work unchanged is a slower server."""
    return _work_rose(now, base, t) and \
        _rose(now.phases.get(PREFILL), base.phases.get(PREFILL), t.prefill_factor, 0.0)


def _cache_lost(now: Window, base: Window, t: Thresholds) -> bool:
    """The route's cache serves less, whoever it hits: its cached share of input tokens fell
    by `cache_drop`, its uncached tokens per call rose past `input_factor`, and the cached
    tokens it lost per call make at least half of that rise (a cache loss adds the tokens it
    no longer serves; a surge of the prompts' new part adds uncached tokens with the cached
    ones per call unchanged)."""
    was, share = base.route_cached_share, now.route_cached_share
    served_was, served = base.route_cached_per_call, now.route_cached_per_call
    uncached_now, uncached_was = work(now), work(base)
    if None in (was, share, served_was, served, uncached_now, uncached_was):
        return False
    rise = uncached_now - uncached_was  # type: ignore[operator]
    return was - share >= t.cache_drop and \
        _rose(uncached_now, uncached_was, t.input_factor, 0.0) and \
        served_was - served >= 0.5 * rise  # type: ignore[operator]


def _provider_retried(now: Window, base: Window, t: Thresholds) -> bool:
    """The provider refused or failed more attempts: its retries per call rose past
    `retry_factor` and `retry_min_per_call` (none recorded: none)."""
    return _rose(now.retries_per_call or 0.0, base.retries_per_call or 0.0, t.retry_factor,
                 t.retry_min_per_call)


def _network_explains(now: Window, base: Window, t: Thresholds) -> bool:
    """The network phases' means (connect + server wait) rose by at least `network_share` of
    the TTFT (or first-answer) mean's rise: what a farther route adds is round trips."""
    def rise(a: float | None, b: float | None) -> float:
        return 0.0 if a is None or b is None else a - b

    network = sum(rise(now.phases.get(p), base.phases.get(p)) for p in NETWORK)
    total = max(rise(now.ttft, base.ttft), rise(now.first_answer, base.first_answer))
    return network >= t.network_share * total


def surge_tenants(now: Window, base: Window, t: Thresholds = DEFAULT) -> list[str]:
    """Tenants whose uncached tokens per call on the route rose past `input_factor`, among
    those with calls enough in the diagnosed window."""
    return sorted(
        tenant for tenant, value in now.tenant_uncached_per_call.items()
        if now.tenant_calls.get(tenant, 0) >= t.tenant_min_calls
        and _rose(value, base.tenant_uncached_per_call.get(tenant), t.input_factor, 0.0))


def _connection_costlier(now: Window, base: Window, t: Thresholds) -> bool | None:
    """A connection costs more: the connect phase of the calls that opened one (its geometric
    mean) rose past `connect_factor`, `connect_min_seconds` and `degraded_z` standard errors
    (a baseline of one such call read with the diagnosed window's spread). None without
    calls that opened one in both windows. More calls opening connections at the same cost
    (longer streams hold the pool's, a burst of concurrency) is no route change, and a
    handshake is the provider's front door, not its batch: no surge, cold cache or neighbour
    makes each one dearer."""
    a, b = now.logs.get(OPENED), base.logs.get(OPENED)
    z = rise_over_one_call(a, b)
    if a is None or b is None or z is None:
        return None
    return _rose(math.exp(a.mean), math.exp(b.mean), t.connect_factor,
                 t.connect_min_seconds) and z >= t.degraded_z


def _connect_mean_rose(now: Window, base: Window, t: Thresholds) -> bool:
    """The connect phase's mean over every call rose past `connect_factor`,
    `connect_min_seconds` and `degraded_z` standard errors: where no call opened a connection
    in one of the windows. Longer calls raise it too (each holds a pooled connection longer,
    so more calls open one): the caller rules those out first."""
    z = rise_z(now, base, CONNECT)
    return _rose(now.phases.get(CONNECT), base.phases.get(CONNECT), t.connect_factor,
                 t.connect_min_seconds) and (z is None or z >= t.degraded_z)


def cold_tenants(now: Window, base: Window, t: Thresholds = DEFAULT) -> list[str]:
    """Tenants of the model whose cached share of input tokens (over all its routes) fell past
    the thresholds, and their cached tokens per call with it (a prompt surge on one route
    lowers every tenant's share, not what the cache serves per call), over `cold_min_calls`
    of the tenant's calls on the model (an idle tenant's first calls are cold, then warm)."""
    def served_less(tenant: str) -> bool:
        was, served = base.cached_per_call.get(tenant), now.cached_per_call.get(tenant)
        return was is not None and served is not None and served <= t.cache_ratio * was

    return sorted(
        tenant for tenant, share in now.cached_share.items()
        if (was := base.cached_share.get(tenant)) is not None
        and was - share >= t.cache_drop and share <= t.cache_ratio * was
        and served_less(tenant) and now.tenant_model_calls.get(tenant, 0) >= t.cold_min_calls)


def slower_tenants(now: Window, base: Window, t: Thresholds = DEFAULT) -> list[str]:
    """Tenants with calls now whose TTFT mean is past the thresholds above the (model, route)'s
    baseline mean: a tenant's own baseline on one route is a handful of calls, if any."""
    return sorted(
        tenant for tenant, value in now.tenant_ttft.items()
        if now.tenant_calls.get(tenant, 0) >= t.tenant_min_calls
        and _rose(value, base.ttft, t.degraded_factor, t.degraded_min_seconds))


def classify(model: str, route: str, now: Window, base: Window,
             t: Thresholds = DEFAULT, alerting: AlertingConfig = AlertingConfig()
             ) -> Finding | None:
    """The finding for one (model, route), or None when its TTFT is not degraded.

    Degraded: enough calls in both windows, and the TTFT or first-answer mean rose past
    `degraded_factor`, `degraded_min_seconds` and `degraded_z` standard errors (`explained_z`
    where a surge's, a cache loss's or a new upstream's own signals hold); or a tenant's TTFT
    rose past the first two while its cache went cold (one tenant's cold cache barely moves
    its route's mean). Then the first cause of CAUSES whose signals hold; `unknown` when none
    does.
    """
    if now.calls < t.min_calls or base.calls < t.min_calls:
        return None
    surge = _surge(now, base, t)
    route_cold = _cache_lost(now, base, t)
    moved = now.new_upstream_share is not None and \
        now.new_upstream_share >= t.new_upstream_share
    gate = t.explained_z if surge or route_cold or moved else t.degraded_z
    route_degraded = _degraded(now, base, "ttft", t, gate) or \
        _degraded(now, base, "first_answer", t, gate)
    slower = slower_tenants(now, base, t)
    compared = [x for x in now.tenant_calls if now.tenant_calls[x] >= t.tenant_min_calls]

    def few(tenants: list[str]) -> list[str]:
        """`tenants` where they are at most half of those compared (or one): named as the
        ones affected; otherwise none named (all tenants)."""
        return tenants if compared and len(tenants) <= max(1.0, len(compared) / 2) else []

    # A cache loss is seen in cached tokens per call, whoever it hits: on the route, or for
    # tenants among the slower ones. On a route whose mean did not move, one tenant's cold
    # cache is the finding only where it is one of few slower tenants.
    cold_now = cold_tenants(now, base, t)
    cold = [x for x in cold_now if x in (slower if route_degraded else few(slower))]
    if not route_degraded and not cold:
        return None
    evidence: dict[str, float] = {}

    def note(name: str, a: float | None, b: float | None) -> None:
        if a is not None:
            evidence[f"{name}_now"] = round(a, 4)
        if b is not None:
            evidence[f"{name}_baseline"] = round(b, 4)

    note("ttft_mean_seconds", now.ttft, base.ttft)
    note("first_answer_mean_seconds", now.first_answer, base.first_answer)
    for key in ("ttft", "first_answer"):
        z = rise_z(now, base, key)
        if z is not None and math.isfinite(z):
            evidence[f"{key}_rise_standard_errors"] = round(z, 2)
    evidence["calls_now"], evidence["calls_baseline"] = round(now.calls, 1), round(base.calls, 1)
    evidence["tenants_slower"], evidence["tenants_compared"] = len(slower), len(compared)

    connect = (now.phases.get(CONNECT), base.phases.get(CONNECT))
    new_share = now.new_upstream_share
    # A starved client stamps every phase late: no provider-side cause, and no route change,
    # is read from its phases. A queue beside the provider's retries is the pool waiting on
    # an overloaded provider's longer calls.
    starved = _rose(now.phases.get(QUEUE), base.phases.get(QUEUE), t.queue_factor,
                    t.queue_min_seconds) and not _provider_retried(now, base, t)
    neighbour = not starved and _neighbour(now, base, t)
    explained = _network_explains(now, base, t)
    cache_loss = route_cold or bool(cold)
    # A new upstream is a fact; it is the cause unless a surge's or a cache loss's own
    # signals hold and the network phases do not make the rise. Dearer connections are a
    # route change where they make the rise; the connect mean over every call only where
    # nothing else explains it: longer calls (more uncached work, a slower server, a cold
    # cache) hold more connections open, and each new one costs a connect.
    costlier = _connection_costlier(now, base, t)
    if not starved and (
            (moved and (explained or not (surge or cache_loss))) or
            (costlier and explained) or
            (costlier is None and not cache_loss and not surge and not neighbour
             and explained and _connect_mean_rose(now, base, t))):
        cause, tenants = ROUTE_CHANGE, []
        evidence["new_upstream_share"] = round(new_share or 0.0, 4)
        note("connect_mean_seconds", *connect)
        note("server_mean_seconds", now.phases.get(SERVER), base.phases.get(SERVER))
    elif cache_loss:
        cause, tenants = COLD_CACHE, few(cold)
        note("cached_share", now.route_cached_share, base.route_cached_share)
        note("cached_input_tokens_per_call", now.route_cached_per_call,
             base.route_cached_per_call)
        note("uncached_input_tokens_per_call", now.uncached_per_call, base.uncached_per_call)
        for tenant in cold:
            note(f"cached_share[{tenant}]", now.cached_share.get(tenant),
                 base.cached_share.get(tenant))
            note(f"ttft_mean_seconds[{tenant}]", now.tenant_ttft.get(tenant), None)
    elif surge:
        # confined to a few tenants: name them (at most half of those compared, or one)
        cause, tenants = PREFILL_SURGE, few(surge_tenants(now, base, t))
        note("input_tokens_per_call", now.input_tokens, base.input_tokens)
        note("uncached_input_tokens_per_call", now.uncached_per_call, base.uncached_per_call)
        note("prefill_mean_seconds", now.phases.get(PREFILL), base.phases.get(PREFILL))
        note("prefill_seconds_per_1k_uncached_tokens", prefill_speed(now), prefill_speed(base))
    elif neighbour:
        cause, tenants = NOISY_NEIGHBOUR, []
        note("stall_mean_seconds", now.stall, base.stall)
        note("time_per_output_token_mean_seconds", now.tpot, base.tpot)
        note("input_tokens_per_call", now.input_tokens, base.input_tokens)
        note("prefill_seconds_per_1k_uncached_tokens", prefill_speed(now), prefill_speed(base))
        note("retries_per_call", now.retries_per_call, base.retries_per_call)
    else:
        cause, tenants = UNKNOWN, few(slower)
        note("input_tokens_per_call", now.input_tokens, base.input_tokens)
        note("output_tokens_per_call", now.output_tokens, base.output_tokens)
        note("stall_mean_seconds", now.stall, base.stall)
        note("time_per_output_token_mean_seconds", now.tpot, base.tpot)
        note("retries_per_call", now.retries_per_call, base.retries_per_call)
        for phase in PHASES:
            note(f"{phase}_mean_seconds", now.phases.get(phase), base.phases.get(phase))
        evidence["new_upstream_share"] = round(new_share or 0.0, 4)
    return Finding(model, route, cause, tenants, evidence,
                   runbook_url(alerting, RUNBOOK[cause]))
