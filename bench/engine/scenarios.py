"""The four failure modes and their look-alikes, each produced by a mechanism on the real
engine (bench/engine/, docs/engine.md): nothing here draws a signal, the engine produces it.

A run is a baseline window then an incident window of traffic from the real openai SDK
(instrumented by `exporter.instrument()`, streamed with `include_usage`), several tenants
(`exporter.labels(tenant=...)`), each with its own seeded system prompt (a prefix the engine's
prompt cache serves) and a fresh user part per call, from a few client threads. A scenario
says what changes between the windows (`Scenario.setup` returns both windows' `Traffic`):
the prompts, where the calls go, or what else loads the engine. Load from other customers
(a neighbour, the overload's extra traffic) is made with raw HTTP calls the shim does not see,
as another customer's calls are not in a user's metrics.

Every scenario declares the answers it allows (`allowed`: causes, None = no finding) here,
before any result is read. Hidden reasoning is left out: a random-weight model thinks nothing.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import openai

import exporter
from bench.engine import prompts
from bench.engine.build import Engine
from bench.engine.client import chat, system_and_user
from bench.engine.gateway import Gateway
from bench.engine.server import LlamaServer, Options
from exporter._internal.evidence.thresholds import (COLD_CACHE, NOISY_NEIGHBOUR, PREFILL_SURGE,
                                                    ROUTE_CHANGE, UNKNOWN)

# --- the load (chosen on the physics of docs/engine.md, before any run) -------------------------
#: Tenants of a run, their system prompts (the cached prefix) and user parts (uncached), tokens.
#: The engine prefills ~0.07 ms a token here (choosing seed 1): a lost 3,000-token prefix
#: costs ~0.2 s a call, past diagnose's 0.1 s floor (1,000 tokens cost 0.07 s: under it).
TENANTS = 4
SYSTEM_TOKENS = 3000
USER_TOKENS = 200
#: A surge's user part: ×6 the uncached work, the engine still under capacity at RATE
#: (0.13-0.24 ms a token: 160-290 ms of prefill a call, 3 calls/s), and a rise past
#: diagnose's 0.1 s floor (a TTFT of ~0.1 s at baseline).
SURGE_USER_TOKENS = 1200
#: A saturating surge's: ×25 the uncached work, past where attention dominates (> 4k tokens).
SATURATING_USER_TOKENS = 5000
#: Tokens each call generates (`ignore_eos`): a stream long enough to have gaps to measure.
MAX_TOKENS = 16
#: Calls a second over the run's client threads (each paced by exponential gaps; a thread
#: whose call outlasts its gap calls at once: a closed loop under overload).
RATE = 3.0
THREADS = 4
#: The engine: 4 slots (8k tokens each), one thread (the machine has 2 cores).
ENGINE = Options(parallel=4, threads=1, context=32768)
#: A neighbour's prompts (cold, tokens) and its client threads; the overload's extra load.
NEIGHBOUR_TOKENS = 4000
NEIGHBOUR_THREADS = 1  # 2 left 21 of 47 calls in the window (choosing seed 1)
OVERLOAD_THREADS = 2  # 3 had 173 refusals and 20 of 42 calls failed (choosing seed 1)
#: The gateway sheds load past this many requests in flight; the SDK retries twice.
GATEWAY_LIMIT = 4
SDK_RETRIES = 2
#: The far upstream's relay, seconds each way (a route change to a farther region).
FAR_ONE_WAY = 0.05
#: A starved client's event loop: blocked this long, then free this long, over and over.
HOG_BUSY, HOG_IDLE = 0.15, 0.1


@dataclass(frozen=True)
class Tenant:
    name: str
    system: str
    user_tokens: int = USER_TOKENS
    weight: float = 1.0
    #: a timestamp at the top of its system prompt on every call: its prefix never repeats
    stamped: bool = False

    def messages(self, rng: random.Random, vocab: Path) -> list[dict[str, str]]:
        system = f"Now: {time.time_ns()}.\n{self.system}" if self.stamped else self.system
        return system_and_user(system, prompts.text(vocab, self.user_tokens,
                                                    rng.randrange(2**31)))


@dataclass
class Traffic:
    """One window: who calls, where the calls go, what else loads the engine or the client."""

    tenants: tuple[Tenant, ...]
    base_url: str
    retries: int = 0
    #: uninstrumented load started with the window and stopped after it
    background: Callable[[threading.Event], list[threading.Thread]] | None = None
    #: calls from an asyncio loop (AsyncOpenAI); with `hog`, a task blocks it on the CPU
    asynchronous: bool = False
    hog: bool = False


@dataclass
class World:
    """What a scenario builds on: the engine, its fresh near server, the run's tenants."""

    engine: Engine
    seed: int
    stack: ExitStack
    near: LlamaServer = field(init=False)
    #: the overload's gateway, whose refusals go into the run's record
    gateway: Gateway | None = None
    tenants: tuple[Tenant, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.near = self.stack.enter_context(
            LlamaServer(self.engine.server, self.engine.model, ENGINE))
        self.tenants = tuple(
            Tenant(f"t{i}", prompts.text(self.engine.model, SYSTEM_TOKENS, self.seed * 100 + i))
            for i in range(TENANTS))
        self.rng = random.Random(self.seed)

    def traffic(self, tenants: tuple[Tenant, ...] | None = None, **kw) -> Traffic:
        return Traffic(tenants or self.tenants, kw.pop("base_url", self.near.openai_base_url),
                       **kw)

    def far(self, one_way: float) -> str:
        from bench.engine.upstreams import FarUpstream

        far = FarUpstream(self.engine, replace(ENGINE), one_way=one_way)
        return self.stack.enter_context(far).openai_base_url

    def grown(self, tokens: int) -> tuple[Tenant, ...]:
        return tuple(replace(t, user_tokens=tokens) for t in self.tenants)


def uninstrumented(base_url: str, threads: int, tokens: int, vocab: Path, seed: int
                   ) -> Callable[[threading.Event], list[threading.Thread]]:
    """Another customer's load: `threads` closed loops of cold `tokens`-token prompts (one
    token out), raw HTTP (not the SDK: the shim does not see them). Refused calls (503) are
    sent again after 50 ms."""
    def start(stop: threading.Event) -> list[threading.Thread]:
        def loop(k: int) -> None:
            rng = random.Random(seed * 1000 + k)
            while not stop.is_set():
                try:
                    chat(base_url, system_and_user(prompts.text(vocab, tokens,
                                                                rng.randrange(2**31))),
                         max_tokens=1, timeout=120)
                except (RuntimeError, OSError):
                    stop.wait(0.05)

        out = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads)]
        for t in out:
            t.start()
        return out

    return start


