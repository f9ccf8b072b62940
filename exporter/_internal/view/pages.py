"""The HTML of the landing page and of a dashboard's page: a shell the page's script
(static/view.js) fills in. A dashboard's JSON goes into the page as its file's text."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from .boards import Board


@dataclass(frozen=True)
class Settings:
    """What the page needs to know besides a dashboard: Prometheus' scrape interval (for
    `$__rate_interval`, as in Grafana's data source settings), the time range when the URL
    gives none (None: the dashboard's own), and how often the page refreshes."""

    scrape_seconds: float = 15.0
    time_from: str | None = None
    refresh_seconds: float = 30.0


def _script_json(text: str) -> str:
    """JSON text safe inside <script>: `</` cannot end the element."""
    return text.replace("</", "<\\/")


def _page(title: str, boards: Mapping[str, Board], settings: Settings, body: str) -> str:
    nav = "".join(f'<a href="/d/{html.escape(b.uid)}">{html.escape(b.title)}</a>'
                  for b in boards.values())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)} · ttft-exporter view</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/uPlot.min.css"><link rel="stylesheet" href="/static/view.css">
</head><body>
<header><a class="home" href="/">ttft-exporter view</a><nav>{nav}</nav>
<span id="range"></span></header>
<section id="status"><div id="alerts" class="box">alerts: loading</div>
<div id="findings" class="box">diagnose: loading</div></section>
{body}
<script type="application/json" id="settings">{_script_json(json.dumps(asdict(settings)))}</script>
<script src="/static/uPlot.iife.min.js"></script><script src="/static/promql.js"></script>
<script src="/static/units.js"></script>
<script src="/static/panels.js"></script><script src="/static/view.js"></script>
</body></html>
"""


def landing(boards: Mapping[str, Board], settings: Settings) -> str:
    items = "".join(
        f'<li><a href="/d/{html.escape(b.uid)}">{html.escape(b.title)}</a> '
        f'<span class="muted">{b.panels} panels · /d/{html.escape(b.uid)}</span></li>'
        for b in boards.values())
    return _page("dashboards", boards, settings,
                 f'<main><h1>Dashboards</h1><ul id="boards">{items}</ul></main>')


def dashboard(board: Board, boards: Mapping[str, Board], settings: Settings) -> str:
    return _page(board.title, boards, settings,
                 f'<h1>{html.escape(board.title)}</h1><div id="variables"></div>'
                 f'<main id="board"></main>\n<script type="application/json" id="dashboard">'
                 f'{_script_json(board.text)}</script>')
