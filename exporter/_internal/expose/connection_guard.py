"""Connection limits of the exporter's HTTP servers: how many, from whom, and how slow.

aiohttp reads a request's headers for as long as the client takes, writes a response for as
long as the client takes to read it, and accepts as many connections as the process has
descriptors: 200 clients sending a byte a second held their connections for good, ~1,000
exhausted the descriptors, and 256 clients that asked for /metrics and never read the body held
every slot and a multi-MB body each, starving /push and /healthz. Every connection here passes
a guard, in one of three states:

- idle, waiting for a request's headers: closed (`slow`) when they are not complete
  `server.header_timeout_seconds` after it opened (or after its previous response), or
  (`large`) when the request's head passes 32 KiB (aiohttp would hold ~2 MiB of headers);
- inside a handler: no timer (handlers reading a body bound it themselves,
  `server.body_timeout_seconds` on the aggregator's /push);
- unread: its response filled the connection's send buffer (the client reads slower than the
  server writes: a body larger than the buffer, and a client that is slow or never reads).
  The rest of that response must be taken within `server.write_timeout_seconds`, else it is
  abandoned and the connection closed (`unread`). At most `server.max_unread_responses` are
  unread at once (each pins its body in memory): one more closes the oldest unread response of
  the client holding the most connections (`shed`).

A flood from one address must not take the slots of everyone else (a probe's /healthz, the
other workers' pushes), and the guard cannot know which connection is a probe before its
headers come. So a new connection is let in while some connection is idle or unread: a client
past `server.max_connections_per_client` loses its own oldest such connection, and past
`server.max_connections` the client holding the most connections loses its oldest one
(`shed`). When every slot is inside a handler (a queue of renders, trickled /push bodies), a
new connection takes one of `server.reserved_connections` slots kept past the others, shed the
same way; a reserved slot answers everything but the paths the server names heavy (/metrics:
503, closed, counted `limit`), so /healthz and /push are answered whatever the load. Only when
the reserve too is inside handlers is a new connection closed at once (`limit`). Closed
connections are counted by reason (`ttft_exporter_http_connections_closed_total`).

With TLS the guard stands in front of the handshake (it runs `start_tls` itself once a
connection is let in): a connection that never completes its handshake holds a slot like one
that never sends its headers, and is shed or timed out the same way; asyncio's own TLS server
would keep it, uncounted, for 60 s.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..config.settings import ServerConfig
from .closed_connections import CLOSED  # (the server and aggregator count here too)

_IDLE, _HANDLING, _UNREAD = "idle", "handling", "unread"
#: The kernel's send buffer of each connection (Linux doubles it for its bookkeeping), instead
#: of its autotuning up to net.ipv4.tcp_wmem (4 MiB): what a client that does not read holds
#: in the kernel, beyond what the guard sees. 128 KiB in flight: ~250 MB/s at 0.5 ms of round
#: trip, 2.5 MB/s at 50 ms; Prometheus asks for gzip, ~1/25 of the text.
SEND_BUFFER_BYTES = 128 * 1024
#: A request's head (its line and headers) at most: aiohttp would take 128 headers of 16 KB,
#: ~2 MiB held a connection until they end. Prometheus and the workers send under 1 KB.
MAX_HEAD_BYTES = 32 * 1024
#: The request's key of its connection's guard (`taken_back`).
_GUARDED: web.RequestKey[_Guarded] = web.RequestKey("ttft_exporter_guarded", "_Guarded")


def taken_back(request: web.Request) -> bool:
    """True when the guard closed the request's connection: shed, or its response left unread
    past the write timeout (not when the client closed it)."""
    guarded = request.get(_GUARDED)
    return guarded is not None and guarded.taken_back


def _set(transport: asyncio.BaseTransport, option: int, value: int | bytes) -> None:
    """A socket option of the connection's socket (if it has one the kernel still knows)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, value)
        except OSError:
            pass


