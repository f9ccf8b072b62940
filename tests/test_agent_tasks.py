"""Agent tasks through the real SDKs against the demo provider: max_tokens and finish reasons,
the network round trip, deadlines as timeouts and across services; and end to end, the demo's
12-step research report on /metrics and on a real Prometheus running the "agent tasks"
dashboard's queries and the generated rules.

Timings are scripted (`x-demo-script`, the relay's distance, tool sleeps) and checked to ±10 ms
or ±5 % against what the test scripted and observed (tests/test_shim_support.py); a task's
total of 12 scripted steps to ±10 ms a step."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import re
import statistics
import urllib.request
from dataclasses import replace
from pathlib import Path

import anthropic
import openai
import pytest
from aiohttp import web

import exporter
import exporter.integrations
from exporter._internal import names, runtime
from exporter._internal.config import loader as config_loader
from exporter._internal.config.settings import DashboardsConfig
from exporter._internal.demo.agents import EXTRACT_MAX_TOKENS, ROUTE, Agents, Timing
from exporter._internal.demo.provider import create_app
from exporter._internal.demo.relay import UP, Relay, RelayThread
from exporter._internal.expose.http_thread import HttpThread
from exporter._internal.generate.files import ALERTING_FILE, RECORDING_FILE, generate
from exporter._internal.generate.panels import TOP
from exporter._internal.record.tasks import step_of
from exporter._internal.record.timeline import derive
from exporter._internal.shim.task import Task
from tests import test_shim_support as support
from tests.support.prometheus import (PrometheusServer, grafana_expr, require_prometheus,
                                      scrape_config)
from tests.support.timing import timing
from tests.test_dashboards import AGENTS_UID, panels
from tests.test_shim_support import Recorded, assert_near, script

# The demo provider, and the SDKs instrumented against a fresh recorder (shared fixtures).
server, recorded, instrumented = support.server, support.recorded, support.instrumented

MESSAGES = [{"role": "user", "content": "next step"}]


def port_of(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


# --- max_tokens and finish reasons, every API -------------------------------------------------


def test_max_tokens_headroom_and_truncation_in_every_api(server, recorded) -> None:
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="t", max_retries=0)
    a = anthropic.Anthropic(base_url=server.base_url, api_key="t", max_retries=0)
    for _ in c.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=5,
                                       stream_options={"include_usage": True},
                                       extra_headers=script(tokens=8)):
        pass
    c.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=20,
                              extra_headers=script(tokens=8))
    for _ in c.responses.create(model="m", input="hi", stream=True, max_output_tokens=4,
                                extra_headers=script(tokens=8)):
        pass
    with a.messages.stream(model="m", max_tokens=3, messages=MESSAGES,
                           extra_headers=script(tokens=8)) as stream:
        for _ in stream:
            pass
    a.messages.create(model="m", max_tokens=100, messages=MESSAGES,
                      extra_headers=script(tokens=8))
    got = [(t.max_tokens, t.output_tokens, t.finish_reason) for t in recorded.all()]
    assert got == [(5, 5, "length"), (20, 8, "stop"), (4, 4, "max_output_tokens"),
                   (3, 3, "max_tokens"), (100, 8, "end_turn")]
    counts = runtime.state().recorder.rows[names.FINISH_REASONS_TOTAL.name]
    assert sum(n for key, n in counts.items() if key[0] == names.FINISH_LENGTH) == 3
    text = runtime.state().renderer.render().decode()
    # headroom: 0 + 12 + 0 + 0 + 92
    assert re.search(r'llm_client_max_tokens_headroom_sum\{model="m",provider="local",'
                     r'route="unknown"\} 104.0', text)


# --- the network round trip -------------------------------------------------------------------


@timing
def test_the_round_trip_to_a_far_provider_is_network_not_provider(server, recorded) -> None:
    one_way = 0.05
    with RelayThread(port_of(server), one_way, log=True) as relay:
        c = openai.OpenAI(base_url=relay.base_url + "/v1", api_key="t", max_retries=0)
        for _ in range(2):  # the second: after the SDK's first-use costs
            for _ in c.chat.completions.create(
                    model="m", messages=MESSAGES, stream=True,
                    extra_headers=script(server_wait=0.1, prefill=0.05, tokens=5, gap=0.01)):
                pass
    t = recorded.all()[-1]
    d = derive(t)
    s = step_of(t, d)
    # The relay holds each way at least `one_way` (later when the machine is busy: its log
    # says how long it really held this exchange); what it adds beyond is transport too.
    held = held_per_exchange(relay.relay)[-1]
    assert 2 * one_way <= held and held * 1e9 <= t.round_trip <= (held + 0.03) * 1e9
    assert_near(d.phases["server"] - t.round_trip // 1000, 0.1, "provider's part of server")
    assert s.network == d.phases["connect"] + d.phases["send"] + t.round_trip // 1000
    assert s.queue + s.network + s.provider == d.duration
    # Provider time: its part of the server phase, then the stream (the relay's jitter on the
    # tokens is the stream's own; tests/test_shim_openai.py checks prefill and decode).
    stream = (t.end - t.headers) // 1000
    assert_near(s.provider - stream, 0.1, "provider time before the headers")


# --- deadlines: as the SDK's timeout, and downstream --------------------------------------------


@timing
def test_sdk_timeout_passes_the_time_left_to_the_sdk(server, recorded) -> None:
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="t", max_retries=0)
    c.chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(tokens=1))
    with exporter.task("bounded", deadline=0.2, sdk_timeout=True):
        with pytest.raises(openai.APITimeoutError):
            c.chat.completions.create(model="m", messages=MESSAGES,
                                      extra_headers=script(server_wait=2.0))
    t = recorded.all()[-1]
    assert t.outcome == names.TIMEOUT
    assert 0.15 <= (t.end - t.start) / 1e9 < 1.0  # cut near the deadline, not at 2 s
    with exporter.task("unbounded", deadline=0.05):  # without sdk_timeout: no cut
        c.chat.completions.create(model="m", messages=MESSAGES,
                                  extra_headers=script(server_wait=0.2))
    assert recorded.all()[-1].outcome == names.OK


def test_a_downstream_service_inherits_the_deadline(recorded) -> None:
    """An SDK call made inside a task sends `ttft-deadline-ms`; a service using this library's
    middleware (here the demo provider itself) has that deadline in force."""
    inbound: list[float | None] = []

    @web.middleware
    async def note(request: web.Request, handler):  # runs inside exporter's middleware
        inbound.append(exporter.remaining())
        return await handler(request)

    app = create_app()
    app.middlewares.extend([exporter.integrations.aiohttp_middleware(), note])
    service = HttpThread(app, "127.0.0.1", 0, name="downstream", shutdown_timeout=1).start()
    try:
        c = openai.OpenAI(base_url=service.base_url + "/v1", api_key="t", max_retries=0)
        c.chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(tokens=1))
        with exporter.task("upstream", deadline=3.0):
            c.chat.completions.create(model="m", messages=MESSAGES,
                                      extra_headers=script(tokens=1))
    finally:
        service.stop()
    assert inbound[0] is None and 2.5 < inbound[1] <= 3.0


# --- end to end: the demo's 12-step research report, /metrics and Prometheus -------------------

TIMING = Timing(server_wait=0.02, prefill=0.02, tokens=12, gap=0.01, tool=0.05, guardrail=0.02)
ONE_WAY = 0.05
DEADLINE = 1.5  # both runs end past it; the measured one's last steps start past it
MAX_TOKENS = [1024] + [256, EXTRACT_MAX_TOKENS] * 5 + [1024]
TASK = "research-report"
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


def samples(url: str) -> dict[tuple[str, frozenset], float]:
    """/metrics as {(name, labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels or ""))
            out[(name, pairs)] = float(value)
    return out


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def within(actual: float, expected: float, parts: int = 1) -> bool:
    """A sum of `parts` scripted values is within ±10 ms a part, or ±5 % of the whole."""
    return abs(actual - expected) <= max(0.010 * parts, 0.05 * expected)


