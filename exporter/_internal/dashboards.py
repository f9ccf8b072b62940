"""The four Grafana dashboards of LLM calls: what each panel shows, and the panel builders.

Each dashboard answers one set of questions on-call asks (is the SLO met, where does the time
go, is it one tenant or all, are streams healthy); the fifth, agent tasks, is built from the
same panel builders in agent_dashboard.py. The grafanalib classes that render them in
the current Grafana model are in grafana.py. Queries come from exporter.names and the PromQL
builders of promql.py, which the rules use too, so a panel can never disagree with an alert.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import attr
from grafanalib import core

from . import names, promql
from .config import Config
from .grafana import (BASE, SCHEMA_VERSION, BarGauge, BucketHeatmap, Dashboard, PromTarget, Row,
                      Stat, TimeSeries, Variable, step)
from .promql import MODEL_ROUTE, by, eq, indent, num, quantile, regex, selector

TAGS = ["ttft-exporter", "llm"]
RATE = "$__rate_interval"
RANGE = "$__range"
ROW_HEIGHT = 8

# --- panel builders ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One of the four dashboards: its uid (also the file stem), title and purpose (the
    dashboard's description, which generate.py marks as generated)."""

    uid: str
    title: str
    purpose: str


OVERVIEW = Spec("ttft-overview", "LLM TTFT: overview",
                "TTFT and first answer token against their SLOs, error budget, latency "
                "quantiles, distribution, outcomes and calls in flight.")
PHASES = Spec("ttft-phases", "LLM TTFT: where the time goes",
              "Call phases (queue, connect, send, server, prefill, reasoning, decode), TTFT per "
              "1k uncached input tokens and the prompt-cache share.")
TENANTS = Spec("ttft-tenants", "LLM TTFT: tenants and noisy neighbours",
               "Slowest tenants now, the share of tenants slower than an hour ago (one tenant: "
               "its prompts or cache; all tenants: the provider or a neighbour), tenant folding.")
STREAM = Spec("ttft-stream-health", "LLM TTFT: stream health",
              "Inter-token latency, stalls, time per output token, abandoned/cancelled/timed-out "
              "calls and the exporter's own health.")
AGENTS = Spec("ttft-agent-tasks", "LLM agent tasks: where a task's time goes",
               "Agent tasks: duration, steps, time by kind (queue, network, provider, tool, "
               "guardrail, app), critical path vs summed time, waterfalls, deadline overruns "
               "and orphan tokens, max_tokens headroom and truncations.")
SPECS = (OVERVIEW, PHASES, TENANTS, STREAM, AGENTS)


def target(expr: str, legend: str = "", *, instant: bool = False,
           fmt: str = core.TIME_SERIES_TARGET_FORMAT) -> PromTarget:
    """A query; range queries over the buckets of a family with exemplars show them."""
    exemplar = not instant and any(f"{f.name}_bucket" in expr for f in names.WINDOWED)
    return PromTarget(expr=expr, legendFormat=legend, instant=instant, format=fmt,
                      exemplar=exemplar)


def _with_ref_ids(targets: Sequence[PromTarget]) -> list[PromTarget]:
    return [attr.evolve(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)]


def timeseries(title: str, description: str, targets: Sequence[PromTarget], unit: str, *,
               thresholds: list[dict[str, Any]] | None = None, stacked: bool = False
               ) -> TimeSeries:
    return TimeSeries(
        title=title, description=description, targets=_with_ref_ids(targets), unit=unit,
        thresholds=thresholds or BASE, thresholdsStyleMode="line" if thresholds else "off",
        stacking={"group": "A", "mode": "normal"} if stacked else {"group": "A", "mode": "none"},
        fillOpacity=40 if stacked else 0, legendDisplayMode="table", legendPlacement="right",
        legendCalcs=["lastNotNull", "max"], tooltipMode="multi", tooltipSort="desc")