@dataclass(frozen=True)
class Limits:
    """The guard's bounds (server.* in the config, whose comments say what each is)."""

    max_connections: int = 256
    header_timeout_seconds: float = 10.0
    max_connections_per_client: int = 64
    write_timeout_seconds: float = 30.0
    max_unread_responses: int = 8
    reserved_connections: int = 8
    #: Paths a reserved slot does not serve (503): those whose answers are heavy to make.
    heavy_paths: frozenset[str] = frozenset()

    @classmethod
    def of(cls, server: ServerConfig, heavy_paths: frozenset[str] = frozenset()) -> "Limits":
        """The limits a config's `server` section sets: the one place every server of the
        exporter (serve, start_http_server, watch) takes them from."""
        return cls(max_connections=server.max_connections,
                   header_timeout_seconds=server.header_timeout_seconds,
                   max_connections_per_client=server.max_connections_per_client,
                   write_timeout_seconds=server.write_timeout_seconds,
                   max_unread_responses=server.max_unread_responses,
                   reserved_connections=server.reserved_connections, heavy_paths=heavy_paths)


class _Pool:
    """Slots of one kind (the main ones, or the reserve): the connections in them per client,
    and those that can be taken back (idle or unread) per client, oldest first."""

    def __init__(self, size: int):
        self.size = size
        self.open = 0
        self.by_client: dict[str, int] = {}
        self.sheddable: dict[str, dict[_Guarded, None]] = {}

    def has_room(self) -> bool:
        return self.open < self.size

    def shed_heaviest(self) -> bool:
        """Close the oldest sheddable connection of the client holding the most here."""
        heaviest = max(self.sheddable, key=self.by_client.__getitem__, default=None)
        return heaviest is not None and self.shed(heaviest)

    def shed(self, client: str) -> bool:
        """Close `client`'s oldest sheddable connection here; False when it has none."""
        connections = self.sheddable.get(client)
        if not connections:
            return False
        next(iter(connections)).close("shed")
        return True


def _add(by_client: dict[str, dict[_Guarded, None]], guarded: _Guarded) -> None:
    by_client.setdefault(guarded.client, {})[guarded] = None


def _discard(by_client: dict[str, dict[_Guarded, None]], guarded: _Guarded) -> None:
    connections = by_client.get(guarded.client)
    if connections is not None:
        connections.pop(guarded, None)
        if not connections:
            del by_client[guarded.client]


