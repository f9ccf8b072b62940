"""The dashboards the page shows: the JSON files `ttft-exporter generate` wrote, read as they
are (no second definition of a panel), each addressed by its uid as Grafana does (`/d/<uid>`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BoardsError(Exception):
    """The dashboards directory is missing, empty or holds a file that is no dashboard; the
    message is the one line the command line prints."""


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    #: the dashboard's JSON text as written: the page parses this very text
    text: str
    panels: int


def _panels(doc: dict[str, Any]) -> int:
    """Panels that draw data (rows hold panels, they draw none)."""
    count = 0
    for panel in doc.get("panels", []):
        if panel.get("type") == "row":
            count += len(panel.get("panels", []))
        else:
            count += 1
    return count


def load_boards(directory: Path) -> dict[str, Board]:
    """Every `*.json` dashboard directly in `directory` (not its `native/` subdirectory: one
    mode at a time), by uid, sorted by title."""
    if not directory.is_dir():
        raise BoardsError(f"no dashboards directory {directory} (ttft-exporter generate "
                          f"writes one; pass --dashboards DIR)")
    boards = []
    for path in sorted(directory.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        try:
            doc = json.loads(text)
            uid, title = doc["uid"], doc["title"]
        except (ValueError, KeyError, TypeError):
            raise BoardsError(f"{path}: not a Grafana dashboard (JSON with uid and "
                              f"title)") from None
        boards.append(Board(uid, title, text, _panels(doc)))
    if not boards:
        raise BoardsError(f"no dashboards (*.json) in {directory}")
    return {board.uid: board for board in sorted(boards, key=lambda b: b.title)}