def stat(title: str, description: str, expr: str, legend: str, unit: str,
         thresholds: list[dict[str, Any]]) -> Stat:
    return Stat(title=title, description=description,
                targets=_with_ref_ids([target(expr, legend, instant=True)]), format=unit,
                color={"mode": "thresholds"}, decimals=2, thresholds=thresholds,
                reduceCalc="lastNotNull", graphMode="none", colorMode="background",
                noValue="no calls")


def heatmap(title: str, description: str, family: names.Family, matchers: Sequence[str]
            ) -> BucketHeatmap:
    expr = f"sum by (le) (increase({selector(family.name + '_bucket', matchers)}[{RATE}]))"
    return BucketHeatmap(title=title, description=description, thresholds=BASE,
                         targets=_with_ref_ids([target(expr, "{{le}}", fmt="heatmap")]))


def bargauge(title: str, description: str, expr: str, legend: str,
             thresholds: list[dict[str, Any]]) -> BarGauge:
    return BarGauge(title=title, description=description, thresholds=thresholds,
                    targets=_with_ref_ids([target(expr, legend, instant=True)]))


def layout(panels: Sequence[tuple[core.Panel, int]]) -> list[core.Panel]:
    """Place (panel, width) pairs left to right on Grafana's 24-column grid; a row starts a line."""
    out: list[core.Panel] = []
    x = y = 0
    for i, (panel, width) in enumerate(panels, start=1):
        if x and (isinstance(panel, Row) or x + width > 24):
            x, y = 0, y + ROW_HEIGHT
        height = 1 if isinstance(panel, Row) else ROW_HEIGHT
        out.append(attr.evolve(panel, id=i, gridPos={"h": height, "w": width, "x": x, "y": y}))
        if isinstance(panel, Row):
            y += height
        else:
            x += width
    return out


# --- the dashboards ---------------------------------------------------------------------------


class _Queries:
    """PromQL of the panels for one config: template-variable matchers and SLO unions."""

    def __init__(self, config: Config):
        self.config = config
        self.scopes = promql.scopes(config)

    def vars(self, family: names.Family | None = None) -> list[str]:
        """Matchers for $model, $route and, when the family carries it, $tenant.

        `family=None` means llm_client_requests_total, which always carries tenant.
        """
        out = [regex(names.MODEL, "$model"), regex(names.ROUTE, "$route")]
        if family is None or self.config.family_has_tenant(family):
            out.append(regex(names.TENANT, "$tenant"))
        return out

    def mr(self) -> list[str]:
        return [regex(names.MODEL, "$model"), regex(names.ROUTE, "$route")]

    def attainment(self, sli: str, family: names.Family) -> str:
        """Share of calls that met objective `sli` over the selected range, per SLO scope."""
        ratios = (promql.sli_good_ratio(sli, s, RANGE, self.vars(family)) for s in self.scopes)
        return "\nor\n".join(f"(\n{indent(ratio)}\n)" for ratio in ratios)

    def budget_left(self, sli: str, family: names.Family) -> str:
        """1 - (misses / allowed misses) over the selected range, per SLO scope."""
        parts = []
        for s in self.scopes:
            ratio = promql.sli_error_ratio(sli, s, RANGE, self.vars(family))
            parts.append(f"1 - (\n{indent(ratio)}\n) / {num(1 - getattr(s.slo, sli).target)}")
        return "\nor\n".join(parts)

    def burn(self, sli: str, window: int) -> str:
        record = promql.sli_record(window)
        return "\nor\n".join(
            f"{selector(record, [eq('sli', sli), eq('slo', s.id), *self.mr()])} "
            f"/ {num(1 - getattr(s.slo, sli).target)}" for s in self.scopes)

    def quantiles(self, family: names.Family, labels: Sequence[str], qs: Sequence[float],
                  legend: str) -> list[PromTarget]:
        return [target(quantile(q, family, labels, RATE, self.vars(family)),
                       f"p{num(q * 100)} {legend}") for q in qs]


