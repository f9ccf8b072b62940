"""Prometheus recording and alerting rules, generated from the SLO config.

The PromQL, the SLI definitions, the SLO scopes and the names of the recordings the dashboards
read come from promql.py, which the dashboards use too; this module holds the rules and the
policy only alerts read (ticket burn rates, severities, `for` durations, texts). Each SLO
entry's rules carry its scope as label `slo` (promql.scopes). Recording-rule windows, offsets
and `for` durations scale with `alerting.window_scale`; recording-rule names do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import names
from .config import AlertingConfig, Config
from .promql import (ERRORS_SLI, MODEL_ROUTE, PAGE_BURN, REGRESSION_WINDOW, SLI_WINDOWS, SLIS,
                     TENANT_WINDOW, BurnRate, Names, Scope, by, duration, eq, indent, num,
                     outcome_ratio, percent, quantile, scopes, selector, sli_error_ratio,
                     sli_record)

# --- alert-only policy ------------------------------------------------------------------------

#: Ticket pairs of the SRE workbook's multi-window burn rates (the page pairs, which a panel
#: draws, are promql.PAGE_BURN).
TICKET_BURN = (BurnRate(3, 86400, 7200), BurnRate(1, 259200, 21600))
#: Stalls and timeouts are symptoms, not objectives of their own: a single window pair, ticket.
STALL_BURN = BurnRate(6, 3600, 300)
TIMEOUT_BURN = BurnRate(3, 3600, 300)

#: The network phase (DNS, TCP, TLS) whose regression means a route or region change.
CONNECT_PHASE = "connect"

PAGE, TICKET = "page", "ticket"


# --- rules ------------------------------------------------------------------------------------


class _Windows:
    """Nominal durations -> the (possibly scaled) PromQL durations of this config."""

    def __init__(self, al: AlertingConfig):
        self.scale = al.window_scale

    def __call__(self, seconds: float) -> str:
        return duration(seconds * self.scale)


def recording_rules(config: Config) -> list[dict[str, Any]]:
    """Rule groups: SLI error ratios per scope/SLI/window, then the latency baselines."""
    w = _Windows(config.alerting)
    sli_rules = [
        {"record": sli_record(window), "expr": sli_error_ratio(sli, scope, w(window)),
         "labels": {"sli": sli, "slo": scope.id}}
        for scope in scopes(config) for sli in SLIS for window in SLI_WINDOWS
    ]
    return [
        {"name": "ttft-exporter-records-sli", "rules": sli_rules},
        {"name": "ttft-exporter-records-latency", "rules": _latency_records(config, w)},
    ]


def _latency_records(config: Config, w: _Windows) -> list[dict[str, Any]]:
    al, n = config.alerting, Names.of(config.alerting)
    reg, reg_off = w(REGRESSION_WINDOW), w(al.regression_offset_seconds)
    ten, ten_off = w(TENANT_WINDOW), w(al.tenant_baseline_offset_seconds)
    connect = [eq(names.PHASE, CONNECT_PHASE)]
    phase_by = (*MODEL_ROUTE, names.PHASE)
    tenant_by = (*MODEL_ROUTE, names.TENANT)

    def tenant_p99(offset: str) -> str:
        # Only tenants with calls in the window: an idle tenant's quantile is NaN, and counting
        # it would dilute the share of degraded tenants.
        shift = f" offset {offset}" if offset else ""
        calls = (f"sum by ({by(tenant_by)}) "
                 f"(rate({names.TTFT.name}_count[{ten}]{shift})) > 0")
        return f"{quantile(0.99, names.TTFT, tenant_by, ten, offset=offset)}\nand\n{calls}"

    return [
        {"record": n.ttft_p99, "expr": quantile(0.99, names.TTFT, MODEL_ROUTE, reg)},
        {"record": n.ttft_p99_baseline,
         "expr": quantile(0.99, names.TTFT, MODEL_ROUTE, reg, offset=reg_off)},
        {"record": n.connect_p99,
         "expr": quantile(0.99, names.PHASE_FAMILY, phase_by, reg, connect)},
        {"record": n.connect_p99_baseline,
         "expr": quantile(0.99, names.PHASE_FAMILY, phase_by, reg, connect, offset=reg_off)},
        {"record": n.tenant_p99, "expr": tenant_p99("")},
        {"record": n.tenant_p99_baseline, "expr": tenant_p99(ten_off)},
        {"record": n.tenant_p99_rise, "expr": f"{n.tenant_p99}\n/ {n.tenant_p99_baseline}"},
        # sum / count rather than avg: exact, where avg's running mean depends on series order.
        {"record": n.tenants_degraded_ratio,
         "expr": (f"sum by ({by(MODEL_ROUTE)}) "
                  f"({n.tenant_p99_rise} > bool {num(al.tenant_degraded_factor)})\n"
                  f"/ count by ({by(MODEL_ROUTE)}) ({n.tenant_p99_rise})")},
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


def _alert(name: str, severity: str, expr: str, for_: str, summary: str, description: str,
           config: Config, scope: Scope | None = None) -> dict[str, Any]:
    """One alerting rule; per-SLO-scope rules carry the scope as label `slo`, which keeps rules
    of the same name distinct (promtool rejects duplicates)."""
    labels = {"severity": severity} if scope is None else {"severity": severity, "slo": scope.id}
    return {
        "alert": name, "expr": expr, "for": for_, "labels": labels,
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": f"{config.alerting.runbook_url}#{name.lower()}"},
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
    ERRORS_SLI: ("Request", "ended without an error or a timeout"),
}


def _burn_alert(name: str, severity: str, sli: str, scope: Scope,
                pairs: Sequence[BurnRate], w: _Windows, config: Config) -> dict[str, Any]:
    """Alert when the error ratio exceeds factor × budget over both windows of any pair.

    The value is the burn rate over the long window of the matching pair, so the description
    can print it (Prometheus templates have no arithmetic).
    """
    objective = getattr(scope.slo, sli)
    budget = num(1 - objective.target)
    label_sel = [eq("sli", sli), eq("slo", scope.id)]

    def over(window: int, factor: float) -> str:
        return f"{selector(sli_record(window), label_sel)} / {budget} > {num(factor)}"

    branches = [f"(\n  {over(p.long, p.factor)}\nand\n  {over(p.short, p.factor)}\n)"
                for p in pairs]
    title, met = _BURN_TEXT[sli]
    threshold = objective.threshold_seconds
    goal = met.format(threshold=f"{num(threshold)}s" if threshold is not None else "")
    rule = " or ".join(f"{num(p.factor)}× over {duration(p.long)} and {duration(p.short)}"
                       for p in pairs)
    return _alert(
        name, severity, "\nor\n".join(branches), w(_BURN_FOR[severity]),
        f"{title} error budget burning: {_WHERE}",
        f"The objective is that {percent(objective.target)} of calls {goal} (SLO {scope.id}). "
        f"Calls of {_WHERE} spend the error budget {_VALUE_1F}× as fast "
        f"as sustainable over the long window (alerting at {rule}).", config, scope)


def _timeout_alert(scope: Scope, w: _Windows, config: Config) -> dict[str, Any]:
    budget = 1 - scope.slo.errors.target
    limit = num(TIMEOUT_BURN.factor * budget)

    def over(window: int) -> str:
        return f"(\n{indent(outcome_ratio(names.TIMEOUT, scope, w(window)))}\n) > {limit}"

    return _alert(
        "LLMTimeoutRateHigh", TICKET,
        f"{over(TIMEOUT_BURN.long)}\nand\n{over(TIMEOUT_BURN.short)}", w(900),
        f"LLM calls timing out: {_WHERE}",
        f"{_VALUE_PCT} of the calls of {_WHERE} timed out over the "
        f"last {duration(TIMEOUT_BURN.long)} (alerting above {percent(float(limit))}, "
        f"{num(TIMEOUT_BURN.factor)}× the error budget of SLO {scope.id}, over "
        f"{duration(TIMEOUT_BURN.long)} and {duration(TIMEOUT_BURN.short)}).", config, scope)


def _query_value(metric: str, extra_labels: Sequence[str] = ()) -> str:
    """Template snippet printing `metric` for the alert's model/route as a duration."""
    labels = [f"{label}=%q" for label in (*MODEL_ROUTE, *extra_labels)]
    args = " ".join(f"$labels.{label}" for label in (*MODEL_ROUTE, *extra_labels))
    return (f'{{{{ with printf "{metric}{{{",".join(labels)}}}" {args} | query }}}}'
            f"{{{{ . | first | value | humanizeDuration }}}}{{{{ end }}}}")


