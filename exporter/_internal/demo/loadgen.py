"""The demo's load generator: 3 models × 3 routes × 20 tenants against the demo provider.

Arrivals are Poisson at `rate` calls per second; tenants are picked with Zipf-like popularity
(a few busy tenants, a long tail that goes idle long enough for its prompt cache to go cold);
each route has its own prompt size. Each call streams through a real SDK, measured by
`exporter.instrument()` as a service would be: most calls are OpenAI chat completions
(`openai.AsyncOpenAI`), a share are Anthropic messages (`anthropic.AsyncAnthropic`), both
against the demo provider, with `exporter.labels(route=..., tenant=...)` around each call.

The incidents (incidents.py) act on the load through `Knobs`: a route whose prompts surge, a
tenant that idles, models whose calls go to the provider's far region (TLS, a round trip away).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..shim.context import labels
from ..shim.instrument import instrument, instrumented, uninstrument
from .far_region import FarRegion
from .incidents import Knobs
from .provider import INPUT_TOKENS_HEADER, TENANT_HEADER

#: model -> share of the calls: mostly the fast model, a few to the slow reasoning one.
MODELS = {"llama-3-8b": 0.5, "gpt-4.1": 0.35, "deepseek-r1": 0.15}
#: route -> typical prompt size in tokens (a chat turn, a RAG search answer, a long summary).
ROUTES = {"chat": 600, "search": 3000, "summarize": 12000}
TENANTS = tuple(f"tenant-{i:02d}" for i in range(19)) + ("tenant-noisy",)
#: Share of the calls made with the anthropic SDK (Messages API); the rest use openai.
ANTHROPIC_SHARE = 0.3


@dataclass(frozen=True)
class LoadShape:
    rate: float = 10.0  # calls per second, all models together
    max_in_flight: int = 200
    seed: int = 7
    #: (model, share of the calls) pairs; the demo's mix by default.
    models: tuple[tuple[str, float], ...] = tuple(MODELS.items())


class LoadGenerator:
    """Drives the provider at `base_url` until `stop()`; the SDK calls are measured by
    `exporter.instrument()` (undone at the end when `run()` was the one to instrument).

    `knobs` are the incidents' (shared with the provider); `far` is the provider's far region,
    where calls of `knobs.far_models` go.
    """

    def __init__(self, base_url: str, shape: LoadShape = LoadShape(),
                 knobs: Knobs | None = None, far: FarRegion | None = None):
        self.base_url = base_url.rstrip("/")
        self.shape = shape
        self.knobs = knobs if knobs is not None else Knobs()
        self.far = far
        self._rng = random.Random(shape.seed)
        self._weights = [1 / (k + 1) for k in range(len(TENANTS))]
        self._models = tuple(name for name, _ in shape.models)
        self._model_weights = tuple(share for _, share in shape.models)
        self._stopping = asyncio.Event()
        self.calls = 0
        self.errors = 0

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, duration: float | None = None) -> None:
        """Issue calls until `stop()` or `duration` seconds, then cancel those still in flight."""
        import anthropic
        import openai

        owned = not instrumented()
        instrument()
        limit = asyncio.Semaphore(self.shape.max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        deadline = None if duration is None else loop.time() + duration
        clients = _clients(openai, anthropic, self.base_url)
        far_clients = None if self.far is None else _clients(
            openai, anthropic, self.far.base_url, self.far.tls_client_context())
        try:
            while not self._stopping.is_set():
                if deadline is not None and loop.time() >= deadline:
                    break
                try:
                    await asyncio.wait_for(self._stopping.wait(),
                                           self._rng.expovariate(self.shape.rate))
                except asyncio.TimeoutError:
                    pass
                if self._stopping.is_set() or limit.locked():
                    continue
                call = self._pick()
                if call[2] in self.knobs.idle_tenants:
                    continue  # this tenant is idle (the cold-cache incident)
                await limit.acquire()
                use = far_clients if far_clients and call[0] in self.knobs.far_models \
                    else clients
                task = asyncio.create_task(self._one(call, *use))
                tasks.add(task)
                task.add_done_callback(lambda t: (tasks.discard(t), limit.release()))
            for task in tasks:
                task.cancel()  # recorded as cancelled, as a real client shutting down would be
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for client in (*clients, *(far_clients or ())):
                await client.close()
            if owned:
                uninstrument()

    def _pick(self) -> tuple[str, str, str, int]:
        rng = self._rng
        model = rng.choices(self._models, self._model_weights)[0]
        route = rng.choice(tuple(ROUTES))
        tenant = rng.choices(TENANTS, self._weights)[0]
        if rng.random() < 0.08:  # the noisy tenant is busier than its rank says
            tenant = TENANTS[-1]
        elif self.knobs.cold_tenants and rng.random() < 0.3:  # back from idle, catching up
            # (a third of the calls: at the compressed day's 10 calls/s that is 2-4 calls per
            # route of each model in a 10 s window, enough to compare the tenant's TTFT)
            tenant = min(self.knobs.cold_tenants)
        size = ROUTES[route] * (self.knobs.surge_factor if route == self.knobs.surge_route else 1)
        input_tokens = max(16, int(rng.lognormvariate(0, 0.5) * size))
        return model, route, tenant, input_tokens

    async def _one(self, call: tuple[str, str, str, int], openai_client: Any,
                   anthropic_client: Any) -> None:
        model, route, tenant, input_tokens = call
        use_anthropic = self._rng.random() < ANTHROPIC_SHARE
        messages = [{"role": "user", "content": f"{route} request"}]
        headers = {TENANT_HEADER: tenant, INPUT_TOKENS_HEADER: str(input_tokens)}
        self.calls += 1
        try:
            with labels(route=route, tenant=tenant):
                if use_anthropic:
                    async with anthropic_client.messages.stream(
                            model=model, max_tokens=1024, messages=messages,
                            extra_headers=headers) as stream:
                        async for _ in stream:
                            pass
                else:
                    stream = await openai_client.chat.completions.create(
                        model=model, messages=messages, stream=True,
                        stream_options={"include_usage": True}, extra_headers=headers)
                    async for _ in stream:
                        pass
        except asyncio.CancelledError:
            raise
        except Exception:  # an SDK error (status, connection, timeout): counted, as a client would
            self.errors += 1


def _clients(openai: Any, anthropic: Any, base_url: str, tls: Any = None) -> tuple[Any, Any]:
    """An OpenAI and an Anthropic async client for one region (`tls`: its trust)."""
    options: dict[str, Any] = {"api_key": "demo", "max_retries": 0, "timeout": 120.0}
    return (
        openai.AsyncOpenAI(base_url=f"{base_url}/v1", **options, **(
            {"http_client": openai.DefaultAsyncHttpxClient(verify=tls)} if tls else {})),
        anthropic.AsyncAnthropic(base_url=base_url, **options, **(
            {"http_client": anthropic.DefaultAsyncHttpxClient(verify=tls)} if tls else {})),
    )


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict, headers: dict,
                      call: Any) -> None:
    """Stream one chat completion over SSE with aiohttp, marking phases and token events on a
    manual-API `call` (kept for drivers that use the manual API instead of an SDK)."""
    async with session.post(url, json=body, headers=headers) as response:
        call.headers()  # aiohttp returns once the response headers are read
        response.raise_for_status()
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage")
            if usage:
                details = usage.get("prompt_tokens_details") or {}
                call.usage(input=usage.get("prompt_tokens"),
                           output=usage.get("completion_tokens"),
                           cached=details.get("cached_tokens"), model=chunk.get("model"))
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content"):
                    call.token("reasoning")
                elif delta.get("content") or delta.get("tool_calls"):
                    call.token("content")
