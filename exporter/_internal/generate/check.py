"""`ttft-exporter generate --check`: every panel queries only metrics some code defines.

A dashboard that reads a metric nobody serves shows "No data" forever and looks like a calm
system (vLLM's dashboard generator has the same check). The metrics a panel may read are the
families the exporter serves (with their `_bucket`/`_sum`/`_count` series), what the generated
rules record, and what Prometheus adds itself (`up`, `ALERTS`). The check reads the dashboard
files as they are on disk, so a hand edit or a stale file fails it too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .. import names
from ..config.settings import Config
from . import alerts
from .reference import served_families

#: Series Prometheus itself makes: per target, and per alert.
PROMETHEUS_OWN = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
#: The series of each family type, by suffix.
SUFFIXES = {"histogram": ("", "_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count"),
            "counter": ("",), "gauge": ("",)}
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on",
                       "ignoring", "group_left", "group_right", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions,
    aggregations, keywords, label names, label values, durations or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ",
                  text)  # label lists
    text = re.sub(r"\boffset\s+[\w$]+", " ", text)
    found = set()
    for match in re.finditer(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.groups()
        if not call and name not in _KEYWORDS:
            found.add(name)
    return found


def defined_metrics(configs: Iterable[Config]) -> set[str]:
    """Every series name a panel may read under any of `configs`."""
    out = {*PROMETHEUS_OWN, names.LIKELY_CAUSE}  # (served by `ttft-exporter watch`)
    for name, kind, _labels, _help in served_families():
        out |= {name + suffix for suffix in SUFFIXES[kind]}
    for config in configs:
        out |= {rule["record"] for groups in (alerts.recording_rules(config),
                                              alerts.cause_rules(config))
                for group in groups for rule in group["rules"] if "record" in rule}
    return out


def panel_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' panels included, and of
    the query variables."""
    todo = list(dashboard.get("panels", []))
    while todo:
        panel = todo.pop(0)
        todo.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel.get("title", ""), target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("definition") or ""
        if query.startswith("label_values("):
            selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
            yield f"variable {variable.get('name')}", selector


def undefined_metrics(files: Iterable[Path], defined: set[str]) -> list[str]:
    """One line per (file, panel, metric) read that no code defines."""
    problems = []
    for path in files:
        dashboard = json.loads(Path(path).read_text(encoding="utf-8"))
        for title, expr in panel_queries(dashboard):
            problems += [f"{path}: panel {title!r} reads {name}, which nothing defines"
                         for name in sorted(metric_names(expr) - defined)]
    return problems
