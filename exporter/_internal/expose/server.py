"""The aiohttp app serving `/metrics` and `/healthz`, in-process (daemon thread) or foreground.

Content negotiation follows Prometheus: the protobuf format (native histograms) when the
Accept header prefers it (Prometheus with native histograms on does), OpenMetrics when it
prefers that (Prometheus 2.x does by default), the 0.0.4 text format otherwise, including for
any header it cannot parse; gzip when accepted. A scrape's debuts (debut.py) are used up once
its body is written, within the timeout the scraper announced, to a connection still open.
Rendering runs on the server's own thread so a scrape never runs on the caller's threads.
With an `Aggregator` (`ttft-exporter serve`) the app also takes worker pushes on `/push` and can
require auth on `/metrics` (never on `/healthz`: probes); the renderer serves the aggregator's
self-metrics with the rest.
"""

from __future__ import annotations

import asyncio
import gzip
import time
import ssl
from typing import Callable, Protocol

from aiohttp import web

from .. import names
from ..config.settings import ServerConfig
from .connection_guard import Limits
from .debut import SCRAPER_HEADER
from . import http_thread
from .http_thread import HttpThread
from .text import Renderer, Scrape
from .textformat import (OPENMETRICS, OPENMETRICS_CONTENT_TYPE, PROTOBUF, PROTOBUF_CONTENT_TYPE,
                         PROTOBUF_PROTO, TEXT, TEXT_CONTENT_TYPE)

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


def _timeout(request: web.Request) -> float:
    """The seconds the scraper waits for its body (its header; no limit if unreadable)."""
    try:
        return float(request.headers.get(SCRAPER_HEADER, ""))
    except ValueError:
        return float("inf")


class Extension(Protocol):
    """What `ttft-exporter serve` adds to the app (fleet/aggregator.py): auth on /metrics, its
    own routes and background work."""

    def metrics_authorized(self, authorization: str) -> bool: ...

    def metrics_challenge(self) -> str: ...

    def install(self, app: web.Application) -> None: ...


def create_app(renderer: Callable[[], Renderer], extension: Extension | None = None
               ) -> web.Application:
    """The exporter's HTTP app, serving what `renderer()` renders at each scrape."""

    async def metrics(request: web.Request) -> web.Response:
        if extension is not None and not extension.metrics_authorized(
                request.headers.get("Authorization", "")):
            return web.Response(status=401, text="unauthorized\n", headers={
                "WWW-Authenticate": extension.metrics_challenge()})
        arrived = time.monotonic()
        kind = negotiate(request.headers.get("Accept", ""))
        current = renderer()
        # rendered off the event loop: /healthz and pushes are answered meanwhile
        kind, scrape = await asyncio.get_running_loop().run_in_executor(
            None, _render, current, kind, scraper_of(request))
        body = scrape.body
        headers = {"Content-Type": _CONTENT_TYPES[kind]}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, GZIP_LEVEL)
            headers["Content-Encoding"] = "gzip"
        response = web.Response(body=body, headers=headers)
        if scrape.delivery is None:
            return response
        try:
            await response.prepare(request)
            await response.write_eof()
        except ConnectionError:  # the scraper left: its debuts stay for its next scrape
            return response
        transport = request.transport
        if (transport is not None and not transport.is_closing()
                and time.monotonic() - arrived <= _timeout(request)):
            current.delivered(scrape.delivery)
        return response

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
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
        server = config or ServerConfig()
        super().__init__(app, addr, port, name="ttft-exporter-http", ssl_context=ssl_context,
                         limits=Limits(server.max_connections, server.header_timeout_seconds,
                                       server.max_connections_per_client))

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
