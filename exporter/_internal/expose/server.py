"""The aiohttp app serving `/metrics` and `/healthz`, in-process (daemon thread) or foreground.

Content negotiation follows Prometheus: the protobuf format (native histograms) when the
Accept header prefers it (Prometheus with native histograms on does), OpenMetrics when it
prefers that (Prometheus 2.x does by default), the 0.0.4 text format otherwise, including for
any header it cannot parse; gzip when accepted. A scrape's debuts (debut.py) are used up once
its body is written, within the timeout the scraper announced, to a connection still open.
Rendering and gzip run on the event loop's executor: never on the caller's threads, and the
loop answers /healthz and pushes meanwhile. A body is written a chunk at a time under the
connection guard's write timeout, so a client that does not read it holds one body and a
chunk of buffer, for a bounded time (connection_guard.py).
With an `Aggregator` (`ttft-exporter serve`) the app also takes worker pushes on `/push` and can
require auth on `/metrics` (never on `/healthz`: probes); the renderer serves the aggregator's
self-metrics with the rest.
"""

from __future__ import annotations

import asyncio
import gzip
import math
import time
import ssl
from typing import Callable, Protocol

from aiohttp import web

from .. import names
from ..config.settings import ServerConfig
from . import connection_guard
from .connection_guard import Limits
from .debut import SCRAPER_HEADER
from . import http_thread
from .http_thread import HttpThread
from .render_turns import RenderTurns
from .text import Renderer, Scrape
from .textformat import (OPENMETRICS, OPENMETRICS_CONTENT_TYPE, PROTOBUF, PROTOBUF_CONTENT_TYPE,
                         PROTOBUF_PROTO, TEXT, TEXT_CONTENT_TYPE)

#: Not answered on a reserved slot (connection_guard.py): its answer takes a render.
HEAVY_PATHS = frozenset({"/metrics"})
DEFAULT_PORT = 9469
DEFAULT_ADDR = "127.0.0.1"
#: gzip level 1: the exposition is repetitive text, level 1 already shrinks it ~10x at a
#: fraction of the CPU of the default level 9.
GZIP_LEVEL = 1
#: Scrapes waiting for a render at most (render_turns.py): more than the scrapers of a real
#: deployment (Prometheus replicas, a person), few enough that a flood of scrapes leaves the
#: connection slots sheddable.
MAX_WAITING_SCRAPES = 32
#: A body is handed to its connection this much at a time (_send).
WRITE_CHUNK = 256 * 1024


def wants_openmetrics(accept: str) -> bool:
    """True when the Accept header lists OpenMetrics (Prometheus puts it first)."""
    for part in accept.split(","):
        media = part.split(";")[0].strip()
        if media == "application/openmetrics-text":
            return True
    return False


_CONTENT_TYPES = {PROTOBUF: PROTOBUF_CONTENT_TYPE, OPENMETRICS: OPENMETRICS_CONTENT_TYPE,
                  TEXT: TEXT_CONTENT_TYPE}
_MEDIA = {"application/vnd.google.protobuf": PROTOBUF,
          "application/openmetrics-text": OPENMETRICS, "text/plain": TEXT, "text/*": TEXT,
          "*/*": TEXT}


def negotiate(accept: str) -> str:
    """The format the Accept header prefers among those served (highest q, then the first
    listed): PROTOBUF (only the delimited MetricFamily encoding), OPENMETRICS or TEXT, which is
    also the answer to anything else (an empty, unknown or malformed header)."""
    best, best_q = TEXT, 0.0
    for part in accept.split(","):
        media, *raw = (item.strip() for item in part.split(";"))
        params = dict(p.partition("=")[::2] for p in raw)
        params = {k.strip().lower(): v.strip().strip('"') for k, v in params.items()}
        kind = _MEDIA.get(media.lower())
        if kind == PROTOBUF and (params.get("proto") != PROTOBUF_PROTO
                                 or params.get("encoding") != "delimited"):
            continue
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            continue
        if kind is not None and 0 < q <= 1 and q > best_q:
            best, best_q = kind, q
    return best


def scraper_of(request: web.Request) -> str | None:
    """Who scrapes (debut.py): its address, and the `scraper` query parameter it sends, if
    any; None for a request without the scraper header (a person: real values)."""
    if SCRAPER_HEADER not in request.headers:
        return None
    name = request.query.get("scraper")
    return f"{request.remote}?scraper={name}" if name else str(request.remote)


def _render(renderer: Renderer, kind: str, scraper: str | None) -> tuple[str, Scrape]:
    """(format, body and delivery) in the negotiated format; text when protobuf fails (never
    a 5xx, counted; the failed render used up no debut)."""
    if kind == PROTOBUF:
        try:
            return kind, renderer.scrape(kind, scraper)
        except Exception:
            renderer.recorder.count_drop(names.DROP_INTERNAL)
            kind = TEXT
    return kind, renderer.scrape(kind, scraper)


def _timed_render(renderer: Renderer, kind: str, scraper: str | None
                  ) -> tuple[str, Scrape, float]:
    """`_render` and the seconds it took (on the executor's thread: what the next render
    waits, render_turns.py)."""
    started = time.perf_counter()
    kind, scrape = _render(renderer, kind, scraper)
    return kind, scrape, time.perf_counter() - started


