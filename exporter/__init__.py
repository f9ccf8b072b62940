"""ttft-exporter: time to first token, inter-token latency, stalls and call phases of LLM calls,
and where the time of an agent task goes.

The public surface is exactly what is imported here (pinned by tests/test_public_api.py).
Importing it loads the caller's side only: the server, the exposition, the push worker and
OpenTelemetry load when first used (docs/performance.md, "Start-up").
"""

import typing as _typing

from ._internal import runtime as _runtime
from ._internal.runtime import configure, start_http_server
from ._internal.shim.context import labels
from ._internal.shim.instrument import instrument, uninstrument
from ._internal.shim.manual import track
from ._internal.shim.task import guardrail, remaining, task, tool

if _typing.TYPE_CHECKING:
    from prometheus_client.registry import Collector as _Collector

__all__ = ["collector", "configure", "guardrail", "instrument", "labels", "remaining",
           "start_http_server", "task", "tool", "track", "uninstrument"]


def collector() -> "_Collector":
    """A prometheus_client collector of this process's metrics, for apps that serve /metrics."""
    return _runtime.collector()
