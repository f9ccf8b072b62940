"""An aiohttp application served by its own event loop in a daemon thread.

The exporter's `/metrics` and the demo provider both serve callers that are synchronous or
must not lend their own loop (a service's threads, the CLI, tests): each runs its app here,
started and stopped from the caller's thread. The thread is a daemon, so a process that never
calls `stop()` still exits.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from .connection_guard import ConnectionGuard, GuardedSite, Limits

_Self = TypeVar("_Self", bound="HttpThread")
_T = TypeVar("_T")


def address(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def base_url(host: str, port: int, tls: bool = False) -> str:
    """`http(s)://host:port`."""
    return f"{'https' if tls else 'http'}://{address(host, port)}"


def _bound(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free port); OSError when it cannot be."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def address_problem(host: str) -> str | None:
    """Why this host cannot listen on `host` (None when it can): a name that does not resolve,
    or an address that is not one of this host's. Which ports are free is known only when
    binding."""
    try:
        _bound(host, 0).close()
    except (OSError, UnicodeError) as e:
        return f"cannot listen on {host!r}: {getattr(e, 'strerror', None) or e}"
    return None


async def serve(app: web.Application, host: str, port: int, *,
                ssl_context: ssl.SSLContext | None = None, shutdown_timeout: float = 60.0,
                limits: Limits = Limits()) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port from the running loop; returns its runner (clean it up to stop)
    and the bound port (port 0 picks a free one). `shutdown_timeout` is how long the cleanup
    waits for handlers still running; `limits` bound the connections (connection_guard.py)."""
    try:
        sock = _bound(host, port)
    except (OverflowError, OSError) as e:  # a port out of range, taken, an address not ours
        why = "the port must be 0-65535" if isinstance(e, OverflowError) else e.strerror or e
        raise OSError(getattr(e, "errno", None) or 0,
                      f"cannot listen on {address(host, port)}: {why}") from None
    guard = ConnectionGuard(limits)
    app.middlewares.append(guard.middleware)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await GuardedSite(runner, sock, guard, ssl_context=ssl_context).start()
    return runner, sock.getsockname()[1]


class HttpThread:
    """`app` served on host:port by its own event loop in a daemon thread named `name`.

    `start()` returns once the socket listens and raises a bind error in the caller; `stop()`
    cleans up the app, ends the handlers still running, then the loop and the thread.
    """

    def __init__(self, app: web.Application, host: str, port: int, *, name: str,
                 ssl_context: ssl.SSLContext | None = None, shutdown_timeout: float = 60.0,
                 limits: Limits = Limits()) -> None:
        self._app = app
        self._limits = limits
        self._host = host
        self._requested_port = port
        self._ssl = ssl_context
        self._shutdown_timeout = shutdown_timeout
        self._port = 0
        self._runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def port(self) -> int:
        """The bound port (the requested one, or the free one port 0 picked); 0 until started."""
        return self._port

    @property
    def base_url(self) -> str:
        """`http(s)://host:port` of the server."""
        return base_url(self._host, self._port, tls=self._ssl is not None)

    def start(self: _Self) -> _Self:
        """Start the thread and return once listening; a bind error is raised here."""
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result()
        except BaseException:
            self.stop()
            raise
        return self

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run `coroutine` on the server's loop (from another thread) and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self) -> None:
        """Stop serving and end the thread; does nothing when not running."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _listen(self) -> None:
        self._runner, self._port = await serve(
            self._app, self._host, self._requested_port, ssl_context=self._ssl,
            shutdown_timeout=self._shutdown_timeout, limits=self._limits)

    async def _shut_down(self) -> None:
        """Clean up the app, then cancel what is left (streams in flight), so the loop closes
        with no task pending."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def wait_for_signal(announce: str) -> None:
    """Print `announce` (scripts and tests read the real URL from it), then wait in the
    foreground until SIGINT or SIGTERM."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    print(announce, flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_until_signalled(server: HttpThread, announce: Callable[[HttpThread], str]) -> None:
    """Start `server` (port 0 picks a free port), print `announce(server)`, serve until SIGINT
    or SIGTERM, then stop."""
    server.start()
    try:
        wait_for_signal(announce(server))
    finally:
        server.stop()
