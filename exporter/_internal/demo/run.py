"""`ttft-exporter demo`: provider, load and exporter in one process, Debian's Prometheus with
the generated rules and the page of the generated dashboards (page.py), a live table, and the
incident day (incidents.py) unless asked not to; a summary of the whole run at exit."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

from .. import names, runtime
from ..view.backend import Findings
from .agents import run_agents
from .far_region import tls_available
from .incidents import IncidentDay, Knobs
from .loadgen import LoadGenerator, LoadShape
from .page import dashboards_page
from .provider import ProviderServer
from .table import TerminalTable

PRINT_EVERY = 5.0
#: The demo's config when none is given: the defaults, plus `tenant` on the input and cached
#: token families, so the cold-cache incident shows on the one tenant it hits, and objectives
#: its own fleet meets when calm (latency.py, loadgen.py). A cold prompt is prefilled whole:
#: the summaries' 12k tokens (lognormal, its slowest 0.1 % at 4.7×) take up to 1.1 s on
#: llama-3-8b (50k tokens/s), 2.8 s on gpt-4.1 (20k) and 5.6 s on deepseek-r1 (10k), so
#: summaries are held to 4 s to the first token, deepseek-r1's to 7.5 s. The reasoning model
#: thinks for 100-400 tokens at 45 tokens/s before it answers (up to 9 s after its first
#: token): 20 s to its first answer token. Every other objective is the default.
DEMO_CONFIG: dict[str, Any] = {
    "labels": {"tenant_families": [names.INPUT_TOKENS.name, names.CACHED_INPUT_TOKENS.name]},
    "slos": [
        {},  # the defaults: TTFT 2 s, first answer token 10 s, stall 5 s, 99 % each
        {"route": "summarize", "ttft": {"threshold_seconds": 4.0}},
        {"model": "deepseek-r1", "first_answer_token": {"threshold_seconds": 20.0}},
        {"model": "deepseek-r1", "route": "summarize", "ttft": {"threshold_seconds": 7.5},
         "first_answer_token": {"threshold_seconds": 20.0}},
    ],
}


#: The page's diagnose: the last minute against the calm before the first incident (its first
#: 30 s left out: every tenant's first calls find a cold cache).
FINDINGS_SINCE, WARM_UP = 60.0, 30.0


def run_demo(port: int = 9469, seconds: float = 0.0, config: str | None = None,
             shape: LoadShape = LoadShape(), incidents: bool = True,
             calm_seconds: float = 120.0, phase_seconds: float = 180.0,
             page_port: int | None = None, page: bool = True) -> int:
    """Run until Ctrl-C/SIGTERM (or `seconds`), printing the table every few seconds; the
    page's URL is the first line printed (`page_port` None: the exporter's port + 1, or any
    free port when that is 0)."""
    runtime.configure(config if config is not None else DEMO_CONFIG)
    knobs = Knobs()
    with contextlib.ExitStack() as stack:
        provider = stack.enter_context(ProviderServer(knobs=knobs, far_region=tls_available()))
        server = runtime.start_http_server(port=port)
        stack.callback(server.stop)
        if page:
            findings = Findings("", since=FINDINGS_SINCE,
                                baseline=max(calm_seconds - WARM_UP, FINDINGS_SINCE),
                                baseline_at=time.time() + calm_seconds if incidents else None)
            target = server.base_url.split("//", 1)[1]
            url = stack.enter_context(dashboards_page(
                runtime.state().config, target,
                page_port if page_port is not None else (port + 1 if port else 0), findings))
            if url is not None:
                print(f"dashboards: {url}", flush=True)
        print(f"demo provider: {provider.base_url}/v1 (OpenAI and Anthropic wire formats)")
        if provider.far is not None:
            print(f"far region:    {provider.far.base_url}/v1 (TLS, used by the route change)")
        print(f"metrics:       {server.url}", flush=True)
        day = IncidentDay(knobs, calm_seconds, phase_seconds,
                          out=lambda line: print(line, flush=True)) if incidents else None
        asyncio.run(_drive(provider, seconds, shape, day))
    return 0


async def _drive(provider: ProviderServer, seconds: float, shape: LoadShape,
                 day: IncidentDay | None) -> None:
    load = LoadGenerator(provider.base_url, shape, provider.knobs, provider.far)
    stop = asyncio.Event()  # the agent workload's (agents.py), set with the load's
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (load.stop(), stop.set()))
    state = runtime.state()
    table = TerminalTable(state.recorder, state.config.window.seconds)

    async def report() -> None:
        while True:
            await asyncio.sleep(PRINT_EVERY)  # paces the printout; nothing waits on it
            print(f"\n{load.calls} calls, {load.errors} errors\n{table.render()}", flush=True)

    tasks = [asyncio.create_task(report())]
    if day is not None:
        tasks.append(asyncio.create_task(day.run()))
    agents = asyncio.create_task(run_agents(provider.base_url, stop))
    try:
        await load.run(seconds or None)
    finally:
        stop.set()
        await agents
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        print("\n" + table.summary(day.played if day is not None else ()), flush=True)
