"""Prometheus recording and alerting rules, generated from the SLO config.

The PromQL, the SLI definitions, the SLO scopes and the names of the recordings the dashboards
read come from promql.py, which the dashboards use too; this module holds the rules and the
policy only alerts read (ticket burn rates, severities, `for` durations, texts). Each SLO
entry's rules carry its scope as label `slo` (promql.scopes). Recording-rule windows, offsets
and `for` durations scale with `alerting.window_scale`; recording-rule names do not.

Every rule selects the exporter's job and `alerting.selector`, and keeps `alerting.group_by`
(promql.scope_matchers, promql.kept). The SLI recordings follow Sloth's names and labels
(`slo:sli_error:ratio_rate<window>`, `sloth_id`, `sloth_service`, `sloth_slo`, and the budget
recordings over the SLO period), so Sloth's dashboards read them too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .. import names
from ..config.settings import AlertingConfig, Config
from ..promql import (CURRENT_BURN_RATE, ERRORS_SLI, MODEL_ROUTE, PAGE_BURN,
                      PERIOD_BUDGET_REMAINING, PERIOD_BURN_RATE, REGRESSION_WINDOW, SLIS,
                      SLI_WINDOWS, BurnRate, Names, Scope, block, by, duration, eq,
                      histogram_mode, kept, num, outcome_ratio, percent, runbook_url,
                      scope_matchers, scopes, selector, sli_error_ratio, sli_record)
from .cause_rules import cause_alerts
from .loss_alerts import loss_alerts

# --- alert-only policy ------------------------------------------------------------------------

#: Ticket pairs of the SRE workbook's multi-window burn rates (the page pairs, which a panel
#: draws, are promql.PAGE_BURN).
TICKET_BURN = (BurnRate(3, 86400, 7200), BurnRate(1, 259200, 21600))
#: Stalls and timeouts are symptoms, not objectives of their own: a single window pair, ticket.
STALL_BURN = BurnRate(6, 3600, 300)
TIMEOUT_BURN = BurnRate(3, 3600, 300)

#: The network phase (DNS, TCP, TLS) whose regression means a route or region change.
CONNECT_PHASE = "connect"

#: The two alert levels (Sloth's `sloth_severity`); `alerting.page_severity` and
#: `ticket_severity` give the `severity` label of each.
PAGE, TICKET = "page", "ticket"


def recorded_scope(al: AlertingConfig) -> list[str]:
    """Matchers alerts put on recorded series: the exporter's job, when recordings keep it (so
    two releases' rules never alert on each other's recordings)."""
    return scope_matchers(al)[:1] if "job" in kept(al) else []


def severity(al: AlertingConfig, level: str) -> str:
    """The `severity` label of an alert level."""
    return al.page_severity if level == PAGE else al.ticket_severity


# --- rules ------------------------------------------------------------------------------------


class _Windows:
    """Nominal durations -> the (possibly scaled) PromQL durations of this config."""

    def __init__(self, al: AlertingConfig):
        self.scale = al.window_scale

    def __call__(self, seconds: float) -> str:
        return duration(seconds * self.scale)


def sloth_labels(config: Config, scope: Scope, sli: str) -> dict[str, str]:
    """Labels of an SLI's recordings: ours (`sli`, `slo`) and Sloth's."""
    slug = re.sub(r"[^a-zA-Z0-9.-]+", "-", scope.id).strip("-")
    slo = f"{sli.replace('_', '-')}-{slug}"
    service = config.alerting.service
    return {"sli": sli, "slo": scope.id, "sloth_id": f"{service}-{slo}",
            "sloth_service": service, "sloth_slo": slo}


def recording_rules(config: Config) -> list[dict[str, Any]]:
    """Rule groups: per scope and SLI the error ratios and the budget over the SLO period, then
    the latency baselines."""
    al = config.alerting
    w = _Windows(al)
    ratios: list[dict[str, Any]] = []
    budgets: list[dict[str, Any]] = []
    for scope in scopes(config):
        for sli in SLIS:
            labels = sloth_labels(config, scope, sli)
            ratios += [{"record": sli_record(window),
                        "expr": sli_error_ratio(sli, scope, w(window), scope_matchers(al),
                                                kept(al)),
                        "labels": labels} for window in SLI_WINDOWS]
            budgets += _budget_records(config, scope, sli, labels, w)
    calls = selector(names.REQUESTS_TOTAL, scope_matchers(al))
    ratios += [{"record": calls_record(window),
                "expr": f"sum by ({by(kept(al))}) (increase({calls}[{w(window)}]))"}
               for window in GUARD_WINDOWS]
    return [
        {"name": "ttft-exporter-records-sli", "rules": ratios},
        # The period changes slowly and reads 30 days: every 5 minutes is enough.
        {"name": "ttft-exporter-records-budget", "interval": w(300), "rules": budgets},
        {"name": "ttft-exporter-records-latency", "rules": _latency_records(config, w)},
    ]


def _budget_records(config: Config, scope: Scope, sli: str, labels: dict[str, str],
                    w: _Windows) -> list[dict[str, Any]]:
    """Sloth's period and budget recordings. The period ratio is the mean of the 5m ratios
    over the period (cheap; every 5 minutes with calls weighs the same), as Sloth records it."""
    period = config.alerting.slo_period_seconds
    budget = num(1 - getattr(scope.slo, sli).target)
    mine = [eq("sloth_id", labels["sloth_id"]), *recorded_scope(config.alerting)]
    five = selector(sli_record(300), mine)
    return [
        {"record": sli_record(period), "labels": labels,
         "expr": (f"sum_over_time({five}[{w(period)}])\n"
                  f"/ count_over_time({five}[{w(period)}])")},
        {"record": "slo:objective:ratio", "labels": labels,
         "expr": f"vector({num(getattr(scope.slo, sli).target)})"},
        {"record": "slo:error_budget:ratio", "labels": labels, "expr": f"vector({budget})"},
        {"record": "slo:time_period:days", "labels": labels,
         "expr": f"vector({num(period / 86400)})"},
        {"record": CURRENT_BURN_RATE, "labels": labels, "expr": f"{five} / {budget}"},
        {"record": PERIOD_BURN_RATE, "labels": labels,
         "expr": f"{selector(sli_record(period), mine)} / {budget}"},
        {"record": PERIOD_BUDGET_REMAINING, "labels": labels,
         "expr": f"1 - {selector(PERIOD_BURN_RATE, mine)}"},
    ]


def _latency_records(config: Config, w: _Windows) -> list[dict[str, Any]]:
    al, n = config.alerting, Names.of(config.alerting)
    reg, reg_off = w(REGRESSION_WINDOW), w(al.regression_offset_seconds)
    ten, ten_off = w(al.tenant_window_seconds), w(al.tenant_baseline_offset_seconds)
    scope, keep = scope_matchers(al), kept(al)
    connect = [eq(names.PHASE, CONNECT_PHASE), *scope]
    phase_by = (*keep, names.PHASE)
    tenant_by = (*keep, names.TENANT)
    mode = histogram_mode(config)

    def p99(family: names.Family, labels: Sequence[str], matchers: Sequence[str],
            window: str = reg, offset: str = "") -> str:
        # Only where the window holds calls: a quantile over none is NaN (and an idle tenant
        # would dilute the share of degraded tenants).
        count = mode.rate(family, "count", matchers, window, offset)
        calls = f"sum by ({by(labels)}) ({count}) > 0"
        return f"{mode.quantile(0.99, family, labels, window, matchers, offset)}\nand\n{calls}"

    return [
        {"record": n.ttft_p99, "expr": p99(names.TTFT, keep, scope)},
        {"record": n.ttft_p99_baseline, "expr": p99(names.TTFT, keep, scope, offset=reg_off)},
        {"record": n.connect_p99, "expr": p99(names.PHASE_FAMILY, phase_by, connect)},
        {"record": n.connect_p99_baseline,
         "expr": p99(names.PHASE_FAMILY, phase_by, connect, offset=reg_off)},
        {"record": n.tenant_p99, "expr": p99(names.TTFT, tenant_by, scope, ten)},
        {"record": n.tenant_p99_baseline, "expr": p99(names.TTFT, tenant_by, scope, ten, ten_off)},
        {"record": n.tenant_p99_rise, "expr": f"{n.tenant_p99}\n/ {n.tenant_p99_baseline}"},
        # sum / count rather than avg: exact, where avg's running mean depends on series order.
        {"record": n.tenants_degraded_ratio,
         "expr": (f"sum by ({by(keep)}) "
                  f"({n.tenant_p99_rise} > bool {num(al.tenant_degraded_factor)})\n"
                  f"/ count by ({by(keep)}) ({n.tenant_p99_rise})")},
    ]


def alerting_rules(config: Config) -> list[dict[str, Any]]:
    """Alert groups: SLO burn rates and request outcomes, latency shifts, exporter health."""
    w = _Windows(config.alerting)
    slo_alerts: list[dict[str, Any]] = []
    for scope in scopes(config):
        slo_alerts += [
            _burn_alert("LLMTTFTBudgetBurnFast", PAGE, "ttft", scope, PAGE_BURN, w, config),
            _burn_alert("LLMTTFTBudgetBurnSlow", TICKET, "ttft", scope, TICKET_BURN, w, config),
            _burn_alert("LLMFirstAnswerBudgetBurnFast", PAGE, "first_answer_token", scope,
                        PAGE_BURN, w, config),
            _burn_alert("LLMFirstAnswerBudgetBurnSlow", TICKET, "first_answer_token", scope,
                        TICKET_BURN, w, config),
            _burn_alert("LLMErrorBudgetBurnFast", PAGE, ERRORS_SLI, scope, PAGE_BURN, w,
                        config),
            _burn_alert("LLMStreamStallsHigh", TICKET, "stall", scope, (STALL_BURN,), w, config),
            _timeout_alert(scope, w, config),
        ]
    return [
        {"name": "ttft-exporter-alerts-slo", "rules": slo_alerts},
        {"name": "ttft-exporter-alerts-latency", "rules": _latency_alerts(config, w)},
        {"name": "ttft-exporter-alerts-tasks", "rules": _task_alerts(config, w)},
        {"name": "ttft-exporter-alerts-self", "rules": _exporter_alerts(config, w)},
    ]


def cause_rules(config: Config) -> list[dict[str, Any]]:
    """The likely-cause group (cause_rules.py): `LLMTTFTLikelyCause`, reading what
    `ttft-exporter watch` decides. A rule file of its own (generate.CAUSE_FILE): it reads only
    the watch's series, and the promtool tests of the other rules need not load it."""
    return [{"name": "ttft-exporter-alerts-cause", "rules": cause_alerts(config, _alert)}]


