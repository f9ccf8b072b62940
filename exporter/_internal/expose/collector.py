"""prometheus_client integration: `REGISTRY.register(exporter.collector())`.

For apps that already serve `/metrics` with prometheus_client. It yields the same families the
exporter's own `/metrics` serves, through prometheus_client's (slower, uncached) renderer.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .families import families
from .text import Renderer


class ExporterCollector(Collector):
    """Collects what `renderer()` serves, read afresh at each scrape (so it follows the
    process-wide state through configure())."""

    def __init__(self, renderer: Callable[[], Renderer]):
        self._renderer = renderer

    def collect(self) -> Iterable[Metric]:
        current = self._renderer()
        yield from families(current.recorder, current.last_scrape_seconds)
        if current.extra is not None:
            yield from current.extra()