def _rate(metric: str, matchers: Sequence[str], window: str = RATE) -> str:
    return f"rate({selector(metric, matchers)}[{window}])"


def _sum(labels: Sequence[str], inner: str) -> str:
    return f"sum by ({by(labels)}) ({inner})"


MR_LEGEND = "{{model}} {{route}}"


def overview(config: Config) -> list[core.Panel]:
    q, default = _Queries(config), config.slos[0]
    ttft_t, fat_t = default.ttft.threshold_seconds, default.first_answer_token.threshold_seconds
    attain = [step("red"), step("green", default.ttft.target)]
    budget = [step("red"), step("orange", 0), step("green", 0.25)]
    scope_note = ("Each (model, route) is held to the SLO entry that applies to it "
                  "(thresholds and targets from the config).")
    burn_steps = [step("green"), step("orange", promql.PAGE_BURN[1].factor),
                  step("red", promql.PAGE_BURN[0].factor)]
    return layout([
        (Row(title="Service level (selected time range)"), 24),
        (stat("TTFT SLO attainment",
              f"Share of calls whose first token came within the TTFT threshold (default "
              f"{num(ttft_t)}s). {scope_note}",
              q.attainment("ttft", names.TTFT), MR_LEGEND, "percentunit", attain), 6),
        (stat("TTFT error budget remaining",
              f"1 - misses / allowed misses over the selected range; below 0 the range spent "
              f"more than its budget. {scope_note}",
              q.budget_left("ttft", names.TTFT), MR_LEGEND, "percentunit", budget), 6),
        (stat("First answer token SLO attainment",
              f"Share of calls whose first non-reasoning token came within the threshold "
              f"(default {num(fat_t)}s). {scope_note}",
              q.attainment("first_answer_token", names.FIRST_ANSWER), MR_LEGEND, "percentunit",
              [step("red"), step("green", default.first_answer_token.target)]), 6),
        (stat("First answer token error budget remaining",
              "1 - misses / allowed misses over the selected range.",
              q.budget_left("first_answer_token", names.FIRST_ANSWER), MR_LEGEND, "percentunit",
              budget), 6),
        (timeseries("TTFT error budget burn rate",
                    "How many times faster than sustainable the TTFT budget burns, from the "
                    "recording rules (all tenants). The fast-burn page needs 14.4× over 1h "
                    "(and 5m) or 6× over 6h (and 30m).",
                    [target(q.burn("ttft", 3600), "1h " + MR_LEGEND),
                     target(q.burn("ttft", 21600), "6h " + MR_LEGEND)], "x",
                    thresholds=burn_steps), 24),
        (Row(title="Latency"), 24),
        (timeseries("TTFT p50 / p90 / p99",
                    "Time from the SDK call to the first output token of any kind.",
                    q.quantiles(names.TTFT, MODEL_ROUTE, (0.5, 0.9, 0.99), MR_LEGEND), "s",
                    thresholds=[step("green"), step("red", ttft_t)]), 12),
        (timeseries("First answer token p50 / p90 / p99",
                    "Time to the first token that is not reasoning: what users of reasoning "
                    "models wait for.",
                    q.quantiles(names.FIRST_ANSWER, MODEL_ROUTE, (0.5, 0.9, 0.99), MR_LEGEND),
                    "s", thresholds=[step("green"), step("red", fat_t)]), 12),
        (heatmap("TTFT distribution",
                 "Calls per TTFT bucket and interval, from the exporter's classic buckets.",
                 names.TTFT, q.vars(names.TTFT)), 24),
        (Row(title="Traffic"), 24),
        (timeseries("Calls by outcome", "Calls per second that ended with each outcome.",
                    [target(_sum([names.OUTCOME], _rate(names.REQUESTS_TOTAL, q.vars())),
                            "{{outcome}}")], "reqps", stacked=True), 12),
        (timeseries("Calls in flight", "Calls between start and end right now.",
                    [target(_sum(MODEL_ROUTE, selector(names.REQUESTS_IN_FLIGHT, q.mr())),
                            MR_LEGEND)], "short"), 12),
    ])


