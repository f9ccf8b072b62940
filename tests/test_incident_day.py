"""The incident day end to end: the demo (provider, far region, load through the real SDKs,
exporter) plays its four incidents on a compressed schedule while a real Prometheus scrapes it
every second with the generated rules loaded (windows scaled 1/120: 1h -> 30 s). Then every
panel query and every rule is evaluated over the whole day and asserted sane, each incident
must have moved the panels docs/runbooks.md lists for it, on its target only, and both
`ttft-exporter diagnose` and LLMTTFTLikelyCause must name each incident's cause on its target,
and nothing on the calm or off target.

Schedule (seconds): calm 0-40, prefill surge 40-60, cold cache 60-80, noisy neighbour 80-100,
route change 100-120, calm 120-125. ~2.5 minutes in all, most of it the day itself. Thresholds
are far from the effects (an 8x surge, 100 ms round trips, seconds-long freezes): a shared,
loaded machine adds event-loop lag to every phase the SDKs measure.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from exporter._internal import runtime
from exporter._internal.config import loader as config_loader
from exporter._internal.demo.far_region import tls_available
from exporter._internal.demo.incidents import INCIDENTS
from exporter._internal.evidence.thresholds import DEFAULT, NOISY_NEIGHBOUR, ROUTE_CHANGE
from exporter._internal.evidence.signals import SIGNALS_BY_KEY
from exporter._internal.diagnose.run import Prometheus, Request, diagnose
from exporter._internal.generate.files import RULE_FILES, generate
from exporter._internal.generate.panels import TOP
from exporter._internal.promql import CLASSIC
from tests.support import skip_or_fail
from tests.support.incident_day import (CALM, CONFIG, MIN_CALLS, PHASE, SKIP, TARGETS,
                                        WINDOW, acceptable, alert_findings, live,
                                        played_day)
from tests.support.prometheus import PrometheusServer, grafana_expr, require_prometheus
from tests.test_alerts import recorded_names
from tests.test_dashboards import CALL_UIDS

RATE_INTERVAL = "5s"  # Grafana's $__rate_interval at a 1 s scrape, over the whole day
STEP = 2.0


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Play the day once; every test of this module reads its Prometheus afterwards."""
    require_prometheus()
    if not tls_available():
        skip_or_fail("the route change needs cryptography or openssl for its far region")
    out = tmp_path_factory.mktemp("day")
    cfg = config_loader.load(CONFIG)
    runtime.configure(cfg)
    generate(cfg, out)
    rules = [out / "alerts" / name for name in RULE_FILES]
    with played_day(cfg, rules) as played:
        yield {"prom": played.prom, "cfg": cfg, "out": out, "start": played.start,
               "end": played.end, "log": played.log, "schedule": played.schedule}
    runtime.configure(None)


def boards(d: dict[str, Any]) -> list[Path]:
    """The dashboards of LLM calls: the day plays no agent tasks (tests/test_agent_tasks.py
    checks the agent tasks dashboard, in both modes, on the demo's research report)."""
    return [d["out"] / "dashboards" / f"{uid}.json" for uid in CALL_UIDS]