class _Guarded(asyncio.Protocol):
    """A connection's protocol, in front of aiohttp's: counts it per client, times its request
    headers and its unread responses, and closes it when a new connection needs its slot."""

    def __init__(self, guard: "ConnectionGuard", inner: Any):
        self.guard = guard
        self.inner = inner
        self.client = ""
        self.transport: asyncio.BaseTransport | None = None
        self.pool: _Pool | None = None  # the pool holding its slot, None once released
        self.state = _HANDLING
        self.timer: asyncio.TimerHandle | None = None  # the header or the write timeout
        #: The last bytes of the request head so far (None once it ended), and what it may grow
        self.head: bytes | None = b""
        self.head_left = MAX_HEAD_BYTES
        self.served = False  # aiohttp's protocol has seen connection_made
        self.taken_back = False  # the guard closed it (shed, or a response left unread)
        self.handshake: asyncio.Task[None] | None = None  # TLS, until it is done

    @property
    def counted(self) -> bool:
        """It holds one of the guard's slots."""
        return self.pool is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        pool = self.guard.make_room(self.client)
        if pool is None:
            CLOSED["limit"] += 1
            transport.abort()
            return
        self.pool = pool
        self.guard.add(self)
        _set(transport, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
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
        """Idle: wait for a complete request's headers, at most the header timeout."""
        self._leave_state()
        self.head, self.head_left = b"", MAX_HEAD_BYTES
        self._enter(_IDLE, self.guard.limits.header_timeout_seconds, "slow")

    def handling(self) -> None:
        """Inside a handler: no timer, not sheddable."""
        self._leave_state()

    def _enter(self, state: str, seconds: float, reason: str) -> None:
        assert self.pool is not None
        self.state = state
        self.timer = asyncio.get_running_loop().call_later(seconds, self.close, reason)
        _add(self.pool.sheddable, self)

    def _leave_state(self) -> None:
        """Back to `handling`: its timer cancelled, no longer sheddable nor unread."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pool is not None:
            _discard(self.pool.sheddable, self)
        if self.state == _UNREAD:
            self.guard.unread_count -= 1
            _discard(self.guard.unread, self)
        self.state = _HANDLING

    def close(self, reason: str) -> None:
        """Close the connection now, counted under `reason`; its slot is free at once."""
        self.timer = None
        self.release()
        if self.transport is not None and not self.transport.is_closing():
            CLOSED[reason] += 1
            self.taken_back = True
            # a reset: the kernel drops what the client did not read (a plain close would
            # keep sending it, for minutes, to a client that does not read)
            _set(self.transport, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

    def release(self) -> None:
        self._leave_state()
        if self.pool is not None:
            self.guard.remove(self)
            self.pool = None

    def data_received(self, data: bytes) -> None:
        if self.head is not None:  # the head goes on until its blank line
            if b"\r\n\r\n" in self.head + data[:self.head_left + 4]:
                self.head = None
            elif len(data) > self.head_left:
                self.close("large")
                return
            else:
                self.head, self.head_left = (self.head + data)[-3:], self.head_left - len(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        """The send buffer is full: a response inside a handler is now unread (once per
        response: the write timeout runs until its end, whatever the client reads meanwhile)."""
        if self.state == _HANDLING and self.counted:
            self.guard.make_unread_room()
            self.guard.unread_count += 1
            _add(self.guard.unread, self)
            self._enter(_UNREAD, self.guard.limits.write_timeout_seconds, "unread")
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
        self.main = _Pool(limits.max_connections)
        self.reserve = _Pool(limits.reserved_connections)
        self.by_handler: dict[Any, _Guarded] = {}
        #: client address -> its open connections, in both pools
        self.by_client: dict[str, int] = {}
        #: client address -> its connections with an unread response, oldest first
        self.unread: dict[str, dict[_Guarded, None]] = {}
        self.unread_count = 0

    @property
    def open(self) -> int:
        return self.main.open + self.reserve.open

    def protocol(self, inner: Any) -> _Guarded:
        return _Guarded(self, inner)

    def make_room(self, client: str) -> _Pool | None:
        """The pool with room for one more connection of `client`, after shedding one if
        needed: its own past its cap, else the heaviest client's in the main slots, else in
        the reserve; None when every connection that would have to go is inside a handler."""
        if (self.by_client.get(client, 0) >= self.limits.max_connections_per_client
                and not (self.main.shed(client) or self.reserve.shed(client))):
            return None
        for pool in (self.main, self.reserve):
            if pool.has_room() or pool.shed_heaviest():
                return pool
        return None

    def make_unread_room(self) -> None:
        """Room for one more unread response: past the cap, the oldest one of the client
        holding the most connections is shed."""
        if self.unread_count >= self.limits.max_unread_responses:
            heaviest = max(self.unread, key=self.by_client.__getitem__, default=None)
            if heaviest is not None:
                next(iter(self.unread[heaviest])).close("shed")

    def add(self, guarded: _Guarded) -> None:
        pool = guarded.pool
        assert pool is not None
        pool.open += 1
        pool.by_client[guarded.client] = pool.by_client.get(guarded.client, 0) + 1
        self.by_client[guarded.client] = self.by_client.get(guarded.client, 0) + 1
        self.by_handler[guarded.inner] = guarded

    def remove(self, guarded: _Guarded) -> None:
        pool = guarded.pool
        assert pool is not None
        pool.open -= 1
        for by_client in (pool.by_client, self.by_client):
            left = by_client[guarded.client] - 1
            if left:
                by_client[guarded.client] = left
            else:
                del by_client[guarded.client]
        self.by_handler.pop(guarded.inner, None)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        """The headers are in: no header timeout (nor shedding) while the handler runs, and
        the response written here, so that its write is timed (unread) until its end; idle
        again after it. A reserved slot refuses the heavy paths."""
        guarded = self.by_handler.get(request.protocol)
        if guarded is None:
            return await handler(request)
        request[_GUARDED] = guarded
        guarded.handling()
        try:
            if guarded.pool is self.reserve and request.path in self.limits.heavy_paths:
                CLOSED["limit"] += 1
                response = web.Response(status=503, text="busy: every connection is in use\n",
                                        headers={"Retry-After": "1"})
                response.force_close()
            else:
                response = await handler(request)
            try:
                await response.prepare(request)  # (nothing to do if the handler wrote it)
                await response.write_eof()
            except ConnectionError:  # the client left, or was closed (shed, unread)
                pass
            return response
        finally:
            if guarded.counted:
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