def _alert(name: str, level: str, expr: str, for_: str, summary: str, description: str,
           config: Config, scope: Scope | None = None) -> dict[str, Any]:
    """One alerting rule; per-SLO-scope rules carry the scope as label `slo`, which keeps rules
    of the same name distinct (promtool rejects duplicates)."""
    labels = {"severity": severity(config.alerting, level), "sloth_severity": level}
    if scope is not None:
        labels["slo"] = scope.id
    return {
        "alert": name, "expr": expr, "for": for_, "labels": labels,
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": runbook_url(config.alerting, name)},
    }


_WHERE = "model {{ $labels.model }} on route {{ $labels.route }}"
_VALUE_1F = '{{ $value | printf "%.1f" }}'
_VALUE_2F = '{{ $value | printf "%.2f" }}'
_VALUE_PCT = "{{ $value | humanizePercentage }}"
_BURN_FOR = {PAGE: 120, TICKET: 900}
_BURN_TEXT = {
    "ttft": ("TTFT", "reached the first token within {threshold}"),
    "first_answer_token": ("First answer token",
                           "reached the first answer token (after reasoning) within {threshold}"),
    "stall": ("Stream stall", "streamed without a gap longer than {threshold}"),
    ERRORS_SLI: ("Request", "ended without a failure on the provider's side: "
                            f"{', '.join(names.PROVIDER_FAILURES[:-1])} or "
                            f"{names.PROVIDER_FAILURES[-1]}"),
}