def phases(config: Config) -> list[core.Panel]:
    q, fam = _Queries(config), names.PHASE_FAMILY
    mr, tok = q.mr(), names.INPUT_TOKENS.name
    mean_phase = (f"{_sum([names.PHASE], _rate(fam.name + '_sum', q.vars(fam)))}\n"
                  f"/ {_sum([names.PHASE], _rate(fam.name + '_count', q.vars(fam)))}")
    mean_ttft = (f"{_sum(MODEL_ROUTE, _rate(names.TTFT.name + '_sum', mr))}\n"
                 f"/ {_sum(MODEL_ROUTE, _rate(names.TTFT.name + '_count', mr))}")
    cached = _sum(MODEL_ROUTE, _rate(names.CACHED_INPUT_TOKENS.name + "_sum", mr))
    inputs = _sum(MODEL_ROUTE, _rate(tok + "_sum", mr))
    uncached_mean = (f"(\n  {inputs}\n  - ({cached} or 0 * {inputs})\n)\n"
                     f"/ {_sum(MODEL_ROUTE, _rate(tok + '_count', mr))}")
    return layout([
        (Row(title="Phases of a call"), 24),
        (timeseries("Mean time per phase",
                    "Mean of each phase, stacked: queue (client-side waiting), connect (DNS, "
                    "TCP, TLS), send, server (until response headers), prefill (headers to "
                    "first token), reasoning (to the first answer token), decode.",
                    [target(mean_phase, "{{phase}}")], "s", stacked=True), 12),
        (timeseries("p99 per phase",
                    "p99 of each phase by model and route. Network phases moving while model "
                    "phases stay flat means a route or region change.",
                    [target(quantile(0.99, fam, (*MODEL_ROUTE, names.PHASE), RATE,
                                     q.vars(fam)), "{{phase}} " + MR_LEGEND)], "s"), 12),
        (Row(title="Prompt size and prompt cache (all tenants)"), 24),
        (timeseries("TTFT per 1k uncached input tokens",
                    "Mean TTFT divided by the mean uncached input tokens per call, × 1000. "
                    "Flat while TTFT grows: longer prompts (prefill). Rising: the provider.",
                    [target(f"(\n{indent(mean_ttft)}\n)\n/ (\n{indent(uncached_mean)}\n)\n"
                            f"* 1000", MR_LEGEND)], "s"), 8),
        (timeseries("Cached share of input tokens",
                    "Input tokens served from the provider's prompt cache. A drop with "
                    "rising TTFT: cold cache (tenant idle, cache evicted).",
                    [target(f"{cached}\n/ {inputs}", MR_LEGEND)], "percentunit"), 8),
        (timeseries("Input tokens per call",
                    "p50 and p99 of the prompt size from the provider's usage.",
                    q.quantiles(names.INPUT_TOKENS, MODEL_ROUTE, (0.5, 0.99), MR_LEGEND),
                    "short"), 8),
    ])