def panels(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in boards(d):
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
    for path in boards(day):
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
                assert 0 <= v <= 1, (record, labels, v, below_zero(day, dict(labels)))
            elif "burn_rate" in record or record.endswith(":p99_rate5m"):
                assert v >= 0, (record, labels, v, below_zero(day, dict(labels)))
            elif record == "slo:period_error_budget_remaining:ratio":
                assert v <= 1, (record, labels, v, below_zero(day, dict(labels)))


def below_zero(d: dict[str, Any], labels: dict[str, str]) -> list[Any]:
    """Where an SLI's error ratio read below zero (more good calls than calls): each such 5m
    ratio, and the raw samples of its good bucket and count around it, so a failure says
    which scrape did it."""
    prom, start, end = d["prom"], d["start"], d["end"]
    scope = ",".join(f'{k}="{labels[k]}"' for k in ("sli", "model", "route") if k in labels)
    out: list[Any] = []
    for series in prom.query_range(f"slo:sli_error:ratio_rate5m{{{scope}}} < 0", start, end,
                                   1.0)[:3]:
        m = series["metric"]
        at = float(series["values"][0][0])
        out.append({"ratio": m, "values": series["values"][:3]})
        rule = next((r for g in prom.rules() for r in g["rules"]
                     if r["name"] == "slo:sli_error:ratio_rate5m"
                     and r.get("labels", {}).get("sli") == m.get("sli")), None)
        if rule is None:
            continue
        for selector in {f"{name}{{model=\"{m['model']}\",route=\"{m['route']}\"{extra}}}"
                         for name, extra in re.findall(r"(llm_\w+)\{([^}]*)\}", rule["query"])
                         for extra in [("," + extra) if "le=" in extra else ""]}:
            for raw in prom.query(f"{selector}[6s]", at=at + 1):
                out.append({"series": raw["metric"], "samples": raw["values"]})
    return out


def over(d: dict[str, Any], incident: str | None, title: str, since: float = 4.0,
         window: str = RATE_INTERVAL, **variables: str) -> dict[tuple, list[float]]:
    """A panel's (first query's) time series over an incident (None: the first calm), read as
    on-call reads the panel: every second from `since` seconds in (its `window` then lies
    mostly inside the phase) to its end. {labels: values}; a series is absent at a step
    without calls. Calls are recorded when they end: a long call started before the phase
    shows in its first seconds (`since` skips them)."""
    phase = next(p for p in d["schedule"].phases if p.incident == incident)
    found = [p for _, p in panels(d) if p["title"] == title]
    assert len(found) == 1, title
    expr = found[0]["targets"][0]["expr"]
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    begin = d["start"] + phase.start
    out: dict[tuple, list[float]] = {}
    for series in d["prom"].query_range(expr_of({"expr": expr}, d, window), begin + since,
                                        begin + phase.seconds, 1.0):
        out[tuple(sorted(series["metric"].items()))] = [float(v) for _, v in series["values"]]
    return out


def of(series: dict[tuple, list[float]], **labels: str) -> list[float]:
    """The values of the series with these labels (all of them merged when several match)."""
    found = [v for k, vs in series.items() for v in vs
             if all((n, x) in k for n, x in labels.items())]
    assert found, (labels, series)
    return found


def test_prefill_surge_moves_one_routes_prompts_and_prefill(day: dict[str, Any]) -> None:
    def tokens(incident: str | None, route: str) -> list[float]:
        return of(over(day, incident, "Input tokens per call p99 by route (top 10)"),
                  route=route)

    # 4× longer prompts on search (power-of-two token buckets move a p99 in steps); chat not.
    assert max(tokens("prefill_surge", "search")) > 2 * median(tokens(None, "search"))
    assert median(tokens("prefill_surge", "chat")) < 2 * median(tokens(None, "chat"))
    p99 = "Prefill p99 by model and route (top 10)"
    assert max(of(over(day, "prefill_surge", p99), model="gpt-4.1", route="search")) > \
        1.5 * median(of(over(day, None, p99), model="gpt-4.1", route="search"))
    mean = "Mean time per phase"
    grew = median(of(over(day, "prefill_surge", mean, model="gpt-4.1", route="search"),
                     phase="prefill")) / median(of(over(day, None, mean, model="gpt-4.1",
                                                        route="search"), phase="prefill"))
    assert grew > 1.5, grew
    # Per 1k uncached tokens the prefill does not rise (its constant part, one decode step,
    # weighs less on longer prompts): the prompts grew, not the provider's time per token.
    per_1k = "Prefill per 1k uncached input tokens (top 10)"  # over 10 s: few calls cached
    ratio = median(of(over(day, "prefill_surge", per_1k, window="10s"), model="gpt-4.1",
                      route="search")) / \
        median(of(over(day, None, per_1k, window="10s"), model="gpt-4.1", route="search"))
    assert 0.2 < ratio < 2.0, ratio  # it would be 4× had the provider slowed down


def test_cold_cache_moves_one_tenants_cached_share(day: dict[str, Any]) -> None:
    """The cold tenant is among the lowest 10 while its cache is cold; its calm share and a
    warm tenant's are read as on-call reads one tenant, with $tenant set (a tenant whose share
    is high is not among the lowest 10)."""
    title = "Cached share of input tokens by tenant (lowest 10)"
    calm = over(day, None, title, tenant="tenant-01")
    cold = over(day, "cold_cache", title)
    warm = over(day, "cold_cache", title, tenant="tenant-00")
    assert median(of(calm, tenant="tenant-01")) > 0.3
    assert min(of(cold, tenant="tenant-01")) < 0.1  # back from idle: nothing cached
    assert median(of(warm, tenant="tenant-00")) > 0.3  # the others stay warm


def test_noisy_neighbour_freezes_one_model_for_every_tenant(day: dict[str, Any]) -> None:
    title = "Stall p99 by model and route (top 10)"
    noisy, calm = over(day, "noisy_neighbour", title), over(day, None, title)
    frozen = max(of(noisy, model="llama-3-8b"))
    others = [median(vs) for k, vs in noisy.items() if ("model", "llama-3-8b") not in k]
    # Freezes of seconds on llama-3-8b; the other models keep their pace.
    assert frozen > 2.0 and frozen > 2 * max(others), (frozen, others)
    assert median(of(calm, model="llama-3-8b")) < 0.5 * frozen
    slower = over(day, "noisy_neighbour", "Share of tenants slower than before")
    assert max(of(slower, model="llama-3-8b", route="chat")) >= 0.5


def test_route_change_moves_the_connect_and_server_phases_of_one_model(
        day: dict[str, Any]) -> None:
    # From 8 s in: deepseek-r1's calls started near, before the change, have ended by then.
    connect = over(day, "route_change", "Connect p99 by model and route (top 10)", since=8)
    far = [median(vs) for k, vs in connect.items() if ("model", "deepseek-r1") in k]
    assert far and min(far) > 0.08, connect  # every far call pays the TLS handshake's trip
    for near in ("gpt-4.1", "llama-3-8b"):  # mostly reused connections: the mean stays ~0
        phases = over(day, "route_change", "Mean time per phase", model=near)
        assert median(of(phases, phase="connect")) < 0.05, (near, phases)
    server = "Server p99 by model and route (top 10)"
    assert median(of(over(day, "route_change", server, since=8), model="deepseek-r1")) > \
        median(of(over(day, None, server), model="deepseek-r1")) + 0.05
    # On-call selects the model: its mean phases moved by the round trips...
    before = over(day, None, "Mean time per phase", model="deepseek-r1")
    during = over(day, "route_change", "Mean time per phase", model="deepseek-r1")
    moved_by = {phase: median(of(during, phase=phase)) - median(of(before, phase=phase))
                for phase in ("connect", "server")}
    # Half a round trip at least (a few calls still near dilute the window's means).
    assert moved_by["connect"] > 0.05 and moved_by["server"] > 0.05, moved_by
    # ...and its model time did not: its time per output token (first to last token, which
    # the far region's delay shifts alike) is the same.
    tpot = "Time per output token p50 / p99"
    ratio = median(of(over(day, "route_change", tpot, since=8, model="deepseek-r1"))) / \
        median(of(over(day, None, tpot, model="deepseek-r1")))
    assert 0.7 < ratio < 1.4, ratio


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


# --- diagnose and LLMTTFTLikelyCause: the same Prometheus, each incident named ----------------

def diagnosed(d: dict[str, Any], at: float, since: float, baseline_at: float,
              baseline: float) -> list[dict[str, Any]]:
    """diagnose's findings (as `--json` prints them) over the `since` seconds ending `at`
    (seconds into the day) against the `baseline` seconds ending `baseline_at`: a post-mortem
    of the day chooses its baseline, the calm, as `--baseline-at` does. In-process: the
    command line's contract is tests/test_diagnose.py's; here a run is the decision on the
    day's real Prometheus, without an interpreter start-up per incident."""
    start = d["start"]
    req = Request(at=start + at, since=since, baseline=baseline, baseline_at=start + baseline_at)
    return [f.as_json() for f in diagnose(Prometheus(d["prom"].url), req,
                                          replace(DEFAULT, min_calls=MIN_CALLS))]


def test_diagnose_finds_nothing_in_the_calm(day: dict[str, Any]) -> None:
    """The calm's second half against its first: nothing, on every (model, route) with enough
    calls in both halves; and there are such (model, route)s, or this would pass on a
    diagnose that compared nothing."""
    half = (CALM - SKIP) / 2
    assert diagnosed(day, CALM, half, CALM - half, half) == []
    calls = SIGNALS_BY_KEY["calls"].expr(f"{half:g}s", [], ["model", "route"], mode=CLASSIC)
    compared = [{(r["metric"]["model"], r["metric"]["route"]) for r in
                 day["prom"].query(f"{calls} >= {MIN_CALLS}", at=day["start"] + at)}
                for at in (CALM, CALM - half)]
    assert len(compared[0] & compared[1]) >= 6, compared


@pytest.mark.parametrize("incident", list(INCIDENTS))
def test_diagnose_names_each_incidents_cause_on_its_target_only(
        day: dict[str, Any], incident: str) -> None:
    """The incident (from SKIP in) against the calm: its cause on its target, and no cause
    named anywhere else (but the previous incident's, on its target, in its TAIL)."""
    phase = next(p for p in day["schedule"].phases if p.incident == incident)
    end = phase.start + phase.seconds
    findings = diagnosed(day, end, phase.seconds - SKIP, CALM, CALM - SKIP)
    on = [f for f in findings if f["cause"] == incident and TARGETS[incident](f)]
    now = live(day["schedule"], phase.start + SKIP, end)
    wrong = [f for f in findings if not acceptable(f, now) and not known_weakness(f, incident)]
    assert on and not wrong, json.dumps(findings, indent=1)


def known_weakness(finding: dict[str, Any], incident: str) -> bool:
    """docs/diagnose.md's known weakness: during the noisy neighbour, a route of its own model
    named `route_change` with no new upstream. The neighbour's freezes hold the client's
    streams open, the pool opens new loopback connections on a loaded client event loop, and
    their connect rises with the server wait as a farther region's would (CI, 2026-12-05:
    llama-3-8b/search, connect 0.4 -> 11.2 ms, server 30 -> 37 ms)."""
    return incident == NOISY_NEIGHBOUR and finding["cause"] == ROUTE_CHANGE and \
        TARGETS[NOISY_NEIGHBOUR](dict(finding, cause=NOISY_NEIGHBOUR)) and \
        finding["evidence"].get("new_upstream_share") == 0.0


@pytest.mark.xfail(strict=False, reason=(
    "known weakness (issue 20, docs/diagnose.md): the watch judges every second against the "
    "window one phase back, and at some transitions names a wrong cause for a second or two "
    "(bench.diagnose_day, 12 days: 3 wrong seconds of 1,905 named): route_change on "
    "llama-3-8b late in the neighbour's freezes, whose loaded client event loop makes each "
    "loopback connect slower; noisy_neighbour on a surging route"))
def test_the_likely_cause_alert_names_each_incident_on_its_target_only(
        day: dict[str, Any]) -> None:
    """LLMTTFTLikelyCause (the watch's decision: the last 20 s against the 20 s one phase
    earlier) fired with each incident's cause on its target while it was live (its phase and
    TAIL); and, at every second of the day, named no cause off the target of a live
    incident, and nothing at all in the calm (from when the rules compare the calm with
    itself: one window and the offset in). Read until a window after the day: the rules still
    judge its last seconds then (the load stops with the day, Prometheus does not)."""
    prom, start = day["prom"], day["start"]
    seen = {name: 0 for name in INCIDENTS}
    wrong = []
    for t, f in alert_findings(prom, start, day["end"]):
        if not acceptable(f, live(day["schedule"], t, t)):
            wrong.append((round(t), f))
        elif f["cause"] in seen:
            seen[f["cause"]] += 1
    assert not wrong, wrong
    assert all(seen.values()), seen