def _latency_alerts(config: Config, w: _Windows) -> list[dict[str, Any]]:
    al, n = config.alerting, Names.of(config.alerting)
    reg, off = duration(REGRESSION_WINDOW), duration(al.regression_offset_seconds)
    factor, floor = num(al.regression_factor), num(al.regression_min_seconds)
    ten_off, rise = duration(al.tenant_baseline_offset_seconds), num(al.tenant_degraded_factor)
    many = (f"(\n  {n.tenants_degraded_ratio} >= {num(al.many_tenants_share)}\n"
            f"  and\n  count by ({by(MODEL_ROUTE)}) ({n.tenant_p99_rise}) "
            f">= {al.many_tenants_min}\n)")

    def regression(now: str, then: str) -> str:
        return f"{now} / {then} > {factor}\nand\n{now} - {then} > {floor}"

    return [
        _alert(
            "LLMTTFTP99Regression", TICKET, regression(n.ttft_p99, n.ttft_p99_baseline),
            w(1800), f"TTFT p99 regressed against last week: {_WHERE}",
            f"TTFT p99 of {_WHERE} over the last {reg} is {_query_value(n.ttft_p99)}, "
            f"{_VALUE_2F}× its value {off} ago "
            f"(alerting above {factor}× and {floor}s slower).", config),
        _alert(
            "LLMConnectPhaseRegression", TICKET,
            regression(n.connect_p99, n.connect_p99_baseline), w(1800),
            f"Connect phase slower than last week: {_WHERE}",
            f"p99 of the connect phase (DNS, TCP, TLS) of {_WHERE} over the last {reg} is "
            f"{_query_value(n.connect_p99, [names.PHASE])}, {_VALUE_2F}× "
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
            f"{n.tenant_p99_rise} > {rise}\nunless on ({by(MODEL_ROUTE)})\n{many}", w(900),
            "TTFT rose for tenant {{ $labels.tenant }} only: " + _WHERE,
            f"TTFT p99 of tenant {{{{ $labels.tenant }}}} on {_WHERE} is "
            f"{_query_value(n.tenant_p99, [names.TENANT])}, {_VALUE_2F}× "
            f"its p99 {ten_off} ago (alerting above {rise}×), while most other tenants of the "
            f"same model and route are not slower: look at this tenant's prompts and prompt "
            f"cache.", config),
    ]


