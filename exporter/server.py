"""The aiohttp app serving `/metrics` and `/healthz`, in-process (daemon thread) or foreground.

Content negotiation follows Prometheus: OpenMetrics when the scraper's Accept header asks for
it (Prometheus 2.x does by default), the 0.0.4 text format otherwise; gzip when accepted.
Rendering runs on the server's own thread so a scrape never runs on the caller's threads.
"""

from __future__ import annotations

import asyncio
import gzip
import signal
import socket
import threading
from typing import Callable

from aiohttp import web

from . import runtime
from .exposition import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Renderer

DEFAULT_PORT = 9469
DEFAULT_ADDR = "127.0.0.1"
#: gzip level 1: the exposition is repetitive text, level 1 already shrinks it ~10x at a
#: fraction of the CPU of the default level 9.
GZIP_LEVEL = 1


def wants_openmetrics(accept: str) -> bool:
    """True when the Accept header lists OpenMetrics (Prometheus puts it first)."""
    for part in accept.split(","):
        media = part.split(";")[0].strip()
        if media == "application/openmetrics-text":
            return True
    return False


def create_app(renderer: Callable[[], Renderer] | None = None) -> web.Application:
    """The exporter's HTTP app; `renderer` defaults to the process-wide one (runtime.state())."""
    get_renderer = renderer or (lambda: runtime.state().renderer)

    async def metrics(request: web.Request) -> web.Response:
        openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
        body = get_renderer().render(openmetrics)
        headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else
                   TEXT_CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, GZIP_LEVEL)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


class ExporterServer:
    """The exporter app running on its own event loop in a daemon thread."""

    def __init__(self, app: web.Application, addr: str, port: int):
        self._app = app
        self._addr = addr
        self._requested_port = port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ttft-exporter-http", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self._addr}]" if ":" in self._addr else self._addr
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> "ExporterServer":
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start(); the thread must not die silently
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _serve(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in self._addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._addr, self._requested_port))
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.port = sock.getsockname()[1]

    def stop(self) -> None:
        """Stop serving and end the thread (tests; the daemon thread also dies with the process)."""
        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            self._loop.stop()
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
            self._thread.join(timeout=5)


def start_http_server(port: int = DEFAULT_PORT, addr: str = DEFAULT_ADDR) -> ExporterServer:
    """Serve the process-wide metrics on addr:port from a daemon thread; returns the server."""
    return ExporterServer(create_app(), addr, port).start()


def serve_until_signalled(addr: str, port: int) -> None:
    """Serve in the foreground until SIGINT or SIGTERM, then stop cleanly.

    Prints the real URL (port 0 picks a free port) so scripts and tests can find it.
    """
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    server = start_http_server(port=port, addr=addr)
    print(f"ttft-exporter serving {server.url}", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
