"""Shared fixtures: every test gets a fresh process-wide exporter state (a fresh registry)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporter._internal import runtime
from exporter._internal.shim import otel
from tests.support import timing

quiet_process = timing.quiet_process  # the `timing` mark's fixture


@pytest.fixture(autouse=True)
def fresh_state():
    runtime.configure(None)
    yield runtime.state()
    runtime.configure(None)


@pytest.fixture
def spans(monkeypatch) -> InMemorySpanExporter:
    """An SDK TracerProvider for this test only, recording finished spans in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(otel.trace, "get_tracer_provider", lambda: provider)
    return memory



# --- the calm demo: started first, judged last (tests/test_calm_demo.py) --------------------------
CALM_TESTS = "test_calm_demo.py"
_calm_run = pytest.StashKey[object]()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """When the calm demo's tests are selected, run them last and start the demo and its
    Prometheus now: its five minutes pass while the rest of the suite runs."""
    calm = [item for item in items if item.path.name == CALM_TESTS]
    if not calm:
        return
    items[:] = [item for item in items if item.path.name != CALM_TESTS] + calm
    import shutil

    if shutil.which("prometheus") is None:
        return  # the tests skip (fail on CI) with require_prometheus
    from tests.support.calm_run import CalmRun

    config.stash[_calm_run] = CalmRun()


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_calm_run, None)
    if run is not None:
        run.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def calm_run(request: pytest.FixtureRequest) -> object:
    """The calm demo and its Prometheus, started as the session started (CalmRun)."""
    from tests.support.prometheus import require_prometheus

    require_prometheus()
    return request.config.stash[_calm_run]
