import types

import exporter
import exporter.integrations


def test_public_surface_is_pinned():
    public = sorted(name for name in dir(exporter) if not name.startswith("_")
                    and not isinstance(getattr(exporter, name), types.ModuleType))
    assert public == sorted(exporter.__all__)
    assert all(callable(getattr(exporter, name)) for name in public)
    # issue 15 added the agent-task API: task, tool, guardrail, remaining (README "Agent tasks")
    assert exporter.__all__ == ["collector", "configure", "guardrail", "instrument", "labels",
                                "remaining", "start_http_server", "task", "tool", "track",
                                "uninstrument"]


def test_integrations_surface_is_pinned():
    integrations = exporter.integrations
    public = sorted(name for name in dir(integrations) if not name.startswith("_"))
    assert public == sorted(integrations.__all__)
    assert integrations.__all__ == ["ASGIMiddleware", "Config", "ConfigError",
                                    "DeadlinePropagator", "aiohttp_middleware",
                                    "aiohttp_trace_config", "genai_views", "httpx_trace",
                                    "load_config", "route_from_scope"]
    assert all(callable(getattr(integrations, name)) for name in integrations.__all__)


def test_no_public_module_but_the_two():
    """Everything else is private: the package's only public modules are these."""
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(exporter.__path__)}
    assert {m for m in modules if not m.startswith("_")} == {"cli", "integrations"}