#: The long windows of every burn-rate pair: the minimum-traffic guard counts calls over them.
GUARD_WINDOWS = tuple(sorted({p.long for p in (*PAGE_BURN, *TICKET_BURN, STALL_BURN,
                                               TIMEOUT_BURN)}))


def calls_record(window: float) -> str:
    """Name of the recorded number of calls over a window (the minimum-traffic guard)."""
    return f"model_route:{names.REQUESTS_TOTAL}:increase{duration(window)}"


def _enough_calls(window: float, al: AlertingConfig) -> str:
    """The minimum-traffic guard: the (model, route) made at least `min_calls` calls over the
    window."""
    return (f"on ({by(kept(al))}) {selector(calls_record(window), recorded_scope(al))} "
            f">= {al.min_calls}")


def _burn_alert(name: str, level: str, sli: str, scope: Scope,
                pairs: Sequence[BurnRate], w: _Windows, config: Config) -> dict[str, Any]:
    """Alert when the error ratio exceeds factor × budget over both windows of any pair, with
    at least `min_calls` calls over the long one.

    The value is the burn rate over the long window of the matching pair, so the description
    can print it (Prometheus templates have no arithmetic).
    """
    al = config.alerting
    objective = getattr(scope.slo, sli)
    budget = num(1 - objective.target)
    label_sel = [eq("sli", sli), eq("slo", scope.id), *recorded_scope(al)]

    def over(window: int, factor: float) -> str:
        return f"{selector(sli_record(window), label_sel)} / {budget} > {num(factor)}"

    branches = [f"(\n  {over(p.long, p.factor)}\nand\n  {over(p.short, p.factor)}\n"
                f"and {_enough_calls(p.long, al)}\n)" for p in pairs]
    title, met = _BURN_TEXT[sli]
    threshold = objective.threshold_seconds
    goal = met.format(threshold=f"{num(threshold)}s" if threshold is not None else "")
    rule = " or ".join(f"{num(p.factor)}× over {duration(p.long)} and {duration(p.short)}"
                       for p in pairs)
    return _alert(
        name, level, "\nor\n".join(branches), w(_BURN_FOR[level]),
        f"{title} error budget burning: {_WHERE}",
        f"The objective is that {percent(objective.target)} of calls {goal} (SLO {scope.id}). "
        f"Calls of {_WHERE} spend the error budget {_VALUE_1F}× as fast "
        f"as sustainable over the long window (alerting at {rule}, with at least "
        f"{al.min_calls} calls over the long window).", config, scope)


