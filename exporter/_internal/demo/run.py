"""`ttft-exporter demo`: provider, load and exporter in one process, with a live table."""

from __future__ import annotations

import asyncio
import signal

from .. import runtime
from ..server import start_http_server
from .agents import run_agents
from .loadgen import LoadGenerator, LoadShape
from .provider import ProviderServer
from .table import TerminalTable

PRINT_EVERY = 5.0


def run_demo(port: int = 9469, seconds: float = 0.0, config: str | None = None,
             shape: LoadShape = LoadShape()) -> int:
    """Run until Ctrl-C/SIGTERM (or `seconds`), printing the table every few seconds."""
    runtime.configure(config)
    with ProviderServer() as provider:
        server = start_http_server(port=port)
        print(f"demo provider: {provider.base_url}/v1 (OpenAI and Anthropic wire formats)")
        print(f"metrics:       {server.url}", flush=True)
        try:
            asyncio.run(_drive(provider.base_url, seconds, shape))
        finally:
            server.stop()
    return 0


async def _drive(base_url: str, seconds: float, shape: LoadShape) -> None:
    load = LoadGenerator(base_url, shape)
    stop = asyncio.Event()  # the agent workload's (agents.py), set with the load's
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (load.stop(), stop.set()))
    table = TerminalTable(runtime.state().recorder)

    async def report() -> None:
        while True:
            await asyncio.sleep(PRINT_EVERY)
            print(f"\n{load.calls} calls, {load.errors} errors\n{table.render()}", flush=True)

    reporter = asyncio.create_task(report())
    agents = asyncio.create_task(run_agents(base_url, stop))
    try:
        await load.run(seconds or None)
    finally:
        stop.set()
        await agents
        reporter.cancel()
