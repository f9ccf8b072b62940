"""The incident day end to end: the demo (provider, far region, load through the real SDKs,
exporter) plays its four incidents on a compressed schedule while a real Prometheus scrapes it
every second with the generated rules loaded (windows scaled 1/120: 1h -> 30 s). Then every
panel query and every rule is evaluated over the whole day and asserted sane, and each
incident must have moved the panels docs/runbooks.md lists for it, on its target only.

Schedule (seconds): calm 0-30, prefill surge 30-45, cold cache 45-60, noisy neighbour 60-75,
route change 75-90, calm 90-100. ~2 minutes in all, most of it the day itself.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from exporter._internal import config, names, runtime
from exporter._internal.demo.far_region import tls_available
from exporter._internal.demo.incidents import INCIDENTS, IncidentDay
from exporter._internal.demo.latency import LatencyModel
from exporter._internal.generate import ALERTING_FILE, RECORDING_FILE, generate
from exporter._internal.panels import TOP
from tests.support import skip_or_fail
from tests.support.demo_load import DemoLoad
from tests.support.prometheus import PrometheusServer, grafana_expr, require_prometheus
from tests.test_alerts import recorded_names

CALM, PHASE, AFTER = 30.0, 15.0, 10.0
SCALE = 1 / 120
CONFIG = {
    # The cold-cache incident shows on one tenant's cached share only with tenant on tokens.
    "labels": {"tenant_families": [names.INPUT_TOKENS.name, names.CACHED_INPUT_TOKENS.name]},
    "alerting": {"window_scale": SCALE,
                 "tenant_window_seconds": 1200,  # 10 s: enough calls per tenant at 10 calls/s
                 "tenant_baseline_offset_seconds": 3600,  # 30 s: the tenants' calm baseline
                 "regression_offset_seconds": 4800,  # 40 s: "last week" is the calm phase
                 "min_calls": 5},
}
SCRAPE = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: {job}
    static_configs:
      - targets: ["{target}"]
"""
RATE_INTERVAL = "5s"  # Grafana's $__rate_interval at a 1 s scrape, over the whole day
PHASE_WINDOW = "10s"  # an incident's panels are read over its last 10 s
STEP = 2.0


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Play the day once; every test of this module reads its Prometheus afterwards."""
    require_prometheus()
    if not tls_available():
        skip_or_fail("the route change needs cryptography or openssl for its far region")
    out = tmp_path_factory.mktemp("day")
    cfg = config.load(CONFIG)
    runtime.configure(cfg)
    generate(cfg, out)
    rules = [out / "alerts" / name for name in (RECORDING_FILE, ALERTING_FILE)]
    log: list[str] = []
    # Answers a third as long: the SDKs' per-chunk parsing is what costs CPU on a shared box.
    with DemoLoad(rate=10.0, far_region=True, model=LatencyModel.default().shorter(0.3)) as demo:
        scrape = SCRAPE.format(job=cfg.alerting.exporter_job, target=demo.target)
        with PrometheusServer(scrape, rule_files=rules) as prom:
            prom.wait_for(f'up{{job="{cfg.alerting.exporter_job}"}} == 1', timeout=30)
            schedule = IncidentDay(demo.knobs, CALM, PHASE, out=log.append)
            start = time.time()
            demo.play(schedule).result(timeout=schedule.seconds + 60)
            end = time.time()
            demo.stop_load()  # the day is over: the tests read what Prometheus recorded
            yield {"prom": prom, "cfg": cfg, "out": out, "start": start, "end": end,
                   "log": log, "schedule": schedule}
    runtime.configure(None)


def phase_end(d: dict[str, Any], name: str | None) -> float:
    """Unix time one second before the end of the named incident (None: the first calm)."""
    phase = next(p for p in d["schedule"].phases if p.incident == name)
    return d["start"] + phase.start + phase.seconds - 1.0


def panels(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((d["out"] / "dashboards").glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        out += [(path.stem, p) for p in board["panels"] if p["type"] != "row"]
    return out


def expr_of(target: dict[str, Any], d: dict[str, Any], window: str = RATE_INTERVAL) -> str:
    span = f"{int(d['end'] - d['start'])}s"
    return grafana_expr(target["expr"], rate_interval=window, time_range=span)


def values(prom: PrometheusServer, expr: str, at: float) -> dict[tuple, float]:
    """{labels as a sorted tuple: value} of an instant query at `at`."""
    return {tuple(sorted(r["metric"].items())): float(r["value"][1])
            for r in prom.query(expr, at=at)}


def panel(d: dict[str, Any], title: str, **variables: str) -> str:
    """The panel's query as Grafana runs it over an incident's last seconds, with template
    variables set as on-call would (the others: All)."""
    found = [p for _, p in panels(d) if p["title"] == title]
    assert len(found) == 1, title
    expr = found[0]["targets"][0]["expr"]
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    return expr_of({"expr": expr}, d, PHASE_WINDOW)


def value_of(series: dict[tuple, float], **labels: str) -> float:
    matches = [v for k, v in series.items() if all((n, x) in k for n, x in labels.items())]
    assert len(matches) == 1, (labels, series)
    return matches[0]


def test_the_day_played_every_incident_in_order(day: dict[str, Any]) -> None:
    assert day["schedule"].played == list(INCIDENTS)
    text = "\n".join(day["log"])
    assert text.count("incident: ") == 4 and text.count("recovered: ") == 4, text


def test_every_panel_query_is_sane_over_the_whole_day(day: dict[str, Any]) -> None:
    """No NaN, no value pinned at the top finite bucket, no negative budget, never more than
    ten series at once, and data (zeros included) in every panel that counts something."""
    prom, cfg = day["prom"], day["cfg"]
    cap = max(cfg.seconds_buckets())
    start, end = day["start"] + 10, day["end"]
    for uid, p in panels(day):
        title = f"{uid}: {p['title']}"
        per_step: dict[float, int] = {}
        seen = 0
        for target in p["targets"]:
            if target.get("instant"):
                points = [(end, v) for v in values(prom, expr_of(target, day), end).values()]
                per_step[end] = per_step.get(end, 0) + len(points)
            else:
                points = []
                for series in prom.query_range(expr_of(target, day), start, end, STEP):
                    for at, raw in series["values"]:
                        points.append((float(at), float(raw)))
                        per_step[float(at)] = per_step.get(float(at), 0) + 1
            seen += len(points)
            for at, v in points:
                assert not math.isnan(v), (title, target["expr"], at)
                assert v != cap, f"{title} pinned at the top bucket {cap}"
                if p.get("fieldConfig", {}).get("defaults", {}).get("unit") in \
                        ("s", "percentunit", "reqps") or "budget" in p["title"]:
                    assert v >= 0, (title, v)
        assert seen, f"{title}: no data over the whole day"
        if p["type"] != "heatmap":  # a heatmap's series are its buckets
            assert max(per_step.values()) <= TOP, (title, max(per_step.values()))


def test_every_variable_offers_values(day: dict[str, Any]) -> None:
    prom = day["prom"]
    for path in sorted((day["out"] / "dashboards").glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        for var in board["templating"]["list"][1:]:
            selector = var["definition"].removeprefix("label_values(").rsplit(",", 1)[0]
            assert prom.label_values(var["name"], grafana_expr(selector)), var["name"]


def test_every_rule_is_healthy_recorded_and_in_range(day: dict[str, Any]) -> None:
    prom, cfg, end = day["prom"], day["cfg"], day["end"]
    broken = [(r["name"], r.get("lastError")) for g in prom.rules()
              for r in g["rules"] if r["health"] != "ok"]
    assert not broken
    for record in sorted(recorded_names(cfg)):
        found = [(tuple(sorted(s["metric"].items())), float(v)) for s in
                 prom.query_range(record, day["start"], end, STEP) for _, v in s["values"]]
        assert found, record
        for labels, v in found:
            assert not math.isnan(v), (record, labels)
            if record.startswith("slo:sli_error:"):
                assert 0 <= v <= 1, (record, labels, v)
            elif "burn_rate" in record or record.endswith(":p99_rate5m"):
                assert v >= 0, (record, labels, v)
            elif record == "slo:period_error_budget_remaining:ratio":
                assert v <= 1, (record, labels, v)


def test_prefill_surge_moves_one_routes_prompts_and_prefill(day: dict[str, Any]) -> None:
    prom = day["prom"]
    calm, surge = phase_end(day, None), phase_end(day, "prefill_surge")
    tokens = panel(day, "Input tokens per call p99 by route (top 10)")
    before, during = values(prom, tokens, calm), values(prom, tokens, surge)
    grew = {route: value_of(during, route=route) / value_of(before, route=route)
            for route in ("search", "chat")}
    # 4× longer prompts on search; power-of-two token buckets make any p99 move in steps.
    assert grew["search"] > 1.8 and grew["search"] > 1.5 * grew["chat"], grew
    prefill = panel(day, "Prefill p99 by model and route (top 10)")
    assert value_of(values(prom, prefill, surge), model="gpt-4.1", route="search") > \
        1.5 * value_of(values(prom, prefill, calm), model="gpt-4.1", route="search")
    # Per 1k uncached tokens the prefill does not rise (the constant part of a prefill, one
    # decode step, weighs less on longer prompts): the prompts grew, not the provider's time.
    per_1k = panel(day, "Prefill per 1k uncached input tokens (top 10)")
    ratio = value_of(values(prom, per_1k, surge), model="gpt-4.1", route="search") / \
        value_of(values(prom, per_1k, calm), model="gpt-4.1", route="search")
    assert 0.2 < ratio < 1.5, ratio


def test_cold_cache_moves_one_tenants_cached_share(day: dict[str, Any]) -> None:
    prom = day["prom"]
    share = panel(day, "Cached share of input tokens by tenant (lowest 10)").replace(
        "bottomk(10, ", "(")  # every tenant, not only the lowest ten
    before, during = values(prom, share, phase_end(day, None)), \
        values(prom, share, phase_end(day, "cold_cache"))
    assert value_of(before, tenant="tenant-01") > 0.3
    assert value_of(during, tenant="tenant-01") < 0.1
    assert value_of(during, tenant="tenant-00") > 0.3  # the others stay warm


def test_noisy_neighbour_freezes_one_model_for_every_tenant(day: dict[str, Any]) -> None:
    prom = day["prom"]
    calm, noisy = phase_end(day, None), phase_end(day, "noisy_neighbour")
    stall = panel(day, "Stall p99 by model and route (top 10)")
    during = values(prom, stall, noisy)
    frozen = [v for k, v in during.items() if ("model", "llama-3-8b") in k]
    others = [v for k, v in during.items() if ("model", "llama-3-8b") not in k]
    # Freezes of several seconds on llama-3-8b; the other models keep their pace.
    assert frozen and max(frozen) > 3.0 and max(frozen) > 2 * max(others), during
    assert max(values(prom, stall, calm).values()) < 0.5 * max(frozen)
    slower = panel(day, "Share of tenants slower than before")
    assert value_of(values(prom, slower, noisy), model="llama-3-8b", route="chat") >= 0.5


def test_route_change_moves_the_connect_and_server_phases_of_one_model(
        day: dict[str, Any]) -> None:
    prom = day["prom"]
    calm, moved = phase_end(day, None), phase_end(day, "route_change")
    connect = panel(day, "Connect p99 by model and route (top 10)")
    during = values(prom, connect, moved)
    far = [v for k, v in during.items() if ("model", "deepseek-r1") in k]
    assert far and min(far) > 0.08, during  # every far call pays the TLS handshake's trip
    for near in ("gpt-4.1", "llama-3-8b"):  # mostly reused connections: the mean stays ~0
        phases = values(prom, panel(day, "Mean time per phase", model=near), moved)
        assert value_of(phases, phase="connect") < 0.05, (near, phases)
    server = panel(day, "Server p99 by model and route (top 10)")
    assert value_of(values(prom, server, moved), model="deepseek-r1", route="chat") > \
        value_of(values(prom, server, calm), model="deepseek-r1", route="chat") + 0.08
    # On-call selects the model: its mean phases moved by the round trips, its model time not.
    mean = panel(day, "Mean time per phase", model="deepseek-r1")
    before, during = values(prom, mean, calm), values(prom, mean, moved)
    moved_by = {phase: value_of(during, phase=phase) - value_of(before, phase=phase)
                for phase in ("connect", "server", "prefill")}
    assert moved_by["connect"] > 0.08 and moved_by["server"] > 0.08, moved_by
    assert abs(moved_by["prefill"]) < 0.05, moved_by


def test_the_page_and_the_connect_alert_fired(day: dict[str, Any]) -> None:
    """Alerts the day must have raised, read from Prometheus' own ALERTS series."""
    prom, start, end = day["prom"], day["start"], day["end"]
    # From 10 s in: TTFTExporterAbsent fires before Prometheus' first scrape of the exporter,
    # and resolves at the first rule evaluation after it.
    fired = {(s["metric"]["alertname"], s["metric"].get("model"))
             for s in prom.query_range("ALERTS", start + 10, end, STEP)}
    assert ("LLMTTFTBudgetBurnFast", "llama-3-8b") in fired, fired
    assert ("LLMConnectPhaseRegression", "deepseek-r1") in fired, fired
    # The exporter dropped nothing and was always scraped (TTFTExporterDown may fire on a
    # starved machine, where a 1 s scrape times out: it says the truth about the target).
    assert not [n for n, _ in fired if n in ("TTFTExporterAbsent",
                                              "TTFTExporterDroppingSamples")], fired


def test_runbooks_list_the_panels_each_incident_moves() -> None:
    runbooks = (Path(__file__).parent.parent / "docs" / "runbooks.md").read_text()
    for incident in INCIDENTS.values():
        section = runbooks.split(f"## Incident: {incident.title}", 1)[1].split("\n## ", 1)[0]
        for title in MOVES[incident.name]:
            assert title in section, (incident.name, title)


#: The panels each incident's test above asserts it moves (docs/runbooks.md names them).
MOVES = {
    "prefill_surge": ("Input tokens per call p99 by route", "Prefill p99 by model and route",
                      "Prefill per 1k uncached input tokens"),
    "cold_cache": ("Cached share of input tokens by tenant",),
    "noisy_neighbour": ("Stall p99 by model and route", "Share of tenants slower than before"),
    "route_change": ("Connect p99 by model and route", "Server p99 by model and route"),
}