def run_report(base_url: str) -> Task:
    """The demo's research report, its garbage collected before and not during: a collector
    pass over two SDKs' objects (100+ ms on a loaded machine) would land in a step or a tool
    and make it longer than the script says."""
    async def main():
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="t", max_retries=0)
        try:
            with exporter.labels(route=ROUTE):
                return await Agents(client, TIMING).research_report(deadline=DEADLINE)
        finally:
            await client.close()

    gc.collect()
    gc.disable()
    try:
        return asyncio.run(main())
    finally:
        gc.enable()


#: Both histogram modes (dashboards.histograms): Prometheus flags, and where their files go.
MODES = {"classic": [], "native": ["--enable-feature=native-histograms"]}


@timing
def test_a_12_step_task_on_metrics_and_on_the_agent_dashboard(server, instrumented,
                                                              tmp_path: Path) -> None:
    """One exporter, scraped by two real Prometheus servers side by side: one storing classic
    histograms and running the classic rules and dashboard, one storing native histograms
    (protobuf) and running the native ones."""
    require_prometheus()
    source = {"alerting": {"window_scale": 1 / 60}}
    cfg = config_loader.load(source)
    runtime.configure(cfg)
    recorded = Recorded()  # this config's recorder
    for mode in MODES:
        generate(replace(cfg, dashboards=DashboardsConfig(histograms=mode)), tmp_path / mode)
    exporter_server = exporter.start_http_server(port=0)
    near_relay = RelayThread(port_of(server), 0.0, log=True)
    far_relay = RelayThread(port_of(server), ONE_WAY, log=True)
    try:
        target = exporter_server.url.split("//", 1)[1].split("/", 1)[0]
        with contextlib.ExitStack() as stack:
            stack.enter_context(near_relay)
            stack.enter_context(far_relay)
            # both scrape from 127.0.0.1: each names itself, so each sees every new series at
            # zero first (the first run's end is an increase on both)
            proms = {mode: stack.enter_context(PrometheusServer(
                scrape_config(target, job=cfg.alerting.exporter_job, scraper=mode),
                extra_flags=flags, rule_files=[tmp_path / mode / "alerts" / name for
                                                       name in (RECORDING_FILE, ALERTING_FILE)]))
                for mode, flags in MODES.items()}
            # each has scraped once before the first run (Prometheus's first scrape can come
            # seconds after its start): the first run's end is an increase on both
            for prom in proms.values():
                prom.wait_for(f'up{{job="{cfg.alerting.exporter_job}"}} == 1', timeout=30)
            transport = relay_transport(near_relay, recorded)
            # A first run: the series exist before the measured one (a rate needs two samples)
            # with values like its own, so Prometheus extrapolates every series alike and a
            # panel's ratios of rates are exact.
            run_report(far_relay.base_url)
            recorded.all()
            first = {mode: scraped_with(prom, 1) for mode, prom in proms.items()}
            before = samples(exporter_server.url)
            task = run_report(far_relay.base_url)  # one region away
            after = samples(exporter_server.url)
            steps = recorded.all()
            held = sum(held_per_exchange(far_relay.relay)[-12:])  # the measured run's calls
            check_metrics(before, after, steps, task, held + 12 * transport)
            for mode, prom in proms.items():
                check_dashboard(prom, tmp_path / mode, before, after, first[mode],
                                scraped_with(prom, 2), mode)
                broken = [(r["name"], r.get("lastError")) for g in prom.rules()
                          for r in g["rules"] if r["health"] == "err"]
                assert not broken, mode
    finally:
        exporter_server.stop()


