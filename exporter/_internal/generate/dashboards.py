"""The four Grafana dashboards of LLM calls: which model, route or tenant is slow, and why.

Each dashboard answers one set of questions on-call asks (is the SLO met and where is it
missed, where does the time go, is it one tenant or all, are streams healthy). Panels over the
selection aggregate the selected models and routes; panels that compare them break down by
model and route (or tenant) and show the top 10. Quantiles are drawn only where calls were
made (never NaN), counters show 0 rather than nothing, the error budget is the SLO period's
(Sloth's recordings), and every panel links its runbook section. Queries come from
exporter.names and promql.py, which the rules use too, so a panel cannot disagree with an alert.
The fifth, agent tasks, is built the same way in agent_dashboard.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grafanalib import core

from .. import names, promql
from ..config.settings import Config
from ..promql import MODEL_ROUTE, block, by, eq, num, regex, selector
from .cause_panels import why_row
from .grafana import SCHEMA_VERSION, Dashboard, Row, Variable, red_from, step
from .panels import (RATE, TOP, Queries, bargauge, heatmap, layout, rate, share_panel, stat,
                     sum_by, target, timeseries, top, top_now)

TAGS = ["ttft-exporter", "llm"]
MR_LEGEND = "{{model}} {{route}}"
ALL_TENANTS = " All tenants: this family has no tenant label (labels.tenant_families adds it)."

# Runbook sections (docs/runbooks.md headings) the panels link to.
TTFT_FAST, FIRST_FAST, ERRORS = ("LLMTTFTBudgetBurnFast", "LLMFirstAnswerBudgetBurnFast",
                                 "LLMErrorBudgetBurnFast")
STALLS, TIMEOUTS, REGRESSION = "LLMStreamStallsHigh", "LLMTimeoutRateHigh", "LLMTTFTP99Regression"
CONNECT, MANY, ONE = "LLMConnectPhaseRegression", "LLMTTFTManyTenantsDegraded", \
    "LLMTTFTTenantDegraded"
DOWN, FOLDING, DROPS = "TTFTExporterDown", "TTFTExporterTenantFolding", \
    "TTFTExporterDroppingSamples"
SURGE = "Incident: long-prompt prefill surge"
COLD = "Incident: prompt cache gone cold after idling"
NOISY = "Incident: noisy neighbour freezing every stream"
ROUTE_CHANGE = "Incident: silent route change to a farther region"


@dataclass(frozen=True)
class Spec:
    """One of the dashboards: its uid (also the file stem), title and purpose (the dashboard's
    description, which generate.py marks as generated)."""

    uid: str
    title: str
    purpose: str

    def in_mode(self, config: Config) -> Spec:
        """The uid and title in the config's histogram mode: the native dashboards have their
        own (`-native`, "(native histograms)"), so a Grafana can import both sets side by side;
        their files keep the classic stem, under native/."""
        if config.dashboards.histograms == "classic":
            return self
        return Spec(f"{self.uid}-{config.dashboards.histograms}",
                    f"{self.title} ({config.dashboards.histograms} histograms)", self.purpose)


OVERVIEW = Spec("ttft-overview", "LLM TTFT: overview",
                "TTFT and first answer token against their SLOs, the error budget over the SLO "
                "period, the slowest models and routes, outcomes and errors.")
PHASES = Spec("ttft-phases", "LLM TTFT: where the time goes",
              "Call phases (retry, queue, connect, send, server, prefill, reasoning, decode), "
              "the SDKs' retries by reason, prefill per 1k uncached input tokens, prompt sizes "
              "and the prompt-cache share.")
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


def overview(config: Config, q: Queries) -> list[core.Panel]:
    default = config.slos[0]
    ttft_t, fat_t = default.ttft.threshold_seconds, default.first_answer_token.threshold_seconds
    attain = [step("red"), step("green", default.ttft.target)]
    budget = [step("red"), step("orange", 0.001), step("green", 0.25)]
    period = promql.duration(config.alerting.slo_period_seconds)
    scope_note = ("Each (model, route) is held to the SLO entry that applies to it "
                  "(thresholds and targets from the config); the worst 10 are shown.")
    burn_steps = [step("green"), step("orange", promql.PAGE_BURN[1].factor),
                  step("red", promql.PAGE_BURN[0].factor)]
    outcomes = sum_by([names.OUTCOME], rate(names.REQUESTS_TOTAL, q.vars()))
    bad = "|".join(promql.ERROR_OUTCOMES)
    errors = sum_by([*MODEL_ROUTE, names.PROVIDER, names.OUTCOME], rate(
        names.REQUESTS_TOTAL, [regex(names.OUTCOME, bad), *q.vars()]))
    failures = ", ".join(promql.ERROR_OUTCOMES)
    mrp = [*MODEL_ROUTE, names.PROVIDER]
    limited_calls = rate(names.REQUESTS_TOTAL, [eq(names.OUTCOME, names.RATE_LIMITED), *q.vars()])
    limited = f"{sum_by(mrp, limited_calls)}\n/ ({q.calls(mrp)} > 0)"
    in_flight = sum_by(MODEL_ROUTE, selector(names.REQUESTS_IN_FLIGHT, q.mr()))
    return layout([
        (Row(title=f"Service level (attainment: selected range; budget: the {period} SLO "
                   f"period)"), 24),
        (stat("TTFT SLO attainment",
              f"Share of calls whose first token came within the TTFT threshold (default "
              f"{num(ttft_t)}s) over the selected range. {scope_note}",
              q.attainment("ttft", names.TTFT), MR_LEGEND, "percentunit", q.runbook(TTFT_FAST),
              attain), 6),
        (stat(f"TTFT error budget remaining ({period})",
              f"1 - misses / allowed misses over the SLO period ({period}, from the rules' "
              f"recordings); 0 means exhausted. {scope_note}",
              q.budget_left("ttft"), MR_LEGEND, "percentunit", q.runbook(TTFT_FAST), budget), 6),
        (stat("First answer token SLO attainment",
              f"Share of calls whose first non-reasoning token came within the threshold "
              f"(default {num(fat_t)}s) over the selected range. {scope_note}",
              q.attainment("first_answer_token", names.FIRST_ANSWER), MR_LEGEND, "percentunit",
              q.runbook(FIRST_FAST),
              [step("red"), step("green", default.first_answer_token.target)]), 6),
        (stat(f"First answer token error budget remaining ({period})",
              f"1 - misses / allowed misses over the SLO period ({period}); 0 means "
              f"exhausted. {scope_note}",
              q.budget_left("first_answer_token"), MR_LEGEND, "percentunit",
              q.runbook(FIRST_FAST), budget), 6),
        (timeseries("TTFT error budget burn rate (top 5 per window)",
                    "How many times faster than sustainable the TTFT budget burns, from the "
                    "recording rules (all tenants). The fast-burn page needs 14.4× over 1h "
                    "(and 5m) or 6× over 6h (and 30m).",
                    [target(q.burn("ttft", 3600, 5), "1h " + MR_LEGEND),
                     target(q.burn("ttft", 21600, 5), "6h " + MR_LEGEND)], "x",
                    q.runbook(TTFT_FAST), thresholds=burn_steps), 24),
        *why_row(q),
        (Row(title="Latency of the selection"), 24),
        (timeseries("TTFT p50 / p90 / p99",
                    "Time from the SDK call to the first output token of any kind, over every "
                    "selected model, route and tenant.",
                    q.quantiles(names.TTFT, (0.5, 0.9, 0.99)), "s", q.runbook(TTFT_FAST),
                    thresholds=red_from(ttft_t)), 12),
        (timeseries("First answer token p50 / p90 / p99",
                    "Time to the first token that is not reasoning: what users of reasoning "
                    "models wait for.",
                    q.quantiles(names.FIRST_ANSWER, (0.5, 0.9, 0.99)), "s",
                    q.runbook(FIRST_FAST), thresholds=red_from(fat_t)), 12),
        (Row(title="Which model and route"), 24),
        (timeseries("TTFT p99 by model and route (top 10)",
                    "The slowest models and routes by TTFT p99: one line rising alone points at "
                    "that route's prompts, its region or that model's fleet.",
                    [target(q.top_quantile(0.99, names.TTFT), MR_LEGEND)], "s",
                    q.runbook(REGRESSION), thresholds=red_from(ttft_t)), 12),
        (timeseries("First answer token p99 by model and route (top 10)",
                    "The slowest models and routes to the first non-reasoning token.",
                    [target(q.top_quantile(0.99, names.FIRST_ANSWER), MR_LEGEND)], "s",
                    q.runbook(FIRST_FAST), thresholds=red_from(fat_t)), 12),
        (heatmap("TTFT distribution",
                 f"Calls per TTFT bucket and interval, from the exporter's "
                 f"{q.mode.name} buckets.",
                 names.TTFT, q.vars(names.TTFT), q.runbook(TTFT_FAST), q.mode), 24),
        (Row(title="Traffic and errors"), 24),
        (timeseries("Calls by outcome",
                    "Calls per second of the selection by how they ended: ok; the provider's "
                    "failures (provider_error: 5xx and 529, timeout, connection_error, error: "
                    "unrecognised); the caller's own (client_error: a 4xx, rate_limited: 429, "
                    "cancelled, abandoned).",
                    [target(outcomes, "{{outcome}}")], "reqps", q.runbook(ERRORS),
                    stacked=True), 6),
        (timeseries("Provider failures by model, route and provider (top 10)",
                    f"Calls per second that failed on the provider's side ({failures}): what "
                    "the error budget counts. The caller's own 4xx and 429s are not in it; 0 "
                    "where a model and route had calls and none failed.",
                    [target(top(q.or_zero(errors)),
                            "{{outcome}} {{model}} {{route}} {{provider}}")], "reqps",
                    q.runbook(ERRORS)), 6),
        (timeseries("Rate-limited share by model, route and provider (top 10)",
                    "Share of the calls the provider answered 429 (too many requests): the "
                    "caller's quota, not a failure of the provider (no error budget spent); 0 "
                    "where none was. Rising with calls in flight: the client retries into its "
                    "limit.",
                    [target(top(q.or_zero(limited, mrp)),
                            "{{model}} {{route}} {{provider}}")], "percentunit",
                    q.runbook(ERRORS)), 6),
        (timeseries("Calls in flight by model and route (top 10)",
                    "Calls between start and end right now (all tenants).",
                    [target(top(in_flight), MR_LEGEND)], "short", q.runbook(ERRORS)), 6),
    ])


def phases(config: Config, q: Queries) -> list[core.Panel]:
    fam = names.PHASE_FAMILY
    tok, cached_fam = names.INPUT_TOKENS, names.CACHED_INPUT_TOKENS

    def phase_sel(phase: str | None = None) -> list[str]:
        return [*([eq(names.PHASE, phase)] if phase else []), *q.vars(fam)]

    mean_phase = (f"{sum_by([names.PHASE], q.hrate(fam, 'sum', phase_sel()))}\n"
                  f"/ ({sum_by([names.PHASE], q.hrate(fam, 'count', phase_sel()))} > 0)")
    prefill = phase_sel("prefill")
    mean_prefill = (f"{sum_by(MODEL_ROUTE, q.hrate(fam, 'sum', prefill))}\n"
                    f"/ ({sum_by(MODEL_ROUTE, q.hrate(fam, 'count', prefill))} > 0)")
    inputs = sum_by(MODEL_ROUTE, q.hrate(tok, "sum", q.vars(tok)))
    cached = sum_by(MODEL_ROUTE, q.hrate(cached_fam, "sum", q.vars(cached_fam)))
    uncached_mean = (f"(\n  {inputs}\n  - ({cached} or 0 * {inputs})\n)\n"
                     f"/ ({sum_by(MODEL_ROUTE, q.hrate(tok, 'count', q.vars(tok)))} > 0)")
    tokens_note = "" if config.family_has_tenant(tok) else ALL_TENANTS
    retried_calls = sum_by(MODEL_ROUTE, q.hrate(fam, "count", phase_sel("retry")))
    calls = sum_by(MODEL_ROUTE, rate(names.REQUESTS_TOTAL, q.mr()))
    # 0 (not no data) for a model and route whose calls never retried
    share = block(f"{retried_calls}\n/ ({calls} > 0)")
    retried_share = f"{share}\nor on ({by(MODEL_ROUTE)})\n0 * {calls}"
    # no retry in the range: one line at 0 named "none" (a panel with no data reads as broken)
    no_retry = (f'label_replace(0 * sum({rate(names.REQUESTS_TOTAL, q.mr())}), '
                f'"{names.REASON}", "none", "", "")')
    retries = f"{sum_by([names.REASON], rate(names.RETRIES.name, q.mr()))}\nor on () {no_retry}"
    panels = [
        (Row(title="Phases of a call (selection; all tenants)"), 24),
        (timeseries("Mean time per phase",
                    "Mean of each phase over the selected models and routes, stacked: retry "
                    "(the failed attempts and the SDK's backoff before the final attempt; "
                    "its mean is over the calls that retried), queue (client-side waiting "
                    "before the final attempt left), connect (DNS, TCP, TLS), send, server "
                    "(until response headers), prefill (headers to first token), reasoning "
                    "(to the first answer token), decode." + ALL_TENANTS,
                    [target(mean_phase, "{{phase}}")], "s", q.runbook(TTFT_FAST),
                    stacked=True), 12),
        (timeseries("p99 per phase",
                    "p99 of each phase over the selected models and routes: network phases "
                    "moving while model phases stay flat means a route or region change."
                    + ALL_TENANTS,
                    [target(top(q.quantile(0.99, fam, [names.PHASE], phase_sel())),
                            "{{phase}}")], "s",
                    q.runbook(ROUTE_CHANGE)), 12),
        (timeseries("Retried attempts by reason",
                    "Attempts the SDK retried per second, by what ended them: rate_limited "
                    "(429), overloaded (503, 529), server_error (other 5xx), timeout, "
                    "connection, other. Overload shows here and in the retry phase, not in "
                    "queue; none: no retry in the range. All tenants.",
                    [target(retries, "{{reason}}")], "reqps", q.runbook(ERRORS)), 12),
        (timeseries("Share of calls that retried (top 10)",
                    "Calls whose SDK retried at least once, of all calls, by model and route. "
                    "All tenants.",
                    [target(top(retried_share), MR_LEGEND)], "percentunit",
                    q.runbook(TTFT_FAST)), 12),
        (Row(title="Which model and route"), 24),
        (timeseries("Connect p99 by model and route (top 10)",
                    "DNS, TCP and TLS: a step here with flat model time is a route or region "
                    "change (calls on a reused connection connect in 0)." + ALL_TENANTS,
                    [target(q.top_quantile(0.99, fam, matchers=phase_sel("connect")),
                            MR_LEGEND)], "s", q.runbook(CONNECT)), 8),
        (timeseries("Server p99 by model and route (top 10)",
                    "Request sent to response headers: the provider's queue, and the round "
                    "trip to its region." + ALL_TENANTS,
                    [target(q.top_quantile(0.99, fam, matchers=phase_sel("server")),
                            MR_LEGEND)], "s", q.runbook(ROUTE_CHANGE)), 8),
        (timeseries("Prefill p99 by model and route (top 10)",
                    "Headers to the first token: grows with uncached prompt tokens, and for "
                    "every tenant of a model when a neighbour holds its batch." + ALL_TENANTS,
                    [target(q.top_quantile(0.99, fam, matchers=prefill), MR_LEGEND)], "s",
                    q.runbook(SURGE)), 8),
        (Row(title="Prompt size and prompt cache"), 24),
        (timeseries("Prefill per 1k uncached input tokens (top 10)",
                    "Mean prefill phase divided by the mean uncached input tokens per call, "
                    "× 1000. Flat while prefill grows: longer or less cached prompts. Rising: "
                    "the provider is slower per token." + ALL_TENANTS,
                    [target(top(f"{block(mean_prefill)}\n/ ({block(uncached_mean)} > 0)\n* 1000"),
                            MR_LEGEND)], "s", q.runbook(SURGE)), 8),
        (timeseries("Cached share of input tokens (lowest 10)",
                    "Input tokens served from the provider's prompt cache. A drop with rising "
                    "prefill: cold cache (tenant idle, cache evicted)." + tokens_note,
                    [target(top(f"{cached}\n/ ({inputs} > 0)", bottom=True), MR_LEGEND)],
                    "percentunit", q.runbook(COLD)), 8),
        (timeseries("Input tokens per call p99 by route (top 10)",
                    "p99 of the prompt size from the provider's usage: a surge on one route "
                    "is longer prompts there." + tokens_note,
                    [target(q.top_quantile(0.99, tok, (names.ROUTE,)), "{{route}}")], "short",
                    q.runbook(SURGE)), 8),
    ]
    if config.family_has_tenant(tok) and config.family_has_tenant(cached_fam):
        cached_by = sum_by([names.TENANT], q.hrate(cached_fam, "sum", q.vars(cached_fam)))
        by_tenant = (f"{cached_by}\n/ ({sum_by([names.TENANT], q.hrate(tok, 'sum', q.vars(tok)))}"
                     f" > 0)")
        panels.append((timeseries(
            "Cached share of input tokens by tenant (lowest 10)",
            "One tenant dropping alone: its cache went cold (it idled longer than the provider "
            "keeps a cache, or its prompts changed).",
            [target(top(by_tenant, bottom=True), "{{tenant}}")], "percentunit",
            q.runbook(COLD)), 24))
    return layout(panels)


def tenants(config: Config, q: Queries) -> list[core.Panel]:
    al = config.alerting
    n = promql.Names.of(al)
    tenant_by = (*MODEL_ROUTE, names.TENANT)
    p99 = eq(names.QUANTILE, promql.le(0.99))
    window = f"{num(config.window.seconds)}s"
    other = selector(names.REQUESTS_TOTAL, [eq(names.TENANT, names.OTHER_TENANT), *q.mr()])
    all_calls = sum_by(MODEL_ROUTE, rate(names.REQUESTS_TOTAL, q.mr()))
    degraded = (f"TTFT p99 at least {num(al.tenant_degraded_factor)}× the same tenant's p99 "
                f"{promql.duration(al.tenant_baseline_offset_seconds)} earlier")
    slow = red_from(config.slos[0].ttft.threshold_seconds)
    tenant_p99 = selector(n.tenant_p99, [*q.recorded(), regex(names.TENANT, "$tenant")])
    folds = sum_by(MODEL_ROUTE, rate(names.SELF_TENANT_FOLDS, q.mr()))
    slower = q.or_zero(selector(n.tenants_degraded_ratio, q.recorded()))
    return layout([
        (Row(title="Right now"), 24),
        (bargauge(f"Top {TOP} tenants by TTFT p99 (last {window})",
                  "Exact p99 over the exporter's sliding window (HDR), per tenant.",
                  top_now(f"max by ({by(tenant_by)}) "
                       f"({selector(names.TTFT.window_name, [p99, *q.vars(names.TTFT)])})"),
                  "{{tenant}} {{model}} {{route}}", q.runbook(ONE), slow), 8),
        (bargauge(f"Top {TOP} tenants by stall p99 (last {window})",
                  "Exact p99 of the longest gap between tokens of a call, per tenant.",
                  top_now(f"max by ({by(tenant_by)}) "
                       f"({selector(names.STALL.window_name, [p99, *q.vars(names.STALL)])})"),
                  "{{tenant}} {{model}} {{route}}", q.runbook(NOISY),
                  red_from(config.slos[0].stall.threshold_seconds)), 8),
        (share_panel("Share of tenants slower than before",
                     f"Share of a model and route's tenants with {degraded}; 0 where none is. "
                     f"One tenant: its own prompts or prompt cache. Most tenants at once: the "
                     f"provider or a noisy neighbour in its batch (alert at "
                     f"{promql.percent(al.many_tenants_share)}).",
                     slower, MR_LEGEND, q.runbook(MANY), al.many_tenants_share), 8),
        (Row(title="Over time"), 24),
        (timeseries("TTFT p99 by tenant (top 10)",
                    "Each tenant's TTFT p99 over 5 minutes, from the rules' recording (tenants "
                    "with calls only). All tenants moving together points at the provider, one "
                    "alone at the tenant.",
                    [target(top(f"max by ({names.TENANT}) ({tenant_p99})"), "{{tenant}}")],
                    "s", q.runbook(ONE)), 12),
        (timeseries("Stall p99 by tenant (top 10)",
                    "Head-of-line blocking in the provider's batch shows as stalls for all "
                    "tenants of a model at once.",
                    [target(q.top_quantile(0.99, names.STALL, [names.TENANT]), "{{tenant}}")],
                    "s", q.runbook(NOISY)), 12),
        (Row(title=f"Tenant folding into {names.OTHER_TENANT}"), 24),
        (timeseries("Calls folded per second (top 10)",
                    f"Calls recorded under {names.OTHER_TENANT} because the model and route "
                    f"already hold labels.max_tenants ({config.labels.max_tenants}) tenants; 0 "
                    f"where none folded.",
                    [target(top(q.or_zero(folds)), MR_LEGEND)], "reqps",
                    q.runbook(FOLDING)), 12),
        (timeseries(f"Share of calls under {names.OTHER_TENANT} (top 10)",
                    "The part of the traffic the per-tenant panels cannot attribute.",
                    [target(top(f"(\n  {sum_by(MODEL_ROUTE, f'rate({other}[{RATE}])')}\n"
                                 f"  or 0 * {all_calls}\n)\n/ ({all_calls} > 0)"), MR_LEGEND)],
                    "percentunit", q.runbook(FOLDING)), 12),
    ])


def stream_health(config: Config, q: Queries) -> list[core.Panel]:
    labels = config.labels
    stopped = "|".join((names.ABANDONED, names.CANCELLED, names.TIMEOUT))
    stopped_calls = rate(names.REQUESTS_TOTAL, [regex(names.OUTCOME, stopped), *q.vars()])
    total = f"sum({rate(names.REQUESTS_TOTAL, q.vars())})"
    share = (f"(\n  {sum_by([names.OUTCOME], stopped_calls)}\n"
             f"  or label_replace(0 * {total}, \"{names.OUTCOME}\", \"none\", \"\", \"\")\n)\n"
             f"/ ignoring ({names.OUTCOME}) group_left ()\n({total} > 0)")
    job = [regex("job", "$job")]
    drops = sum_by([names.REASON], rate(names.SELF_DROPS, job))
    return layout([
        (Row(title="Streaming (selection)"), 24),
        (timeseries("Inter-token latency p50 / p99",
                    "Each gap between consecutive token events after the first." + ALL_TENANTS,
                    q.quantiles(names.ITL, (0.5, 0.99)), "s", q.runbook(NOISY)), 8),
        (heatmap("Longest stall per call",
                 "Distribution of each call's largest gap between tokens.",
                 names.STALL, q.vars(names.STALL), q.runbook(STALLS), q.mode), 8),
        (timeseries("Time per output token p50 / p99",
                    "(last token - first token) / (output tokens - 1), per call." + ALL_TENANTS,
                    q.quantiles(names.TPOT, (0.5, 0.99)), "s", q.runbook(STALLS)), 8),
        (Row(title="Which model and route"), 24),
        (timeseries("Inter-token latency p99 by model and route (top 10)",
                    "A model whose every stream slows at once: a neighbour holds its batch."
                    + ALL_TENANTS,
                    [target(q.top_quantile(0.99, names.ITL), MR_LEGEND)], "s",
                    q.runbook(NOISY)), 12),
        (timeseries("Stall p99 by model and route (top 10)",
                    "The longest gap of a call, p99: freezes of the provider's batch.",
                    [target(q.top_quantile(0.99, names.STALL), MR_LEGEND)], "s",
                    q.runbook(STALLS),
                    thresholds=red_from(config.slos[0].stall.threshold_seconds)), 12),
        (Row(title="Calls that did not finish"), 24),
        (timeseries("Abandoned, cancelled and timed-out calls",
                    "Share of the selection's calls: abandoned (the consumer stopped reading), "
                    "cancelled (the caller cancelled), timeout (the client gave up); `none` "
                    "at 0 when every call finished.",
                    [target(share, "{{outcome}}")], "percentunit", q.runbook(TIMEOUTS)), 24),
        (Row(title="Exporter"), 24),
        (stat("Exporter targets up", "Scrape targets of the selected jobs that answer.",
              f"sum({selector('up', job)})", "", "short", q.runbook(DOWN),
              [step("red"), step("green", 1)]), 4),
        (stat("Series held", "Histogram series in the exporter, against labels.max_series.",
              f"sum({selector(names.SELF_SERIES, job)})", "", "short", q.runbook(DROPS),
              [step("green"), step("orange", 0.8 * labels.max_series),
               step("red", labels.max_series)]), 4),
        (timeseries("Scrape render time",
                    "Time the previous scrape took to render (budget 50 ms at 1,000 series).",
                    [target(f"max by (instance) ({selector(names.SELF_SCRAPE_DURATION, job)})",
                            "{{instance}}")], "s", q.runbook(DOWN),
                    thresholds=red_from(0.05)), 16),
        (timeseries("Drops per second by reason",
                    "Values or series the exporter did not record (series limit, bad values, "
                    "bad labels, internal errors); 0 while it drops none.",
                    [target(f"{drops}\nor label_replace(0 * sum({selector('up', job)}), "
                            f"\"{names.REASON}\", \"none\", \"\", \"\")", "{{reason}}")],
                    "reqps", q.runbook(DROPS)), 24),
    ])


BUILDERS = {OVERVIEW: overview, PHASES: phases, TENANTS: tenants, STREAM: stream_health}


def variables(with_tenant: bool, *extra: Variable) -> list[Variable]:
    """datasource, then job, model, route and (where a panel uses it) tenant, each narrowed by
    the ones before it, then `extra`."""
    out = [Variable(name="datasource", label="Data source", query="prometheus",
                    type="datasource")]
    narrowing: list[str] = []
    wanted = ("job", names.MODEL, names.ROUTE, *((names.TENANT,) if with_tenant else ()))
    for label in wanted:
        query = f"label_values({selector(names.REQUESTS_TOTAL, narrowing)}, {label})"
        out.append(Variable(name=label, label=label.capitalize(), query=query))
        narrowing.append(regex(label, f"${label}"))
    return [*out, *extra]


def dashboard(spec: Spec, config: Config,
              build: Callable[[Config, Queries], list[core.Panel]] | None = None,
              extra: Sequence[Variable] = ()) -> Dashboard:
    """One dashboard (its panels from BUILDERS, or `build`), linked to the others (keeping time
    range and variables); `extra` variables follow the usual ones."""
    links = [core.DashboardLink(type="link", title=other.title, uri=f"/d/{other.uid}",
                                icon="dashboard", includeVars=True, keepTime=True)
             for other in (s.in_mode(config) for s in SPECS if s is not spec)]
    queries = Queries(config)
    panels = (build or BUILDERS[spec])(config, queries)
    named = spec.in_mode(config)
    return Dashboard(
        title=named.title, uid=named.uid, tags=TAGS, schemaVersion=SCHEMA_VERSION,
        description=spec.purpose, panels=panels, links=links, editable=True,
        refresh=config.alerting.dashboard_refresh, time=core.Time("now-3h", "now"),
        graphTooltip=core.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        templating=core.Templating(list=variables(queries.uses_tenant, *extra)))


def dashboards(config: Config) -> dict[str, Dashboard]:
    """The dashboards of BUILDERS by uid (the uid is also the file stem)."""
    return {spec.uid: dashboard(spec, config) for spec in BUILDERS}