#: Window of the agent-task and truncation alerts' shares, and how long they must hold.
TASK_WINDOW, TASK_FOR = 1800, 900


def _task_alerts(config: Config, w: _Windows) -> list[dict[str, Any]]:
    """Agent tasks past their deadline, and calls cut at max_tokens (agent_dashboard.py)."""
    al, window = config.alerting, w(TASK_WINDOW)
    tasks, finish = names.TASKS_TOTAL.name, names.FINISH_REASONS_TOTAL.name
    with_deadline = f'{names.DEADLINE}!="{names.DEADLINE_NONE}"'

    def share(labels: Sequence[str], metric: str, part: str, whole: str = "") -> str:
        def rate(m: str) -> str:
            return f"sum by ({by(labels)}) (rate({metric}{{{m}}}[{window}]))" if m else \
                f"sum by ({by(labels)}) (rate({metric}[{window}]))"
        return f"{rate(part)}\n/ {rate(whole)}"

    overruns = share([names.TASK], tasks, eq(names.DEADLINE, names.DEADLINE_EXCEEDED),
                     with_deadline)
    truncated = share(MODEL_ROUTE, finish, eq(names.FINISH_REASON, names.FINISH_LENGTH))
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
    job_name = config.alerting.exporter_job
    job = [eq("job", job_name)]
    per = "{{ $labels.model }} / {{ $labels.route }}"
    rules = [
        _alert(
            "TTFTExporterDown", TICKET, f"{selector('up', job)} == 0", w(300),
            "ttft-exporter target down: {{ $labels.instance }}",
            f"Prometheus cannot scrape {{{{ $labels.instance }}}} of job {job_name}: TTFT "
            f"dashboards and alerts are blind for the processes behind it.", config),
        _alert(
            "TTFTExporterAbsent", TICKET, f"absent({selector('up', job)})", w(300),
            f"ttft-exporter not scraped: no target of job {job_name}",
            f"Prometheus has no scrape target of job {job_name} (alerting.exporter_job): "
            f"TTFT dashboards and alerts are blind.", config),
        _alert(
            "TTFTExporterDroppingSamples", TICKET,
            f"sum by (job, instance, {names.REASON}) (rate({names.SELF_DROPS}[{w(600)}])) > 0",
            w(600), "ttft-exporter drops samples ({{ $labels.reason }}): {{ $labels.instance }}",
            f"{{{{ $labels.instance }}}} drops {_VALUE_2F} samples per second for reason "
            f"{{{{ $labels.reason }}}}: the metrics undercount.", config),
    ]
    # With an allowlist, folding every other tenant is the configured behaviour, not a problem.
    if config.labels.tenant_policy != "allowlist":
        rules.append(_alert(
            "TTFTExporterTenantFolding", TICKET,
            f"sum by (job, instance, {by(MODEL_ROUTE)}) "
            f"(rate({names.SELF_TENANT_FOLDS}[{w(900)}])) > 0", w(900),
            f"Tenants folded into {names.OTHER_TENANT}: {per}",
            f"{_VALUE_2F} calls per second of {per} are recorded under tenant "
            f"{names.OTHER_TENANT} on {{{{ $labels.instance }}}}: the model and route have more "
            f"than labels.max_tenants ({config.labels.max_tenants}) tenants, so per-tenant "
            f"panels and the tenant alerts no longer see all of them.", config))
    return rules


def alert_names(config: Config) -> list[str]:
    """Every alert name the rules define, in order (for docs and tests)."""
    out: list[str] = []
    for group in alerting_rules(config):
        for rule in group["rules"]:
            if rule["alert"] not in out:
                out.append(rule["alert"])
    return out
