"""prometheus_client integration: `REGISTRY.register(exporter.collector())`.

For apps that already serve `/metrics` with prometheus_client. It yields the same families the
exporter's own `/metrics` serves, through prometheus_client's (slower, uncached) renderer.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .. import runtime
from .families import families


class ExporterCollector(Collector):
    """Collects from the process-wide recorder current at each scrape (follows configure())."""

    def collect(self) -> Iterable[Metric]:
        current = runtime.state()
        extra = current.renderer.extra
        yield from families(current.recorder, current.renderer.last_scrape_seconds)
        if extra is not None:
            yield from extra()