def _timeout_alert(scope: Scope, w: _Windows, config: Config) -> dict[str, Any]:
    al = config.alerting
    budget = 1 - scope.slo.errors.target
    limit = num(TIMEOUT_BURN.factor * budget)

    def over(window: int) -> str:
        ratio = outcome_ratio(names.TIMEOUT, scope, w(window), scope_matchers(al), kept(al))
        return f"{block(ratio)} > {limit}"

    return _alert(
        "LLMTimeoutRateHigh", TICKET,
        f"{over(TIMEOUT_BURN.long)}\nand\n{over(TIMEOUT_BURN.short)}\n"
        f"and {_enough_calls(TIMEOUT_BURN.long, al)}", w(900),
        f"LLM calls timing out: {_WHERE}",
        f"{_VALUE_PCT} of the calls of {_WHERE} timed out over the "
        f"last {duration(TIMEOUT_BURN.long)} (alerting above {percent(float(limit))}, "
        f"{num(TIMEOUT_BURN.factor)}× the error budget of SLO {scope.id}, over "
        f"{duration(TIMEOUT_BURN.long)} and {duration(TIMEOUT_BURN.short)}, with at least "
        f"{al.min_calls} calls).", config, scope)


def _query_value(metric: str, labels: Sequence[str]) -> str:
    """Template snippet printing `metric` for the alert's labels as a duration."""
    matchers = [f"{label}=%q" for label in labels]
    args = " ".join(f"$labels.{label}" for label in labels)
    return (f'{{{{ with printf "{metric}{{{",".join(matchers)}}}" {args} | query }}}}'
            f"{{{{ . | first | value | humanizeDuration }}}}{{{{ end }}}}")