def held_per_exchange(relay: Relay) -> list[float]:
    """Seconds the relay really held each request and its response's head (its log: a busy
    machine wakes it late), per HTTP exchange, in order."""
    out = []
    for log in relay.log or ():
        request = None
        for direction, read, written in log:
            if direction == UP:
                request = written - read  # the last chunk of the request counts
            elif request is not None:  # the first chunk back: the headers
                out.append((read, request + written - read))
                request = None
    return [held for _, held in sorted(out)]


def relay_transport(relay: RelayThread, recorded: Recorded) -> float:
    """A round trip's time outside what the relay holds (the kernel, waking the relay): the
    median over a few calls through a relay that holds nothing (seconds)."""
    c = openai.OpenAI(base_url=relay.base_url + "/v1", api_key="t", max_retries=0)
    for _ in range(5):
        c.chat.completions.create(model="m", messages=MESSAGES, extra_headers=script(tokens=1))
    trips = [t.round_trip / 1e9 for t in recorded.all()]
    return statistics.median(trip - held for trip, held in
                             zip(trips[1:], held_per_exchange(relay.relay)[1:]))


def check_metrics(before: dict, after: dict, steps: list, task, distance: float) -> None:
    """The measured run on /metrics: every kind against what the test scripted or saw."""
    def kind(k: str) -> float:
        return delta(before, after, names.TASK_TIME.name + "_sum", kind=k, task=TASK)

    assert len(steps) == 12
    assert delta(before, after, names.TASK_STEPS.name + "_sum", task=TASK) == 12
    scripted = sum(TIMING.server_wait + TIMING.prefill + (min(TIMING.tokens, m) - 1) * TIMING.gap
                   for m in MAX_TOKENS)
    assert within(kind(names.KIND_PROVIDER), scripted, 12), (kind(names.KIND_PROVIDER), scripted)
    phases = [derive(t).phases for t in steps]
    client_side = sum(p.get("connect", 0) + p.get("send", 0) for p in phases) / 1e6
    assert distance >= 12 * 2 * ONE_WAY
    injected = distance + client_side  # what the relay held, its transport, connect and send
    assert within(kind(names.KIND_NETWORK), injected, 12), (kind(names.KIND_NETWORK), injected)
    assert kind(names.KIND_QUEUE) == pytest.approx(sum(p["queue"] for p in phases) / 1e6,
                                                   abs=1e-4)
    assert within(kind(names.KIND_TOOL), 10 * TIMING.tool, 10)
    assert within(kind(names.KIND_GUARDRAIL), 2 * TIMING.guardrail, 2)
    duration = delta(before, after, names.TASK_DURATION.name + "_sum", task=TASK)
    app = kind(names.KIND_APP)
    assert 0 <= app < 0.1 * duration
    # Each round fetched pricing and then reviews: five waterfalls, each costing one fetch.
    assert delta(before, after, names.TASK_WATERFALL_CALLS.name, task=TASK) == 5
    critical = delta(before, after, names.TASK_CRITICAL_PATH.name + "_sum", task=TASK)
    assert within(duration - app - critical, 5 * TIMING.tool, 5)
    # The deadline: late calls and the tokens generated after it, from the calls' own stamps.
    late = sum(1 for t in steps if t.start > task.deadline)
    orphans = sum(1 for t in steps for stamp in t.token_times if stamp > task.deadline)
    assert late >= 3
    assert delta(before, after, names.TASK_LATE_CALLS.name, task=TASK) == late
    assert delta(before, after, names.TASK_ORPHAN_TOKENS.name, task=TASK) == orphans
    assert delta(before, after, names.TASKS_TOTAL.name, deadline=names.DEADLINE_EXCEEDED,
                 outcome=names.OK, task=TASK) == 1
    where = {"model": "gpt-4.1", "provider": "local", "route": ROUTE}
    assert delta(before, after, names.FINISH_REASONS_TOTAL.name, finish_reason="length",
                 **where) == 5
    assert delta(before, after, names.FINISH_REASONS_TOTAL.name, finish_reason="stop",
                 **where) == 7


