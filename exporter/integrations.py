"""The integrations an app imports besides the functions of `exporter` itself.

Everything else under `exporter._internal` is private and changes without notice; these names
are public and stay (pinned by tests/test_public_api.py, documented in README.md):

* `aiohttp_middleware(tenant_header="x-tenant")` and `ASGIMiddleware(app, ...)`: set `route`
  (the matched route template) and `tenant` (a header) for every LLM call a request handler
  makes; `route_from_scope` is the ASGI default way to read the route.
* `aiohttp_trace_config()`: an aiohttp `TraceConfig` stamping the network phases of a manual
  `exporter.track()` call passed as `trace_request_ctx`.
* `httpx_trace(call, is_async=False)`: the same for a plain httpx / httpx2 client, as the
  request's `trace` extension.
* `genai_views(Config().seconds_buckets())`: OpenTelemetry SDK views giving the GenAI time
  histograms this exporter's SLO-aligned buckets.
* `Config`, `ConfigError`, `load_config`: the configuration `exporter.configure()` takes, and
  the error a mistake in it raises.
* `DeadlinePropagator()`: an OpenTelemetry propagator carrying the deadline in force in the
  `ttft-deadline-ms` header of every call OpenTelemetry instruments, and reading it back on the
  receiving side (also registered as `ttft_deadline` for `OTEL_PROPAGATORS`).
"""

from ._internal.config.loader import load as load_config
from ._internal.config.settings import Config, ConfigError
from ._internal.shim.aiohttp_trace import trace_config as aiohttp_trace_config
from ._internal.shim.deadline_propagator import DeadlinePropagator
from ._internal.shim.httpx_trace import trace_for as httpx_trace
from ._internal.shim.middleware import ASGIMiddleware, aiohttp_middleware, route_from_scope
from ._internal.shim.otel import genai_views

__all__ = ["ASGIMiddleware", "Config", "ConfigError", "DeadlinePropagator",
           "aiohttp_middleware", "aiohttp_trace_config", "genai_views", "httpx_trace",
           "load_config", "route_from_scope"]