def _latency_alerts(config: Config, w: _Windows) -> list[dict[str, Any]]:
    al, n = config.alerting, Names.of(config.alerting)
    keep, mine, plain = kept(al), recorded_scope(al), n
    n = Names(*(selector(name, mine) for name in (
        n.ttft_p99, n.ttft_p99_baseline, n.connect_p99, n.connect_p99_baseline, n.tenant_p99,
        n.tenant_p99_baseline, n.tenant_p99_rise, n.tenants_degraded_ratio)))
    reg, off = duration(REGRESSION_WINDOW), duration(al.regression_offset_seconds)
    factor, floor = num(al.regression_factor), num(al.regression_min_seconds)
    ten_off, rise = duration(al.tenant_baseline_offset_seconds), num(al.tenant_degraded_factor)
    many = (f"(\n  {n.tenants_degraded_ratio} >= {num(al.many_tenants_share)}\n"
            f"  and\n  count by ({by(keep)}) ({n.tenant_p99_rise}) "
            f">= {al.many_tenants_min}\n)")

    def regression(now: str, then: str) -> str:
        return f"{now} / {then} > {factor}\nand\n{now} - {then} > {floor}"

    return [
        _alert(
            "LLMTTFTP99Regression", TICKET, regression(n.ttft_p99, n.ttft_p99_baseline),
            w(1800), f"TTFT p99 regressed against last week: {_WHERE}",
            f"TTFT p99 of {_WHERE} over the last {reg} is {_query_value(plain.ttft_p99, keep)}, "
            f"{_VALUE_2F}× its value {off} ago "
            f"(alerting above {factor}× and {floor}s slower).", config),
        _alert(
            "LLMConnectPhaseRegression", TICKET,
            regression(n.connect_p99, n.connect_p99_baseline), w(1800),
            f"Connect phase slower than last week: {_WHERE}",
            f"p99 of the connect phase (DNS, TCP, TLS) of {_WHERE} over the last {reg} is "
            f"{_query_value(plain.connect_p99, [*keep, names.PHASE])}, {_VALUE_2F}× "
            f"its value {off} ago (alerting above {factor}× and {floor}s slower): the route, "
            f"region or endpoint of the provider probably changed.", config),
        _alert(
            "LLMTTFTManyTenantsDegraded", TICKET, many, w(300),
            f"TTFT rose for most tenants at once: {_WHERE}",
            f"{_VALUE_PCT} of the tenants of {_WHERE} have a TTFT p99 "
            f"at least {rise}× their p99 {ten_off} ago (alerting at "
            f"{percent(al.many_tenants_share)} of at least {al.many_tenants_min} tenants). All "
            f"tenants at once points at the provider or a noisy neighbour in its batch, not at "
            f"any tenant's prompts.", config),
        _alert(
            "LLMTTFTTenantDegraded", TICKET,
            f"{n.tenant_p99_rise} > {rise}\nunless on ({by(keep)})\n{many}", w(900),
            "TTFT rose for tenant {{ $labels.tenant }} only: " + _WHERE,
            f"TTFT p99 of tenant {{{{ $labels.tenant }}}} on {_WHERE} is "
            f"{_query_value(plain.tenant_p99, [*keep, names.TENANT])}, {_VALUE_2F}× "
            f"its p99 {ten_off} ago (alerting above {rise}×), while most other tenants of the "
            f"same model and route are not slower: look at this tenant's prompts and prompt "
            f"cache.", config),
    ]


