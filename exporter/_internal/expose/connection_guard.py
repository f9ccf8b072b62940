"""Connection limits of the exporter's HTTP servers: how many, and how slow a client may be.

aiohttp reads a request's headers for as long as the client takes and accepts as many
connections as the process has descriptors, so 200 clients sending a byte a second held their
connections for good and ~1,000 exhausted the descriptors, starving /push and /healthz. Every
connection here passes a guard: past `server.max_connections` a new one is closed at once; one
that has not sent a complete request's headers `server.header_timeout_seconds` after it opened
(or after its previous response) is closed; handlers reading a body bound it themselves
(`server.body_timeout_seconds`, the aggregator's /push). Closed connections are counted by
reason (`ttft_exporter_http_connections_closed_total`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

#: Connections closed by the guards of this process, by reason (`limit`, `slow`).
CLOSED: dict[str, int] = {"limit": 0, "slow": 0}
REASONS: tuple[str, ...] = tuple(CLOSED)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    header_timeout_seconds: float = 10.0


class _Guarded(asyncio.Protocol):
    """A connection's protocol, in front of aiohttp's: counts it, and closes it when too many
    are open or when it sends no complete request in time."""

    def __init__(self, guard: "ConnectionGuard", inner: Any):
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.guard.open >= self.guard.limits.max_connections:
            CLOSED["limit"] += 1
            transport.abort()
            return
        self.guard.open += 1
        self.counted = True
        self.guard.by_handler[self.inner] = self
        self.arm()
        self.inner.connection_made(transport)

    def arm(self) -> None:
        """Wait for a complete request's headers, at most the header timeout."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout_seconds, self._too_slow)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            CLOSED["slow"] += 1
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.counted:
            self.counted = False
            self.guard.open -= 1
            self.guard.by_handler.pop(self.inner, None)
            self.inner.connection_lost(exc)


class ConnectionGuard:
    """The guard of one listening socket (per server)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.open = 0
        self.by_handler: dict[Any, _Guarded] = {}

    def protocol(self, inner: Any) -> _Guarded:
        return _Guarded(self, inner)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        """The headers are in: no header timeout while the handler runs; again after it."""
        guarded = self.by_handler.get(request.protocol)
        if guarded is not None:
            guarded.disarm()
        try:
            return await handler(request)
        finally:
            if guarded is not None and guarded.counted:
                guarded.arm()


class GuardedSite(web.SockSite):
    """aiohttp's socket site, its connections passing a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, guard: ConnectionGuard, *,
                 ssl_context: ssl.SSLContext | None = None):
        super().__init__(runner, sock, ssl_context=ssl_context)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # (registers the site with its runner)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: self._guard.protocol(server()), sock=self._sock, ssl=self._ssl_context,
            backlog=self._backlog)
