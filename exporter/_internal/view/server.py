"""The view server: the pages, the static files (the page's script and uPlot), Prometheus'
API passed through and the findings, served on loopback by its own thread."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from aiohttp import web

from ..expose import http_thread
from ..expose.http_thread import HttpThread
from . import pages, security
from .backend import MAX_REPLY_BYTES, Findings, PrometheusProxy
from .boards import Board, BoardsError

STATIC = Path(__file__).parent / "static"
#: uPlot's built files, copied from the npm package by `make assets` (package.json pins it).
UPLOT = ("uPlot.iife.min.js", "uPlot.min.css")


def create_app(boards: Mapping[str, Board], prometheus_url: str,
               settings: pages.Settings = pages.Settings(), findings: Findings | None = None,
               *, allowed_hosts: Iterable[str] = (), max_reply_bytes: int = MAX_REPLY_BYTES
               ) -> web.Application:
    """The page of every board in `boards`, drawn from the Prometheus at `prometheus_url`;
    answered to a Host naming the server's address, `localhost` or one of `allowed_hosts`
    (security.py), Prometheus' answers passed up to `max_reply_bytes`."""
    missing = [name for name in UPLOT if not (STATIC / name).is_file()]
    if missing:
        raise BoardsError(f"{', '.join(missing)} missing from {STATIC}: run `make assets`")
    proxy = PrometheusProxy(prometheus_url, max_reply_bytes=max_reply_bytes)
    findings = findings or Findings(prometheus_url)

    async def landing(request: web.Request) -> web.Response:
        return web.Response(text=pages.landing(boards, settings), content_type="text/html")

    async def dashboard(request: web.Request) -> web.Response:
        board = boards.get(request.match_info["uid"])
        if board is None:
            raise web.HTTPNotFound(text=f"no dashboard {request.match_info['uid']!r}; "
                                        f"the landing page / lists them")
        return web.Response(text=pages.dashboard(board, boards, settings),
                            content_type="text/html")

    async def close(app: web.Application) -> None:
        await proxy.close()

    app = web.Application(middlewares=[security.host_allowlist(allowed_hosts)])
    app.on_response_prepare.append(security.add_headers)
    app.router.add_get("/", landing)
    app.router.add_get("/d/{uid}", dashboard)
    app.router.add_get("/d/{uid}/{slug}", dashboard)  # Grafana's /d/<uid>/<slug> too
    app.router.add_get("/api/findings", findings.handle)
    app.router.add_get("/api/v1/{path:.+}", proxy.handle)
    app.router.add_static("/static/", STATIC)
    app.on_cleanup.append(close)
    return app


class ViewServer(HttpThread):
    """The view app on its own event loop in a daemon thread."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0):
        super().__init__(app, host, port, name="ttft-exporter-view", shutdown_timeout=5.0)

    @property
    def url(self) -> str:
        """The landing page's URL."""
        return self.base_url + "/"


def serve_until_signalled(app: web.Application, host: str, port: int) -> None:
    """Serve in the foreground until SIGINT or SIGTERM; print the page's URL first."""
    http_thread.serve_until_signalled(ViewServer(app, host, port),
                                      lambda server: f"dashboards: {server.base_url}/")