@dataclass(frozen=True)
class Scenario:
    name: str
    #: what a right diagnosis may say (None: no finding), declared before any run
    allowed: frozenset[str | None]
    #: one line for the docs
    mechanism: str
    setup: Callable[[World], tuple[Traffic, Traffic]]
    #: one of the four causes (10 held-out runs), or a look-alike / calm
    cause: bool = False


def calm(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(), w.traffic()


def prefill_surge(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(), w.traffic(w.grown(SURGE_USER_TOKENS))


def cold_cache(w: World) -> tuple[Traffic, Traffic]:
    cold = set(w.rng.sample(range(TENANTS), w.rng.choice((1, 2))))
    return w.traffic(), w.traffic(tuple(replace(t, stamped=i in cold)
                                        for i, t in enumerate(w.tenants)))


def noisy_neighbour(w: World) -> tuple[Traffic, Traffic]:
    neighbour = uninstrumented(w.near.base_url, NEIGHBOUR_THREADS, NEIGHBOUR_TOKENS,
                               w.engine.model, w.seed)
    return w.traffic(), w.traffic(background=neighbour)


def route_change(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(), w.traffic(base_url=w.far(FAR_ONE_WAY))


def fleet_cache_loss(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(), w.traffic(tuple(replace(t, stamped=True) for t in w.tenants))


def saturating_surge(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(), w.traffic(w.grown(SATURATING_USER_TOKENS))


def rollout_during_surge(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(), w.traffic(w.grown(SURGE_USER_TOKENS), base_url=w.far(0.0))


def overload_with_retries(w: World) -> tuple[Traffic, Traffic]:
    gateway = w.stack.enter_context(Gateway(w.near.port, GATEWAY_LIMIT))
    extra = uninstrumented(gateway.base_url, OVERLOAD_THREADS, NEIGHBOUR_TOKENS,
                           w.engine.model, w.seed)
    w.gateway = gateway
    return (w.traffic(base_url=gateway.openai_base_url, retries=SDK_RETRIES),
            w.traffic(base_url=gateway.openai_base_url, retries=SDK_RETRIES, background=extra))


def starved_client(w: World) -> tuple[Traffic, Traffic]:
    return w.traffic(asynchronous=True), w.traffic(asynchronous=True, hog=True)


def traffic_mix_shift(w: World) -> tuple[Traffic, Traffic]:
    long_user = replace(w.tenants[-1], user_tokens=SURGE_USER_TOKENS * 2)

    def mix(weight: float) -> tuple[Tenant, ...]:
        return (*w.tenants[:-1], replace(long_user, weight=weight))

    return w.traffic(mix(0.3)), w.traffic(mix(3.0))


S = Scenario
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    S("calm", frozenset({None}), "the same traffic in both windows", calm),
    S("prefill_surge", frozenset({PREFILL_SURGE}),
      f"every user part {USER_TOKENS} → {SURGE_USER_TOKENS} tokens on the same cached prefixes",
      prefill_surge, cause=True),
    S("cold_cache", frozenset({COLD_CACHE}),
      "1 or 2 of the 4 tenants get a timestamp at the top of their system prompt on every call",
      cold_cache, cause=True),
    S("noisy_neighbour", frozenset({NOISY_NEIGHBOUR}),
      f"another customer's closed loop{'s' if NEIGHBOUR_THREADS > 1 else ''} "
      f"({NEIGHBOUR_THREADS}) of cold {NEIGHBOUR_TOKENS:,}-token prompts on the same engine "
      "(unseen by the shim)", noisy_neighbour, cause=True),
    S("route_change", frozenset({ROUTE_CHANGE}),
      f"the calls move to the other build on 127.0.0.2 behind a {FAR_ONE_WAY * 1000:.0f} ms "
      "one-way relay (a fresh engine: its cache cold at first)", route_change, cause=True),
    S("fleet_cache_loss", frozenset({COLD_CACHE}),
      "every tenant's system prompt gets a timestamp at its top", fleet_cache_loss),
    S("saturating_surge", frozenset({PREFILL_SURGE}),
      f"every user part {USER_TOKENS} → {SATURATING_USER_TOKENS:,} tokens: the engine "
      "saturates, attention dominates", saturating_surge),
    S("rollout_during_surge", frozenset({PREFILL_SURGE}),
      f"the surge ({SURGE_USER_TOKENS}-token user parts) while the calls move to the other "
      "build, at equal speed and no delay", rollout_during_surge),
    S("overload_with_retries", frozenset({NOISY_NEIGHBOUR}),
      f"a gateway answering 503 past {GATEWAY_LIMIT} requests in flight; another customer's "
      f"{OVERLOAD_THREADS} loops of cold {NEIGHBOUR_TOKENS:,}-token prompts through it; the "
      f"SDK retries ({SDK_RETRIES})", overload_with_retries),
    S("starved_client", frozenset({None, UNKNOWN}),
      f"AsyncOpenAI calls on one event loop that a CPU task blocks {HOG_BUSY * 1000:.0f} ms of "
      f"every {(HOG_BUSY + HOG_IDLE) * 1000:.0f}", starved_client),
    S("traffic_mix_shift", frozenset({None, PREFILL_SURGE}),
      f"the tenant with {SURGE_USER_TOKENS * 2:,}-token user parts goes from 0.3 to 3 shares "
      "of the calls (the others 1 each)", traffic_mix_shift),
)}


# --- driving the SDK --------------------------------------------------------------------------
@dataclass
class Counts:
    calls: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, ok: bool) -> None:
        with self.lock:
            self.calls += 1
            self.errors += not ok


def _request(t: Tenant, rng: random.Random, vocab: Path) -> dict:
    return dict(model="tiny", stream=True, stream_options={"include_usage": True},
                max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True},
                messages=t.messages(rng, vocab))


def _pick(tenants: tuple[Tenant, ...], rng: random.Random) -> Tenant:
    return rng.choices(tenants, weights=[t.weight for t in tenants])[0]


def _sync_loop(traffic: Traffic, route: str, vocab: Path, rng: random.Random, end: float,
               counts: Counts) -> None:
    client = openai.OpenAI(base_url=traffic.base_url, api_key="none",
                           max_retries=traffic.retries, timeout=120)
    due = time.monotonic()
    while (now := time.monotonic()) < end:
        if due > now:
            time.sleep(due - now)
        tenant = _pick(traffic.tenants, rng)
        try:
            with exporter.labels(route=route, tenant=tenant.name):
                for _ in client.chat.completions.create(**_request(tenant, rng, vocab)):
                    pass
            counts.add(True)
        except openai.APIError:
            counts.add(False)
        due = max(due + rng.expovariate(RATE / THREADS), time.monotonic())
    client.close()


async def _async_loops(traffic: Traffic, route: str, vocab: Path, seed: int, end: float,
                       counts: Counts) -> None:
    client = openai.AsyncOpenAI(base_url=traffic.base_url, api_key="none",
                                max_retries=traffic.retries, timeout=120)

    async def loop(rng: random.Random) -> None:
        due = time.monotonic()
        while (now := time.monotonic()) < end:
            if due > now:
                await asyncio.sleep(due - now)
            tenant = _pick(traffic.tenants, rng)
            try:
                with exporter.labels(route=route, tenant=tenant.name):
                    async for _ in await client.chat.completions.create(
                            **_request(tenant, rng, vocab)):
                        pass
                counts.add(True)
            except openai.APIError:
                counts.add(False)
            due = max(due + rng.expovariate(RATE / THREADS), time.monotonic())

    async def hog() -> None:
        while time.monotonic() < end:
            busy = time.monotonic() + HOG_BUSY
            while time.monotonic() < busy:  # the loop's thread on the CPU, nothing awaited
                pass
            await asyncio.sleep(HOG_IDLE)

    tasks = [loop(random.Random(seed * 10 + k)) for k in range(THREADS)]
    await asyncio.gather(*tasks, *([hog()] if traffic.hog else []))
    await client.close()


def drive(traffic: Traffic, route: str, vocab: Path, seed: int, seconds: float
          ) -> tuple[float, float, Counts]:
    """The window's calls for `seconds` (then the calls in flight finish): the wall-clock
    times before the first call and after the last, and the calls made."""
    counts, stop = Counts(), threading.Event()
    first = time.time()
    end = time.monotonic() + seconds
    background = traffic.background(stop) if traffic.background else []
    if traffic.asynchronous:
        asyncio.run(_async_loops(traffic, route, vocab, seed, end, counts))
    else:
        loops = [threading.Thread(target=_sync_loop, args=(
            traffic, route, vocab, random.Random(seed * 10 + k), end, counts))
            for k in range(THREADS)]
        for t in loops:
            t.start()
        for t in loops:
            t.join()
    last = time.time()
    stop.set()
    for t in background:
        t.join(180)
    return first, last, counts


def warm(w: World) -> None:
    """One call per tenant's prefix before the baseline (raw HTTP, unrecorded): the baseline
    is a warm cache's, as a route's steady state is."""
    for t in w.tenants:
        chat(w.near.base_url, system_and_user(t.system, "warm"), max_tokens=1)
