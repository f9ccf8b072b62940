"""A small, deterministic latency model of an LLM serving fleet.

The demo provider uses it to produce the failure modes the exporter must make visible
(README.md, "Why"): prefill that grows with uncached input, a per-tenant prompt cache that goes
cold when idle, reasoning that delays the first answer token, and a noisy neighbour whose huge
prefill stalls every other stream of the same model. Queueing for the `slots` of a model is
real (an asyncio.Semaphore in the provider), so only the timings of one admitted request are
decided here, all at once, from one seeded `random.Random`: the same seed and the same request
order give the same timings. The incidents (incidents.py) act through `Knobs`: tenants whose
cache the provider keeps evicting, a model whose batch a neighbour keeps freezing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from .incidents import Knobs


@dataclass(frozen=True)
class ModelProfile:
    """How one model behaves on the simulated fleet."""

    name: str
    slots: int
    """Requests served at once (the c of an M/M/c queue); the rest wait before the headers."""
    prefill_tokens_per_s: float
    """Uncached input tokens processed per second before the first output token."""
    decode_tokens_per_s: float
    """Mean output tokens per second once decoding runs."""
    jitter: float
    """Relative standard deviation of each inter-token gap and of the server overhead."""
    output_tokens: tuple[int, int]
    """Inclusive range of answer tokens per response."""
    reasoning_tokens: tuple[int, int] = (0, 0)
    """Inclusive range of reasoning tokens emitted before the answer; (0, 0) = no reasoning."""
    server_overhead_s: float = 0.02
    """Routing and admission time before the headers, on top of any queueing."""

    def mean_service_seconds(self, input_tokens: float, cached_share: float = 0.0) -> float:
        """Mean time a request holds a slot: overhead, prefill, reasoning and answer."""
        tokens = (sum(self.reasoning_tokens) + sum(self.output_tokens)) / 2
        uncached = input_tokens * (1 - cached_share)
        return (self.server_overhead_s + uncached / self.prefill_tokens_per_s
                + tokens / self.decode_tokens_per_s)


@dataclass(frozen=True)
class LatencyModel:
    """The knobs of the simulated fleet; `default()` is what `ttft-exporter demo` runs."""

    models: tuple[ModelProfile, ...]
    cache_idle_seconds: float = 30.0
    """A tenant's cached prompt prefix is evicted after this long without a request."""
    noisy_tenant: str = "tenant-noisy"
    noisy_probability: float = 0.0
    """Chance that a request of `noisy_tenant` is a huge one-off document (none by default:
    the incident day's noisy neighbour is another customer, see incidents.py)."""
    noisy_input_tokens: int = 100_000
    batch_block_tokens: int = 64_000
    """An uncached prefill at least this large stalls every other stream of its model."""
    seed: int = 0

    def shorter(self, factor: float) -> LatencyModel:
        """The same fleet with answers and reasoning `factor` times as long (tests use short
        ones: the SDKs' per-chunk work, not the model, is what costs CPU here)."""
        def scaled(tokens: tuple[int, int]) -> tuple[int, int]:
            return (max(1, round(tokens[0] * factor)) if tokens[1] else 0,
                    round(tokens[1] * factor))

        return replace(self, models=tuple(
            replace(p, output_tokens=scaled(p.output_tokens),
                    reasoning_tokens=scaled(p.reasoning_tokens)) for p in self.models))

    @classmethod
    def default(cls) -> LatencyModel:
        """Three models that differ where users feel it: fast, medium, and slow to answer.

        Sized so the demo's load keeps every queue stable: at 10 calls/s the busiest model,
        deepseek-r1 (1.5 calls/s of ~11 s each), keeps about half of its 32 slots busy.
        """
        return cls(
            models=(
                ModelProfile("llama-3-8b", slots=48, prefill_tokens_per_s=50_000,
                             decode_tokens_per_s=120, jitter=0.15, output_tokens=(40, 200),
                             server_overhead_s=0.015),
                ModelProfile("gpt-4.1", slots=32, prefill_tokens_per_s=20_000,
                             decode_tokens_per_s=60, jitter=0.25, output_tokens=(60, 300),
                             server_overhead_s=0.04),
                ModelProfile("deepseek-r1", slots=32, prefill_tokens_per_s=10_000,
                             decode_tokens_per_s=45, jitter=0.3, output_tokens=(80, 300),
                             reasoning_tokens=(100, 400), server_overhead_s=0.06),
            ),
        )

    def profile(self, model: str) -> ModelProfile:
        """The named profile; unknown names behave like the first one so any client works."""
        for profile in self.models:
            if profile.name == model:
                return profile
        return self.models[0]


