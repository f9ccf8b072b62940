"""Connection limits of the exporter's HTTP servers: how many, from whom, and how slow.

aiohttp reads a request's headers for as long as the client takes and accepts as many
connections as the process has descriptors, so 200 clients sending a byte a second held their
connections for good and ~1,000 exhausted the descriptors, starving /push and /healthz. Every
connection here passes a guard. One that has not sent a complete request's headers
`server.header_timeout_seconds` after it opened (or after its previous response) is closed
(`slow`); handlers reading a body bound it themselves (`server.body_timeout_seconds`, the
aggregator's /push).

A flood from one address must not take the slots of everyone else (a probe's /healthz, the
other workers' pushes), and the guard cannot know which connection is a probe before its
headers come. So a new connection is always let in while some connection is idle (waiting for
its request's headers): a client past `server.max_connections_per_client` loses its own oldest
idle connection, and past `server.max_connections` the client holding the most connections
loses its oldest idle one (`shed`). Only when every connection is inside a handler is a new one
closed at once (`limit`). Closed connections are counted by reason
(`ttft_exporter_http_connections_closed_total`).

With TLS the guard stands in front of the handshake (it runs `start_tls` itself once a
connection is let in): a connection that never completes its handshake holds a slot like one
that never sends its headers, and is shed or timed out the same way; asyncio's own TLS server
would keep it, uncounted, for 60 s.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

#: Connections closed by the guards of this process, by reason (`limit`, `slow`, `shed`).
CLOSED: dict[str, int] = {"limit": 0, "slow": 0, "shed": 0}
REASONS: tuple[str, ...] = tuple(CLOSED)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    header_timeout_seconds: float = 10.0
    max_connections_per_client: int = 64


class _Guarded(asyncio.Protocol):
    """A connection's protocol, in front of aiohttp's: counts it per client, and closes it when
    it sends no complete request in time or when a new connection needs its slot."""

    def __init__(self, guard: "ConnectionGuard", inner: Any):
        self.guard = guard
        self.inner = inner
        self.client = ""
        self.transport: asyncio.BaseTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False  # holds one of the guard's slots
        self.served = False  # aiohttp's protocol has seen connection_made
        self.handshake: asyncio.Task[None] | None = None  # TLS, until it is done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.guard.make_room(self.client):
            CLOSED["limit"] += 1
            transport.abort()
            return
        self.guard.add(self)
        self.counted = True
        self.arm()  # (the handshake, if any, and the headers within the header timeout)
        if self.guard.tls is None:
            self.serve(transport)
        else:
            self.handshake = asyncio.ensure_future(self._start_tls(transport))

    def serve(self, transport: asyncio.BaseTransport) -> None:
        self.served = True
        self.inner.connection_made(transport)

    async def _start_tls(self, transport: asyncio.BaseTransport) -> None:
        """The TLS handshake, then aiohttp's protocol on the decrypted transport (this protocol
        stays in between: it sees the connection end)."""
        assert self.guard.tls is not None
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport, self, self.guard.tls, server_side=True,  # type: ignore[arg-type]
                ssl_handshake_timeout=self.guard.limits.header_timeout_seconds)
        except (OSError, asyncio.CancelledError):  # failed, timed out, closed or shed
            self.release()
            return
        finally:
            self.handshake = None
        if tls is None or not self.counted:
            self.release()
            transport.abort()
            return
        self.serve(tls)

    def arm(self) -> None:
        """Wait for a complete request's headers, at most the header timeout: idle until then."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout_seconds, self.close,
                                     "slow")
        self.guard.idle.setdefault(self.client, {})[self] = None

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        idle = self.guard.idle.get(self.client)
        if idle is not None:
            idle.pop(self, None)
            if not idle:
                del self.guard.idle[self.client]

    def close(self, reason: str) -> None:
        """Close the connection now, counted under `reason`; its slot is free at once."""
        self.timer = None
        self.release()
        if self.transport is not None and not self.transport.is_closing():
            CLOSED[reason] += 1
            self.transport.abort()

    def release(self) -> None:
        self.disarm()
        if self.counted:
            self.counted = False
            self.guard.remove(self)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
        if self.served:
            self.served = False
            self.inner.connection_lost(exc)


class ConnectionGuard:
    """The guard of one listening socket (per server): its connections, per client."""

    def __init__(self, limits: Limits, tls: ssl.SSLContext | None = None):
        self.limits = limits
        self.tls = tls  # the guard runs the TLS handshake of each connection it lets in
        self.open = 0
        self.by_handler: dict[Any, _Guarded] = {}
        #: client address -> its open connections
        self.by_client: dict[str, int] = {}
        #: client address -> its connections waiting for a request's headers, oldest first
        self.idle: dict[str, dict[_Guarded, None]] = {}

    def protocol(self, inner: Any) -> _Guarded:
        return _Guarded(self, inner)

    def make_room(self, client: str) -> bool:
        """Room for one more connection of `client`, shedding an idle one if needed; False when
        every connection that would have to go is inside a handler."""
        if self.by_client.get(client, 0) >= self.limits.max_connections_per_client:
            return self.shed(client)
        if self.open >= self.limits.max_connections:
            heaviest = max(self.idle, key=self.by_client.__getitem__, default=None)
            return heaviest is not None and self.shed(heaviest)
        return True

    def shed(self, client: str) -> bool:
        idle = self.idle.get(client)
        if not idle:
            return False
        next(iter(idle)).close("shed")
        return True

    def add(self, guarded: _Guarded) -> None:
        self.open += 1
        self.by_client[guarded.client] = self.by_client.get(guarded.client, 0) + 1
        self.by_handler[guarded.inner] = guarded

    def remove(self, guarded: _Guarded) -> None:
        self.open -= 1
        left = self.by_client[guarded.client] - 1
        if left:
            self.by_client[guarded.client] = left
        else:
            del self.by_client[guarded.client]
        self.by_handler.pop(guarded.inner, None)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        """The headers are in: no header timeout (nor shedding) while the handler runs; again
        after it."""
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
        super().__init__(runner, sock, ssl_context=ssl_context)  # (its URL says https)
        self._guard = guard
        guard.tls = ssl_context

    async def start(self) -> None:
        await web.BaseSite.start(self)  # (registers the site with its runner)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: self._guard.protocol(server()), sock=self._sock, backlog=self._backlog)

    async def stop(self) -> None:
        """Also end the handshakes still running (aiohttp does not know those connections)."""
        for guarded in list(self._guard.by_handler.values()):
            if guarded.handshake is not None:
                guarded.handshake.cancel()  # (start_tls closes the connection)
        await super().stop()