def _timeout(request: web.Request) -> float:
    """The seconds the scraper waits for its body (its header; no limit if unreadable)."""
    try:
        return float(request.headers.get(SCRAPER_HEADER, ""))
    except ValueError:
        return float("inf")


def _busy(why: str, retry_after: float = 1.0) -> web.Response:
    """503, and the connection closed after it."""
    response = web.Response(status=503, text=f"busy: {why}\n",
                            headers={"Retry-After": str(max(math.ceil(retry_after), 1))})
    response.force_close()
    return response


async def _send(request: web.Request, body: bytes, headers: dict[str, str]
                ) -> tuple[web.StreamResponse, bool]:
    """Write `body` a chunk at a time, each once the client took most of the previous one:
    the connection's buffer then holds at most a chunk beyond the body itself (one write would
    copy the whole unsent body into it). True when all of it was handed to the connection;
    False when the client left or was closed (shed, or not reading within the write timeout:
    connection_guard.py), its scrape's debuts then kept for its next scrape."""
    response = web.StreamResponse(headers=headers)
    response.content_length = len(body)
    view = memoryview(body)
    try:
        await response.prepare(request)
        if request.method != "HEAD":  # (its headers only: the length of what GET sends)
            for start in range(0, len(view), WRITE_CHUNK):
                await response.write(view[start:start + WRITE_CHUNK])
        await response.write_eof()
    except ConnectionError:
        return response, False
    return response, True


class Extension(Protocol):
    """What `ttft-exporter serve` adds to the app (fleet/aggregator.py): auth on /metrics, its
    own routes and background work."""

    def metrics_authorized(self, authorization: str) -> bool: ...

    def metrics_challenge(self) -> str: ...

    def install(self, app: web.Application) -> None: ...


def create_app(renderer: Callable[[], Renderer], extension: Extension | None = None
               ) -> web.Application:
    """The exporter's HTTP app, serving what `renderer()` renders at each scrape."""

    turns = RenderTurns(MAX_WAITING_SCRAPES)

    async def metrics(request: web.Request) -> web.StreamResponse:
        if extension is not None and not extension.metrics_authorized(
                request.headers.get("Authorization", "")):
            return web.Response(status=401, text="unauthorized\n", headers={
                "WWW-Authenticate": extension.metrics_challenge()})
        arrived = time.monotonic()
        kind = negotiate(request.headers.get("Accept", ""))
        client = str(request.remote)
        refused = await turns.wait(client)
        if refused is not None:
            connection_guard.CLOSED["shed"] += 1
            return _busy(refused.why, refused.retry_after)
        sent = True
        try:
            response, sent = await scrape_turn(request, arrived, kind)
            return response
        finally:
            turns.finished(client, taken_back=not sent and connection_guard.taken_back(request))

    async def scrape_turn(request: web.Request, arrived: float, kind: str
                          ) -> tuple[web.StreamResponse, bool]:
        """Render (unless the client left while it waited), compress, write, deliver; True
        when the whole body was handed to the connection (or the client left before its
        render)."""
        loop = asyncio.get_running_loop()
        took = 0.0
        try:
            transport = request.transport
            if transport is None or transport.is_closing():
                return _busy("closed"), True
            current = renderer()
            # rendered off the event loop: /healthz and pushes are answered meanwhile
            kind, scrape, took = await loop.run_in_executor(None, _timed_render, current, kind,
                                                            scraper_of(request))
        finally:
            turns.rendered(took)
        body = scrape.body
        headers = {"Content-Type": _CONTENT_TYPES[kind]}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            # compressed off the event loop too: a multi-MB body takes tens of ms
            body = await loop.run_in_executor(None, gzip.compress, body, GZIP_LEVEL)
            headers["Content-Encoding"] = "gzip"
        response, sent = await _send(request, body, headers)
        transport = request.transport
        if (sent and scrape.delivery is not None and transport is not None
                and not transport.is_closing()
                and time.monotonic() - arrived <= _timeout(request)):
            current.delivered(scrape.delivery)
        return response, sent

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)  # (HEAVY_PATHS)
    app.router.add_get("/healthz", healthz)
    if extension is not None:
        extension.install(app)
    return app


class ExporterServer(HttpThread):
    """The exporter app running on its own event loop in a daemon thread."""

    def __init__(self, app: web.Application, addr: str, port: int,
                 ssl_context: ssl.SSLContext | None = None,
                 config: ServerConfig | None = None) -> None:
        """`config` bounds the connections (the defaults when None)."""
        super().__init__(app, addr, port, name="ttft-exporter-http", ssl_context=ssl_context,
                         limits=Limits.of(config or ServerConfig(), HEAVY_PATHS))

    @property
    def url(self) -> str:
        """The `/metrics` URL."""
        return self.base_url + "/metrics"


def serve_until_signalled(addr: str, port: int, app: web.Application,
                          ssl_context: ssl.SSLContext | None = None,
                          config: ServerConfig | None = None) -> None:
    """Serve in the foreground until SIGINT or SIGTERM, then stop cleanly; print the URL."""
    http_thread.serve_until_signalled(ExporterServer(app, addr, port, ssl_context, config),
                                      lambda server: f"ttft-exporter serving {server.url}")