def tenants(config: Config) -> list[core.Panel]:
    q, al = _Queries(config), config.alerting
    n = promql.Names.of(al)
    top = al.top_tenants
    tenant_by = (*MODEL_ROUTE, names.TENANT)
    p99 = eq(names.QUANTILE, promql.le(0.99))
    window = f"{num(config.window.seconds)}s"
    other = selector(names.REQUESTS_TOTAL, [eq(names.TENANT, names.OTHER_TENANT), *q.mr()])
    all_calls = _sum(MODEL_ROUTE, _rate(names.REQUESTS_TOTAL, q.mr()))
    degraded = (f"TTFT p99 at least {num(al.tenant_degraded_factor)}× the same tenant's p99 "
                f"{promql.duration(al.tenant_baseline_offset_seconds)} earlier")
    slow = [step("green"), step("red", config.slos[0].ttft.threshold_seconds)]
    return layout([
        (Row(title="Right now"), 24),
        (bargauge(f"Top {top} tenants by TTFT p99 (last {window})",
                  "Exact p99 over the exporter's sliding window (HDR), per tenant.",
                  f"topk({top}, max by ({by(tenant_by)}) "
                  f"({selector(names.TTFT.window_name, [p99, *q.vars(names.TTFT)])}))",
                  "{{tenant}} {{model}} {{route}}", slow), 8),
        (bargauge(f"Top {top} tenants by stall p99 (last {window})",
                  "Exact p99 of the longest gap between tokens of a call, per tenant.",
                  f"topk({top}, max by ({by(tenant_by)}) "
                  f"({selector(names.STALL.window_name, [p99, *q.vars(names.STALL)])}))",
                  "{{tenant}} {{model}} {{route}}",
                  [step("green"), step("red", config.slos[0].stall.threshold_seconds)]), 8),
        (timeseries("Share of tenants slower than before",
                    f"Share of a model and route's tenants with {degraded}. One tenant: its "
                    f"own prompts or prompt cache. Most tenants at once: the provider or a "
                    f"noisy neighbour in its batch (alert at "
                    f"{promql.percent(al.many_tenants_share)}).",
                    [target(selector(n.tenants_degraded_ratio, q.mr()), MR_LEGEND)],
                    "percentunit",
                    thresholds=[step("green"), step("red", al.many_tenants_share)]), 8),
        (Row(title="Over time"), 24),
        (timeseries("TTFT p99 by tenant",
                    "All tenants moving together points at the provider, one alone at the "
                    "tenant.",
                    [target(quantile(0.99, names.TTFT, [names.TENANT], RATE,
                                     q.vars(names.TTFT)), "{{tenant}}")], "s"), 12),
        (timeseries("Stall p99 by tenant",
                    "Head-of-line blocking in the provider's batch shows as stalls for all "
                    "tenants of a model at once.",
                    [target(quantile(0.99, names.STALL, [names.TENANT], RATE,
                                     q.vars(names.STALL)), "{{tenant}}")], "s"), 12),
        (Row(title=f"Tenant folding into {names.OTHER_TENANT}"), 24),
        (timeseries("Calls folded per second",
                    f"Calls recorded under {names.OTHER_TENANT} because the model and route "
                    f"already hold labels.max_tenants ({config.labels.max_tenants}) tenants.",
                    [target(_sum(MODEL_ROUTE, _rate(names.SELF_TENANT_FOLDS, q.mr())),
                            MR_LEGEND)], "reqps"), 12),
        (timeseries(f"Share of calls under {names.OTHER_TENANT}",
                    "The part of the traffic the per-tenant panels cannot attribute.",
                    [target(f"(\n  {_sum(MODEL_ROUTE, f'rate({other}[{RATE}])')}\n"
                            f"  or 0 * {all_calls}\n)\n/ {all_calls}", MR_LEGEND)],
                    "percentunit"), 12),
    ])