#: Window of the agent-task and truncation alerts' shares, and how long they must hold.
TASK_WINDOW, TASK_FOR = 1800, 900


def _task_alerts(config: Config, w: _Windows) -> list[dict[str, Any]]:
    """Agent tasks past their deadline, and calls cut at max_tokens (agent_dashboard.py).

    Like every rule they select the exporter's job and keep `alerting.group_by`; task families
    carry no model or route, so the deadline share keeps `task` and the group_by labels."""
    al, window = config.alerting, w(TASK_WINDOW)
    scope = scope_matchers(al)
    tasks, finish = names.TASKS_TOTAL.name, names.FINISH_REASONS_TOTAL.name
    with_deadline = f'{names.DEADLINE}!="{names.DEADLINE_NONE}"'
    per_task = (names.TASK, *(label for label in kept(al) if label not in MODEL_ROUTE))

    def share(labels: Sequence[str], metric: str, part: str, whole: Sequence[str] = ()) -> str:
        def rate(matchers: Sequence[str]) -> str:
            return f"sum by ({by(labels)}) (rate({selector(metric, [*scope, *matchers])}" \
                   f"[{window}]))"
        return f"{rate([part, *whole])}\n/ ({rate(whole)} > 0)"

    overruns = share(per_task, tasks, eq(names.DEADLINE, names.DEADLINE_EXCEEDED),
                     [with_deadline])
    truncated = share(kept(al), finish, eq(names.FINISH_REASON, names.FINISH_LENGTH))
    return [
        _alert(
            "LLMTaskDeadlineOverruns", TICKET,
            f"{overruns}\n> {num(al.task_deadline_overrun_share)}", w(TASK_FOR),
            "Agent task {{ $labels.task }} ends past its deadline",
            f"{_VALUE_PCT} of the runs of task {{{{ $labels.task }}}} that had a deadline "
            f"ended past it over the last {duration(TASK_WINDOW)} (alerting above "
            f"{percent(al.task_deadline_overrun_share)}): their callers gave up while LLM "
            f"calls went on generating.", config),
        _alert(
            "LLMTruncationRateHigh", TICKET,
            f"{truncated}\n> {num(al.truncation_share)}", w(TASK_FOR),
            f"LLM answers cut at max_tokens: {_WHERE}",
            f"{_VALUE_PCT} of the calls of {_WHERE} stopped at max_tokens (finish reason "
            f"length) over the last {duration(TASK_WINDOW)} (alerting above "
            f"{percent(al.truncation_share)}): users get cut answers.", config),
    ]


def _exporter_alerts(config: Config, w: _Windows) -> list[dict[str, Any]]:
    """The exporter's target gone, then its own losses (loss_alerts.py)."""
    al = config.alerting
    up = selector("up", scope_matchers(al))
    return [
        _alert(
            "TTFTExporterDown", TICKET, f"{up} == 0", w(300),
            "ttft-exporter target down: {{ $labels.instance }}",
            "Prometheus cannot scrape {{ $labels.instance }} of job {{ $labels.job }}: TTFT "
            "dashboards and alerts are blind for the processes behind it.", config),
        _alert(
            "TTFTExporterAbsent", TICKET, f"absent({up})", w(300),
            "ttft-exporter not scraped: no target matches " + up,
            f"Prometheus has no scrape target matching {up} (alerting.exporter_job and "
            f"alerting.selector): TTFT dashboards and alerts are blind.", config),
        *loss_alerts(config, _alert),
    ]


def alert_groups(config: Config) -> list[dict[str, Any]]:
    """Every alerting group, in every rule file: alerting_rules, then cause_rules' alerts."""
    return [*alerting_rules(config),
            *(group for group in cause_rules(config) if "alert" in group["rules"][0])]


def alert_names(config: Config) -> list[str]:
    """Every alert name the rules define, in order (for docs and tests)."""
    out: list[str] = []
    for group in alert_groups(config):
        for rule in group["rules"]:
            if rule["alert"] not in out:
                out.append(rule["alert"])
    return out
