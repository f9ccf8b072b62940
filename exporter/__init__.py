"""ttft-exporter: time to first token, inter-token latency, stalls and call phases of LLM calls.

The public surface is exactly what is imported here (pinned by tests/test_public_api.py).
"""

from prometheus_client.registry import Collector as _Collector

from . import collector as _collector_module  # before `def collector`, which must win the name
from .runtime import configure
from .server import start_http_server
from .shim.context import labels
from .shim.instrument import instrument, uninstrument
from .shim.manual import track

__all__ = ["collector", "configure", "instrument", "labels", "start_http_server", "track",
           "uninstrument"]


def collector() -> _Collector:
    """A prometheus_client collector of this process's metrics, for apps that serve /metrics."""
    return _collector_module.ExporterCollector()