def scraped_with(prom: PrometheusServer, runs: int) -> float:
    """Unix time of the first scrape that saw `runs` research reports ended."""
    expr = f'timestamp(sum({names.TASKS_TOTAL.name}{{task="{TASK}"}}) == {runs})'
    return float(prom.wait_for(expr, timeout=30)[0]["value"][1])


def check_dashboard(prom: PrometheusServer, out: Path, before: dict, after: dict,
                    first: float, second: float, mode: str) -> None:
    """Every panel of the agent dashboard, on Prometheus, shows the measured run's figures.

    Evaluated at the scrape that saw it end, over a window reaching back to the scrape that saw
    the first run end and no further: the rates are the measured run's alone, and per-task
    means and shares, ratios of rates, are exact (every series is extrapolated alike). Over
    the whole test, as the incident day checks the other dashboards: no NaN, no negative
    time or share, never more than ten series at once."""
    window = f"{round((second - first) * 1000) + 500}ms"

    def measured(name: str, **labels: str) -> float:
        return delta(before, after, name, **labels)

    duration = measured(names.TASK_DURATION.name + "_sum", task=TASK)
    kinds = {k: measured(names.TASK_TIME.name + "_sum", kind=k, task=TASK)
             for k in names.TASK_KINDS}
    max_tokens = sum(MAX_TOKENS) / 12
    output = sum(min(TIMING.tokens, m) for m in MAX_TOKENS) / 12
    expected = {
        "Steps per task": None,
        "Time per task by kind": {k: v for k, v in kinds.items()},
        "Critical path vs summed time": [sum(kinds.values()) - kinds[names.KIND_APP],
                                         measured(names.TASK_CRITICAL_PATH.name + "_sum",
                                                  task=TASK), duration],
        "Waterfall candidates per task (top 10)": [5],
        "Orphan tokens and late calls per task": [
            measured(names.TASK_ORPHAN_TOKENS.name, task=TASK),
            measured(names.TASK_LATE_CALLS.name, task=TASK)],
        "Tasks over their deadline (top 10)": [1.0],
        "max_tokens requested vs output tokens (top 5)": [max_tokens, output],
        "Truncation rate (top 10)": [5 / 12],
    }
    board = json.loads((out / "dashboards" / f"{AGENTS_UID}.json").read_text(encoding="utf-8"))
    for var in board["templating"]["list"][1:]:
        selector = var["definition"].removeprefix("label_values(").rsplit(",", 1)[0]
        assert prom.label_values(var["name"], grafana_expr(selector)), (mode, var["name"])
    for panel in panels(board):
        title = panel["title"]
        values = []
        for target in panel["targets"]:
            # $__interval at the scrape interval (Grafana's floor for a short range): a top-N
            # panel ranks its series at multiples of it, and at 5 s the last multiple before
            # `second` could precede both runs' ends on a fast machine (nothing ranked)
            result = prom.query(grafana_expr(target["expr"], rate_interval=window,
                                             interval="1s"), at=second)
            mine = [r for r in result if r["metric"].get("task", TASK) == TASK
                    and r["metric"].get("route", ROUTE) == ROUTE]
            assert mine, (mode, title, target["expr"])
            if title == "Time per task by kind":
                values.append({r["metric"]["kind"]: float(r["value"][1]) for r in mine})
            else:
                values.append(float(mine[0]["value"][1]))
        sane(prom, panel, window, second - 3, second, mode)  # ends at `second`
        if title.startswith("Task duration p"):  # bucket interpolation: within the bucket
            assert all(0.5 * duration <= v <= 1.5 * duration for v in values), (mode, values)
            continue
        want = expected.pop(title)
        if title == "Steps per task":
            # the p99 interpolates in a bucket: classic `le` 12, or a native one 2.2 % wide
            top = 12 * (1.03 if mode == "native" else 1)
            assert values[0] == pytest.approx(12) and 10 <= values[1] <= top, (mode, values)
        elif title == "Time per task by kind":
            assert values[0] == pytest.approx(want, rel=1e-6), mode
        else:
            assert values == pytest.approx(want, rel=1e-6), (mode, title)
    assert not expected, f"{mode}: panels not found: {sorted(expected)}"


def sane(prom: PrometheusServer, panel: dict, window: str, start: float, end: float,
         mode: str) -> None:
    """A panel's queries over a time range, every second: no NaN, at most TOP series at any
    step, and no negative value where the unit is a time or a share."""
    per_step: dict[float, int] = {}
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    for target in panel["targets"]:
        for series in prom.query_range(grafana_expr(target["expr"], rate_interval=window,
                                                    interval="1s"), start, end, 1.0):
            for at, raw in series["values"]:
                v = float(raw)
                assert not math.isnan(v), (mode, panel["title"], at)
                if unit in ("s", "percentunit"):
                    assert v >= 0, (mode, panel["title"], v)
                per_step[float(at)] = per_step.get(float(at), 0) + 1
    assert per_step and max(per_step.values()) <= TOP, (mode, panel["title"])