@dataclass(frozen=True)
class Plan:
    """Everything one response will do, decided before its first byte."""

    server_wait: float
    """Seconds before the headers (after any queueing)."""
    prefill: float
    """Seconds after the headers before the first token event."""
    input_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    answer_tokens: int
    """Content tokens, or tool-call argument pieces when `tool_call` is set."""
    gaps: tuple[float, ...]
    """gaps[i] is the wait before token event i + 1 (reasoning and answer counted together)."""
    tool_call: bool = False
    status: int | None = None
    """Answer with this HTTP error instead of a completion."""
    disconnect_after: int | None = None
    """Abort the connection after this many token events."""
    truncated: bool = False
    """The request's max_tokens cut the answer short (finish reason `length`)."""


def limited(plan: Plan, max_tokens: int | None) -> Plan:
    """The plan cut at the request's max_tokens (which counts reasoning tokens too)."""
    if max_tokens is None or plan.reasoning_tokens + plan.answer_tokens <= max_tokens:
        return plan
    reasoning = min(plan.reasoning_tokens, max_tokens)
    return replace(plan, reasoning_tokens=reasoning, answer_tokens=max_tokens - reasoning,
                   truncated=True)


@dataclass
class _CacheEntry:
    last_used: float
    prefix_tokens: int


class LatencySimulator:
    """The mutable side of a `LatencyModel`: random draws, prompt caches and batch stalls.

    Not thread-safe: the provider uses one instance from its single event loop.
    """

    def __init__(self, model: LatencyModel, clock: Callable[[], float] = time.monotonic,
                 knobs: Knobs | None = None) -> None:
        self.model = model
        self.knobs = knobs if knobs is not None else Knobs()
        self._clock = clock
        self._rng = random.Random(model.seed)
        self._cache: dict[tuple[str, str, str], _CacheEntry] = {}
        self._paused_until: dict[str, float] = {}

    def plan(self, model: str, tenant: str, input_tokens: int, prefix: str = "") -> Plan:
        """Decide one admitted request; a huge prefill also pauses the model's batch.

        The prompt cache is per (model, tenant, `prefix`): a route's system prompt is a prefix
        of its own, so a tenant's chat turns do not warm its summaries."""
        profile = self.model.profile(model)
        rng = self._rng
        now = self._clock()
        burst = tenant == self.model.noisy_tenant and rng.random() < self.model.noisy_probability
        if burst:
            # A one-off document: neither read from nor written to the tenant's cache.
            input_tokens = max(input_tokens, self.model.noisy_input_tokens)
        key = (model, tenant, prefix)
        cached = 0 if burst else self._cached_tokens(key, input_tokens, now)

        server_wait = profile.server_overhead_s * self._jitter(profile.jitter)
        decode_step = 1.0 / profile.decode_tokens_per_s
        # The first token needs one forward pass on top of the prefill itself.
        prefill = (input_tokens - cached) / profile.prefill_tokens_per_s + decode_step
        reasoning = rng.randint(*profile.reasoning_tokens)
        answer = rng.randint(*profile.output_tokens)
        gaps = tuple(decode_step * self._jitter(profile.jitter)
                     for _ in range(max(0, reasoning + answer - 1)))

        if not burst:
            # The prefix stays in use until the response ends; idle time counts from there.
            ends = now + server_wait + prefill + sum(gaps)
            self._cache[key] = _CacheEntry(last_used=ends, prefix_tokens=input_tokens)
        if input_tokens - cached >= self.model.batch_block_tokens:
            until = now + server_wait + prefill
            self._paused_until[model] = max(self._paused_until.get(model, 0.0), until)
        return Plan(server_wait=server_wait, prefill=prefill, input_tokens=input_tokens,
                    cached_tokens=cached, reasoning_tokens=reasoning, answer_tokens=answer,
                    gaps=gaps)

    def paused_until(self, model: str) -> float:
        """Clock time until which every stream of `model` is held by a huge prefill (ours, or
        a neighbour's during the noisy-neighbour incident)."""
        return max(self._paused_until.get(model, 0.0),
                   self.knobs.frozen_until(model, self._clock()))

    def _cached_tokens(self, key: tuple[str, str, str], input_tokens: int, now: float) -> int:
        """The tenant's previous prompt is its cached prefix, unless idle for too long or its
        cache is being evicted (the cold-cache incident)."""
        entry = self._cache.get(key)
        if entry is None or now - entry.last_used > self.model.cache_idle_seconds \
                or key[1] in self.knobs.cold_tenants:
            return 0
        return min(entry.prefix_tokens, input_tokens)

    def _jitter(self, relative: float) -> float:
        """A positive factor around 1.0; clipped so a gap never collapses to zero."""
        return max(0.1, self._rng.gauss(1.0, relative))
