"""What the page asks the view server for: Prometheus' HTTP API, passed through, and the
current `diagnose` findings.

The page never talks to Prometheus itself: one origin (no CORS setup on Prometheus), and the
view server is the only place that knows its URL. Only the read endpoints a dashboard needs
pass; a query error keeps Prometheus' status and JSON body, so the page shows it on its panel.
An answer is read piece by piece up to `max_reply_bytes` and refused past it, and an answer
that is not JSON is refused too: either becomes an error in Prometheus' own form, which the page
shows where the answer was meant to go.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from ..evidence.thresholds import DEFAULT, Thresholds
from ..diagnose.run import DiagnoseError, Prometheus, Request, diagnose

#: The API paths (under /api/v1/) the page reads: panel queries, variables, alerts.
PASSED = re.compile(r"(query|query_range|series|alerts|label/[A-Za-z_][A-Za-z0-9_]*/values)")


#: The largest answer passed to the page: a panel asks for one point per pixel column at most
#: (a few hundred kilobytes, a heatmap's buckets included); an answer past this would stall the
#: browser drawing it.
MAX_REPLY_BYTES = 16 * 1024 * 1024
#: How much of a non-JSON answer its error quotes.
EXCERPT = 200


def _error(status: int, kind: str, message: str) -> web.Response:
    """An error in the form of Prometheus' own, which the page shows on the panel that asked."""
    return web.json_response({"status": "error", "errorType": kind, "error": message},
                             status=status)


class PrometheusProxy:
    """GET /api/v1/<path>?... forwarded to Prometheus, its answer returned as it came, up to
    `max_reply_bytes`."""

    def __init__(self, prometheus_url: str, timeout: float = 30.0,
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        self.url = prometheus_url.rstrip("/")
        self.max_reply_bytes = max_reply_bytes
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def handle(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        if not PASSED.fullmatch(path):
            raise web.HTTPNotFound(text=f"/api/v1/{path} is not passed to Prometheus")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = f"{self.url}/api/v1/{path}"
        try:
            async with self._session.get(url, params=request.query) as answer:
                if answer.content_type != "application/json":
                    excerpt = (await answer.content.read(EXCERPT)).decode("utf-8", "replace")
                    return _error(502, "bad_reply",
                                  f"{url} answered HTTP {answer.status} {answer.content_type}, "
                                  f"not Prometheus' JSON (is {self.url} Prometheus' base URL?): "
                                  f"{excerpt!r}")
                body = await self._bounded(answer)
                if body is None:
                    return _error(502, "too_large",
                                  f"Prometheus' answer to /api/v1/{path} is over the view's "
                                  f"limit of {self.max_reply_bytes:,} bytes: narrow the time "
                                  f"range or the variables")
                return web.Response(status=answer.status, body=body,
                                    content_type=answer.content_type)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return _error(502, "unavailable",
                          f"cannot reach Prometheus at {self.url}: {type(e).__name__} {e}")

    async def _bounded(self, answer: aiohttp.ClientResponse) -> bytes | None:
        """The answer's body, read a piece at a time; None as soon as it passes the limit (by
        its declared length, or by what arrived: a compressed answer is counted unpacked)."""
        if (answer.content_length or 0) > self.max_reply_bytes:
            return None
        body = bytearray()
        async for piece in answer.content.iter_chunked(64 * 1024):
            body += piece
            if len(body) > self.max_reply_bytes:
                return None
        return bytes(body)


@dataclass
class Findings:
    """`diagnose` over the last `since` seconds against the `baseline` seconds before them (or
    ending at `baseline_at`, once the last `since` seconds are all past it: the demo compares
    with its calm), run at most once per `max_age` seconds however many pages ask (it runs ~40
    queries)."""

    prometheus_url: str
    since: float = 900.0
    baseline: float = 3600.0
    baseline_at: float | None = None
    max_age: float = 10.0
    thresholds: Thresholds = DEFAULT
    _cached: dict[str, Any] | None = None
    _at: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def _run(self) -> dict[str, Any]:
        at = time.time()
        fixed = self.baseline_at is not None and at - self.since >= self.baseline_at
        request = Request(at=at, since=self.since, baseline=self.baseline,
                          baseline_at=self.baseline_at if fixed else None)
        answer: dict[str, Any] = {"at": at, "since": self.since, "baseline": self.baseline,
                                  "baseline_end": request.baseline_end}
        try:
            found = diagnose(Prometheus(self.prometheus_url, timeout=30.0), request,
                             self.thresholds)
            answer["findings"] = [f.as_json() for f in found]
        except DiagnoseError as e:  # e.g. no TTFT series yet: said on the page
            answer["findings"], answer["error"] = [], str(e)
        return answer

    async def handle(self, request: web.Request) -> web.Response:
        async with self._lock:
            if self._cached is None or time.monotonic() - self._at > self.max_age:
                self._cached = await asyncio.to_thread(self._run)
                self._at = time.monotonic()
            return web.json_response(self._cached)