def stream_health(config: Config) -> list[core.Panel]:
    q, labels = _Queries(config), config.labels
    stopped = "|".join((names.ABANDONED, names.CANCELLED, names.TIMEOUT))
    stopped_calls = _rate(names.REQUESTS_TOTAL, [regex(names.OUTCOME, stopped), *q.vars()])
    share = (f"{_sum([names.OUTCOME], stopped_calls)}\n"
             f"/ ignoring ({names.OUTCOME}) group_left\n"
             f"sum({_rate(names.REQUESTS_TOTAL, q.vars())})")
    job = [eq("job", config.alerting.exporter_job)]
    return layout([
        (Row(title="Streaming"), 24),
        (timeseries("Inter-token latency p50 / p99",
                    "Each gap between consecutive token events after the first.",
                    q.quantiles(names.ITL, MODEL_ROUTE, (0.5, 0.99), MR_LEGEND), "s"), 8),
        (heatmap("Longest stall per call",
                 "Distribution of each call's largest gap between tokens.",
                 names.STALL, q.vars(names.STALL)), 8),
        (timeseries("Time per output token p50 / p99",
                    "(last token - first token) / (output tokens - 1), per call.",
                    q.quantiles(names.TPOT, MODEL_ROUTE, (0.5, 0.99), MR_LEGEND), "s"), 8),
        (Row(title="Calls that did not finish"), 24),
        (timeseries("Abandoned, cancelled and timed-out calls",
                    "Share of all calls: abandoned (the consumer stopped reading), cancelled "
                    "(the caller cancelled), timeout (the client gave up).",
                    [target(share, "{{outcome}}")], "percentunit"), 24),
        (Row(title="Exporter"), 24),
        (stat("Exporter targets up", "Scrape targets of the exporter's job that answer.",
              f"sum({selector('up', job)})", "", "short", [step("red"), step("green", 1)]), 4),
        (stat("Series held", "Histogram series in the exporter, against labels.max_series.",
              f"sum({names.SELF_SERIES})", "", "short",
              [step("green"), step("orange", 0.8 * labels.max_series),
               step("red", labels.max_series)]), 4),
        (timeseries("Scrape render time",
                    "Time the previous scrape took to render (budget 50 ms at 1,000 series).",
                    [target(f"max by (instance) ({names.SELF_SCRAPE_DURATION})",
                            "{{instance}}")], "s", thresholds=[step("green"), step("red", 0.05)]),
         16),
        (timeseries("Tenant folds per second",
                    f"Calls recorded under tenant {names.OTHER_TENANT}.",
                    [target(_sum(MODEL_ROUTE, _rate(names.SELF_TENANT_FOLDS, q.mr())),
                            MR_LEGEND)], "reqps"), 12),
        (timeseries("Drops per second by reason",
                    "Values or series the exporter did not record (series limit, bad values, "
                    "bad labels, internal errors).",
                    [target(_sum([names.REASON], _rate(names.SELF_DROPS, [])), "{{reason}}")],
                    "reqps"), 12),
    ])


BUILDERS = {OVERVIEW: overview, PHASES: phases, TENANTS: tenants, STREAM: stream_health}


def variables(*extra: Variable) -> list[Variable]:
    """datasource, `extra`, then model, route and tenant, each narrowed by the ones before."""
    out = [Variable(name="datasource", label="Data source", query="prometheus",
                    type="datasource"), *extra]
    narrowing: list[str] = []
    for label in (names.MODEL, names.ROUTE, names.TENANT):
        query = f"label_values({selector(names.REQUESTS_TOTAL, narrowing)}, {label})"
        out.append(Variable(name=label, label=label.capitalize(), query=query))
        narrowing.append(regex(label, f"${label}"))
    return out


def dashboard(spec: Spec, config: Config, panels: list[core.Panel] | None = None,
              templating: list[Variable] | None = None) -> Dashboard:
    """One dashboard (of BUILDERS unless `panels` are given), linked to the others (keeping
    time range and variables)."""
    links = [core.DashboardLink(type="link", title=other.title, uri=f"/d/{other.uid}",
                                icon="dashboard", includeVars=True, keepTime=True)
             for other in SPECS if other is not spec]
    return Dashboard(
        title=spec.title, uid=spec.uid, tags=TAGS, schemaVersion=SCHEMA_VERSION,
        description=spec.purpose, panels=BUILDERS[spec](config) if panels is None else panels,
        links=links, editable=True,
        refresh=config.alerting.dashboard_refresh, time=core.Time("now-3h", "now"),
        graphTooltip=core.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        templating=core.Templating(list=templating or variables()))


def dashboards(config: Config) -> dict[str, Dashboard]:
    """The dashboards of BUILDERS by uid (the uid is also the file stem)."""
    return {spec.uid: dashboard(spec, config) for spec in BUILDERS}
