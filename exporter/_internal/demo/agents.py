"""The demo's agent workload: multi-step tasks with tools, guardrails, a waterfall, a deadline.

Three task types, each an `exporter.task()` whose LLM calls go through the real
`openai.AsyncOpenAI` (measured by `exporter.instrument()`) to the demo provider behind a relay
one region away (relay.py), so every step pays a network round trip:

* `support-answer` (4 steps): moderation and PII guardrails in sequence before the first call,
  a knowledge-base search and a CRM lookup in parallel (`asyncio.gather`), two more calls;
* `research-report` (12 steps): a plan, five rounds of (choose sources, fetch pricing then
  reviews one after the other although neither needs the other: the waterfall, extract with a
  max_tokens too small: a truncation), a summary, and a PII guardrail on it;
* `ticket-triage` (6 steps) under a tight deadline it keeps working past: late calls and
  orphan tokens.

Each call is scripted (`x-demo-script`) from a `Timing`: exact in tests, drawn around it from
a seeded random generator in the demo. Tool and guardrail times are `asyncio.sleep`s, the
pacing of the scenario.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

from ..shim.context import labels
from ..shim.task import Task, guardrail, task, tool
from .provider import SCRIPT_HEADER

ROUTE = "agent"
MODELS = ("gpt-4.1", "llama-3-8b")
#: Task type -> share of the agent tasks.
TASKS = {"support-answer": 0.5, "research-report": 0.2, "ticket-triage": 0.3}
#: The output limit of the research report's extraction steps: below what the model writes.
EXTRACT_MAX_TOKENS = 8
TRIAGE_DEADLINE = 2.0


@dataclass(frozen=True)
class Timing:
    """What one step, tool and guardrail take (seconds), as scripted to the provider."""

    server_wait: float = 0.03
    prefill: float = 0.05
    tokens: int = 12
    gap: float = 0.01
    tool: float = 0.05
    guardrail: float = 0.02


class Agents:
    """Runs the task types against `client`; exact `timing`, or drawn around it with `rng`."""

    def __init__(self, client: Any, timing: Timing = Timing(),
                 rng: random.Random | None = None):
        self.client = client
        self.timing = timing
        self.rng = rng

    def _vary(self, seconds: float) -> float:
        return seconds if self.rng is None else seconds * self.rng.uniform(0.5, 2.0)

    async def step(self, model: str, max_tokens: int | None = None) -> None:
        """One LLM call, streamed to its end."""
        t = self.timing
        tokens = t.tokens if self.rng is None else self.rng.randint(t.tokens // 2, t.tokens * 3)
        script = {"server_wait": self._vary(t.server_wait), "prefill": self._vary(t.prefill),
                  "tokens": tokens, "gap": t.gap}
        extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
        stream = await self.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "next step"}], stream=True,
            stream_options={"include_usage": True},
            extra_headers={SCRIPT_HEADER: json.dumps(script)}, **extra)
        async for _ in stream:
            pass

    async def tool(self, name: str, scale: float = 1.0) -> None:
        async with tool(name):
            await asyncio.sleep(self._vary(self.timing.tool) * scale)  # the tool's own time

    async def guardrail(self, name: str) -> None:
        async with guardrail(name):
            await asyncio.sleep(self._vary(self.timing.guardrail))  # the check's own time

    async def support_answer(self, model: str = MODELS[1]) -> Task:
        async with task("support-answer") as t:
            await self.guardrail("moderation")
            await self.guardrail("pii")
            await self.step(model, max_tokens=512)
            await asyncio.gather(self.tool("kb-search"), self.tool("crm-lookup"))
            await self.step(model, max_tokens=512)
            await self.step(model, max_tokens=512)
            await self.step(model, max_tokens=512)
        return t

    async def research_report(self, model: str = MODELS[0], deadline: float | None = None
                              ) -> Task:
        async with task("research-report", deadline=deadline) as t:
            await self.guardrail("moderation")
            await self.step(model, max_tokens=1024)  # plan
            for _ in range(5):
                await self.step(model, max_tokens=256)  # choose the sources
                await self.tool("fetch-pricing")
                await self.tool("fetch-reviews")  # could have run beside fetch-pricing
                await self.step(model, max_tokens=EXTRACT_MAX_TOKENS)  # extract: truncated
            await self.step(model, max_tokens=1024)  # the report
            await self.guardrail("pii")
        return t

    async def ticket_triage(self, model: str = MODELS[1], deadline: float = TRIAGE_DEADLINE
                            ) -> Task:
        async with task("ticket-triage", deadline=deadline) as t:
            await self.step(model, max_tokens=256)
            await self.tool("ticket-history", scale=4)
            for _ in range(5):  # keeps going when the caller has given up: orphan work
                await self.step(model, max_tokens=256)
        return t

    async def any(self) -> Task:
        """One task of a random type (the demo's mix)."""
        rng = self.rng or random.Random(0)
        name = rng.choices(tuple(TASKS), tuple(TASKS.values()))[0]
        model = rng.choice(MODELS)
        with labels(route=ROUTE):
            if name == "support-answer":
                return await self.support_answer(model)
            if name == "research-report":
                return await self.research_report(model)
            return await self.ticket_triage(model)


@dataclass(frozen=True)
class AgentShape:
    rate: float = 0.5  # tasks started per second
    max_in_flight: int = 20
    one_way: float = 0.03  # seconds to the provider's region and back, each way
    seed: int = 11


async def run_agents(base_url: str, stop: asyncio.Event, shape: AgentShape = AgentShape()
                     ) -> None:
    """Start agent tasks (Poisson arrivals) until `stop`, through a relay `one_way` away."""
    import openai

    from .relay import Relay

    port = int(base_url.rstrip("/").rsplit(":", 1)[1])
    relay = await Relay(port, shape.one_way).start()
    client = openai.AsyncOpenAI(base_url=relay.base_url + "/v1", api_key="demo",
                                max_retries=0, timeout=60.0)
    rng = random.Random(shape.seed)
    agents = Agents(client, rng=rng)
    running: set[asyncio.Task[Any]] = set()
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), rng.expovariate(shape.rate))
            except asyncio.TimeoutError:
                pass
            if stop.is_set() or len(running) >= shape.max_in_flight:
                continue
            job = asyncio.create_task(_quietly(agents.any()))
            running.add(job)
            job.add_done_callback(running.discard)
        for job in running:
            job.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        await client.close()
        await relay.close()


async def _quietly(job: Any) -> None:
    """A task that fails (an SDK error) is recorded with its outcome; the demo carries on."""
    try:
        await job
    except asyncio.CancelledError:
        raise
    except Exception:
        pass
