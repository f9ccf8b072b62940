"""A raw chat call to the engine, every SSE event stamped as it arrives: what the engine sends,
without an SDK in between (the facts of docs/engine.md are measured with it; the SDK path is
tests/engine/test_engine_smoke.py's)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    """One call: the events (parsed JSON, `[DONE]` left out) and when each arrived, seconds
    after the request was sent; for a non-streamed call, the one body."""

    events: list[dict[str, Any]] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    headers_at: float = 0.0

    @property
    def token_times(self) -> list[float]:
        """Arrival of each event carrying content (role-only, finish and usage events are
        framing, as the shim counts them)."""
        return [t for e, t in zip(self.events, self.arrived)
                if any((c.get("delta") or {}).get("content") for c in e.get("choices") or ())]

    @property
    def ttft(self) -> float:
        return self.token_times[0]

    @property
    def final(self) -> dict[str, Any]:
        """The last event (a stream's usage or finish chunk, or the non-streamed body)."""
        return self.events[-1]

    def timings(self) -> dict[str, Any]:
        """The engine's `timings` (prompt_n, cache_n, prompt_ms, predicted_ms, ...)."""
        return next(e["timings"] for e in reversed(self.events) if "timings" in e)


def chat(base_url: str, messages: list[dict[str, str]], stream: bool = True,
         timeout: float = 300.0, on_event: Callable[[Reply], None] | None = None,
         **body: Any) -> Reply:
    """POST /v1/chat/completions to `base_url` (the engine's, or a relay's); `on_event` is
    called with the reply so far after each streamed event (to start something mid-stream)."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    payload = json.dumps({"model": "any", "messages": messages, "stream": stream, **body})
    reply = Reply()
    try:
        sent = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", payload,
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        reply.headers_at = time.perf_counter() - sent
        reply.headers = {k.lower(): v for k, v in response.getheaders()}
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:500]!r}")
        if not stream:
            reply.events.append(json.loads(response.read()))
            reply.arrived.append(time.perf_counter() - sent)
            return reply
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            reply.arrived.append(time.perf_counter() - sent)
            reply.events.append(json.loads(line[6:]))
            if on_event is not None:
                on_event(reply)
        return reply
    finally:
        connection.close()


def system_and_user(system: str, user: str = "Summarise the above.") -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
