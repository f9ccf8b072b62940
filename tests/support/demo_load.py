"""The demo's provider, exporter and load generator, running in the background of a test.

    with DemoLoad(rate=8) as demo:         # provider + exporter on free loopback ports
        demo.metrics_url                   # scrape target for a real Prometheus
        demo.play(day)                     # an IncidentDay on the load's loop (a future)
        ...
        demo.stop_load()                   # cancel in-flight calls; the exporter keeps serving

`far_region=True` also serves the provider's far region, where the route change sends calls;
`agents=True` also runs the demo's agent tasks, as `ttft-exporter demo` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from types import TracebackType

from exporter._internal import runtime
from exporter._internal.demo.agents import run_agents
from exporter._internal.demo.incidents import IncidentDay
from exporter._internal.demo.latency import LatencyModel
from exporter._internal.demo.loadgen import LoadGenerator, LoadShape
from exporter._internal.demo.provider import ProviderServer
from exporter._internal.expose.server import ExporterServer


class DemoLoad:
    def __init__(self, rate: float = 8.0, seed: int = 7, far_region: bool = False,
                 model: LatencyModel | None = None, shape: LoadShape | None = None,
                 agents: bool = False):
        self.provider = ProviderServer(model, far_region=far_region).start()
        self.knobs = self.provider.knobs
        self.exporter: ExporterServer = runtime.start_http_server(port=0)
        self.recorder = runtime.state().recorder
        self._load = LoadGenerator(self.provider.base_url, shape or LoadShape(rate=rate, seed=seed),
                                   self.knobs, self.provider.far)
        self._agents = agents
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="demo-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        stop = asyncio.Event()  # the agents', set when the load stops
        agents = asyncio.create_task(run_agents(self.provider.base_url, stop)) \
            if self._agents else None
        try:
            await self._load.run()
        finally:
            stop.set()
            if agents is not None:
                await agents

    def play(self, day: IncidentDay) -> concurrent.futures.Future[None]:
        """Play an incident day on the load's loop; the future ends with the day."""
        return asyncio.run_coroutine_threadsafe(day.run(), self._loop)

    @property
    def metrics_url(self) -> str:
        return self.exporter.url

    @property
    def target(self) -> str:
        """host:port, as a Prometheus static_config target."""
        return self.exporter.url.split("//", 1)[1].split("/", 1)[0]

    def stop_load(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._load.stop)
            self._thread.join(timeout=30)

    def close(self) -> None:
        self.stop_load()
        self.exporter.stop()
        self.provider.stop()

    def __enter__(self) -> DemoLoad:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
