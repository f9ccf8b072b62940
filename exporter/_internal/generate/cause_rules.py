"""The rules of causes.py's decision: the signals recorded, the decision recorded per cause,
and the `LLMTTFTLikelyCause` alert that names it.

The signals are recorded over `alerting.tenant_window_seconds` (default 5m) now and the same
window `alerting.tenant_baseline_offset_seconds` (default 1h) earlier, the comparison the
tenant alerts already make. Each condition is `causes.classify` written in PromQL with the
same `Thresholds`; tests/test_incident_day.py checks that the alert and `ttft-exporter
diagnose` name the same cause on every incident, and alerts/tests/causes.yaml each cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .. import names
from ..config.settings import AlertingConfig, Config
from ..diagnose.causes import (CAUSES, COLD_CACHE, CONNECT, DEFAULT, IDENTITY, NOISY_NEIGHBOUR,
                               PREFILL, PREFILL_SURGE, ROUTE_CHANGE, RUNBOOK, SIGNALS_BY_KEY,
                               SPREAD_IN_SD, UNKNOWN, Signal, Thresholds)
from ..promql import by, duration, eq, histogram_mode, kept, num, scope_matchers, selector

#: The recorded decision: one series per degraded (model, route), label `cause`.
LIKELY_CAUSE = "model_route:llm_client_time_to_first_token_seconds:likely_cause"

#: What on-call is told per cause (README's table, issue 14), for the alert's description.
TOLD = {
    PREFILL_SURGE: "TTFT rose with prompt size on route {{ $labels.route }}: input tokens per "
                   "call and the prefill phase are up; decode is normal.",
    COLD_CACHE: "The prompt cache of tenant {{ $labels.tenant }} went cold (after idling?): its "
                "cached share of input tokens fell and its TTFT rose; other tenants' did not.",
    NOISY_NEIGHBOUR: "Every tenant of model {{ $labels.model }} stalls mid-stream at once: a "
                     "noisy neighbour in the provider's batch, not your prompts.",
    ROUTE_CHANGE: "Traffic for model {{ $labels.model }} now goes somewhere else: a new "
                  "upstream (address, region or fingerprint) or a slower connect; model time "
                  "is unchanged.",
    UNKNOWN: "TTFT rose but the signals fit none of the four known failure modes: check the "
             "client side (CPU, event loop) and the provider's status.",
}


def thresholds(al: AlertingConfig) -> Thresholds:
    """The decision's thresholds under this config: its minimum of calls."""
    return replace(DEFAULT, min_calls=al.min_calls)


def _name(key: str, window: str, offset: str = "") -> str:
    """Recording name of a signal: `level:metric:operation` with its nominal window."""
    s = SIGNALS_BY_KEY[key]
    level = ("model" if s.per_model else "model_route") + ("_tenant" if s.tenant else "") + \
        ("_phase" if s.phase else "")
    metric = s.family.name if s.family is not None else names.USAGE_CACHED_INPUT_TOKENS
    op = {"calls": "calls", "mean": "mean", "spread": "p10_p90_spread",
          "cached_share": "cached_share", "cached_per_call": "cached_per_call"}[s.kind]
    return f"{level}:{metric}:{op}{window}{f'_offset{offset}' if offset else ''}"


class SignalNames:
    """The nominal names of this config's signal recordings (now and baseline)."""

    def __init__(self, al: AlertingConfig):
        self.window = duration(al.tenant_window_seconds)
        self.offset = duration(al.tenant_baseline_offset_seconds)
        self.upstream = (f"model_route:{names.UPSTREAM_REQUESTS.removesuffix('_total')}:"
                         f"new_share{self.window}_vs_offset{self.offset}")

    def now(self, key: str) -> str:
        return _name(key, self.window)

    def base(self, key: str) -> str:
        return _name(key, self.window, self.offset)


def signal_records(config: Config) -> list[dict[str, Any]]:
    """Every signal of causes.SIGNALS over the window now and at the baseline offset, and the
    share of each (model, route)'s calls to an upstream unseen at the baseline."""
    al = config.alerting
    scale = al.window_scale
    window = duration(al.tenant_window_seconds * scale)
    offset = duration(al.tenant_baseline_offset_seconds * scale)
    matchers, keep, n = scope_matchers(al), kept(al), SignalNames(al)
    mode = histogram_mode(config)
    out = []
    for key, signal in SIGNALS_BY_KEY.items():
        if not signal.in_rules:
            continue
        windows = ((n.now(key), ""), (n.base(key), offset))
        for name, shift in windows if _has_baseline(signal) else windows[:1]:
            out.append({"record": name,
                        "expr": signal.expr(window, matchers, keep, shift, mode=mode)})
    out.append({"record": n.upstream,
                "expr": new_upstream_share(window, window, offset, matchers, keep)})
    return out


def new_upstream_share(window: str, baseline: str, baseline_offset: str,
                       matchers: Sequence[str], keep: Sequence[str]) -> str:
    """Share of the calls over `window` by `keep` (a model and route) that reached an upstream
    identity with no calls over the `baseline` window that ends `baseline_offset` before the
    evaluation time (diagnose reads it in diagnose/upstreams.py). 0, not empty, when every
    upstream is known; empty without calls."""
    upstream = selector(names.UPSTREAM_REQUESTS, matchers)
    seen = f"increase({upstream}[{baseline}] offset {baseline_offset}) > 0"
    calls = f"increase({upstream}[{window}])"
    total = f"sum by ({by(keep)}) ({calls})"
    new = (f"sum by ({by(keep)}) (\n  {calls}\n  unless on ({by([*keep, *IDENTITY])})\n"
           f"  {seen}\n)")
    return f"(\n{new}\nor 0 * {total}\n)\n/ ({total} > 0)"


def _has_baseline(signal: Signal) -> bool:
    """The decision reads every signal's baseline but a tenant's own calls and TTFT (a
    tenant's baseline on one route is a handful of calls, if any)."""
    return not signal.tenant or (signal.per_model and signal.kind != "calls")


def decision_records(config: Config) -> list[dict[str, Any]]:
    """The decision per (model, route): one `LIKELY_CAUSE` series labelled with its cause
    (and, for a cold cache, one per cold tenant)."""
    al = config.alerting
    t = thresholds(al)
    n, keep = SignalNames(al), kept(al)
    mine = scope_matchers(al)[:1] if "job" in keep else []
    on = f"on ({by(keep)})"

    def now(key: str, *extra: str) -> str:
        return selector(n.now(key), [*mine, *extra])

    def base(key: str, *extra: str) -> str:
        return selector(n.base(key), [*mine, *extra])

    def rose(key: str, factor: float, floor: float, *extra: str) -> str:
        a, b = now(key, *extra), base(key, *extra)
        return f"({a} >= {num(factor)} * {b})\nand ({a} - {b} >= {num(floor)})"

    def variance(of: Callable[..., str], spread: str, *extra: str) -> str:
        """A window's variance of the mean, from its spread (0 without buckets to read)."""
        value = f"sum by ({by(keep)}) ({of(spread, *extra)})" if extra else of(spread)
        return (f"(({value} or {on} 0 * {of('calls')}) / {num(SPREAD_IN_SD)}) ^ 2\n"
                f"/ {of('calls')}")

    def clearly(key: str, spread: str, *extra: str) -> str:
        """causes.standard_error: the rise by degraded_z standard errors of the difference of
        the means (a phase's summed over its one `extra` phase)."""
        a, b = ((f"sum by ({by(keep)}) ({of(key, *extra)})" for of in (now, base)) if extra
                else (now(key), base(key)))
        return (f"({a} - {b} >= {num(t.degraded_z)} * sqrt(\n"
                f"{variance(now, spread, *extra)}\n+ {variance(base, spread, *extra)}\n))")

    def rose_clearly(key: str, factor: float, floor: float) -> str:
        """causes._rose_clearly: the rise past `factor`, `floor` and degraded_z standard
        errors."""
        return f"{rose(key, factor, floor)}\nand {clearly(key, f'{key}_spread')}"

    enough = (f"({now('calls')} >= {t.min_calls})\nand {on} ({base('calls')} >= {t.min_calls})")
    slower = (f"({rose_clearly('ttft', t.degraded_factor, t.degraded_min_seconds)})\nor\n"
              f"({rose_clearly('first_answer', t.degraded_factor, t.degraded_min_seconds)})")
    # A tenant's TTFT now against its (model, route)'s baseline (causes.slower_tenants).
    group = f"{on} group_left ()"
    tenant_slower = (
        f"({now('tenant_calls')} >= {t.tenant_min_calls})\n"
        f"and ({now('tenant_ttft')} >= {group} ({num(t.degraded_factor)} * {base('ttft')}))\n"
        f"and ({now('tenant_ttft')} - {group} {base('ttft')} >= "
        f"{num(t.degraded_min_seconds)})")
    tenant_cold = (f"({base('cached_share')} - {now('cached_share')} >= {num(t.cache_drop)})\n"
                   f"and ({now('cached_share')} <= {num(t.cache_ratio)} * "
                   f"{base('cached_share')})\n"
                   f"and ({now('cached_per_call')} <= {num(t.cache_ratio)} * "
                   f"{base('cached_per_call')})\n"
                   f"and ({now('tenant_model_calls')} >= {t.cold_min_calls})")
    model_tenant = [*(label for label in keep if label != names.ROUTE), names.TENANT]
    # "its TTFT rose, others' did not": at most half of the compared tenants (or one) slower.
    compared = f"count by ({by(keep)}) ({now('tenant_calls')} >= {t.tenant_min_calls})"
    few = (f"count by ({by(keep)}) (\n{tenant_slower}\n)\n<= {on}\n"
           f"clamp_min(0.5 * {compared}, 1)")
    cold_slower = (f"({tenant_slower})\nand on ({by(model_tenant)})\n({tenant_cold})\n"
                   f"and {on}\n({few})")
    cold = f"count by ({by(keep)}) (\n{cold_slower}\n)"
    degraded = f"(\n({slower})\nor\n{cold}\n)\nand {on}\n({enough})"
    phase = eq(names.PHASE, CONNECT)
    connect_rose = rose("phase", t.connect_factor, t.connect_min_seconds, phase)
    connect = (f"sum by ({by(keep)}) ({connect_rose})\n"
               f"and {on}\n{clearly('phase', 'phase_spread', phase)}")
    pre = eq(names.PHASE, PREFILL)
    conditions: dict[str, Callable[[], str]] = {
        PREFILL_SURGE: lambda: (
            f"({rose_clearly('input_tokens', t.input_factor, 0.0)})\n"
            f"and {on}\nsum by ({by(keep)}) ({rose('phase', t.prefill_factor, 0.0, pre)})\n"
            # in proportion: the prefill grew at most prefill_excess x as much as the prompts
            f"and {on}\n(sum by ({by(keep)}) ({now('phase', pre)})\n"
            f"/ sum by ({by(keep)}) ({base('phase', pre)})\n"
            f"<= {on} {num(t.prefill_excess)} * ({now('input_tokens')} / "
            f"{base('input_tokens')}))"),
        NOISY_NEIGHBOUR: lambda: rose("stall", t.stall_factor, t.stall_min_seconds),
    }
    out: list[dict[str, Any]] = []
    earlier: list[str] = []
    for cause in CAUSES:
        if cause == UNKNOWN:
            expr = f"(\n{degraded}\n)"
        elif cause == COLD_CACHE:  # one series per cold tenant: the page names it
            expr = f"(\n{cold_slower}\n)\nand {on}\n(\n{degraded}\n)"
        elif cause == ROUTE_CHANGE:  # a new upstream of the model, or its connect phase up
            # (the connect alone only where no cold cache or prompt surge explains it: longer
            # calls hold more connections open, and new ones cost a connect)
            others = "".join(f"\nunless {on}\n(\n{condition}\n)" for condition in (
                cold, conditions[PREFILL_SURGE]()))
            expr = (f"(\n(\n{degraded}\n)\nand {on}\n"
                    f"({selector(n.upstream, mine)} >= {num(t.new_upstream_share)})\nor\n"
                    f"(\n{degraded}\n)\nand {on}\n({connect}){others}\n)")
        else:
            expr = f"(\n{degraded}\n)\nand {on}\n(\n{conditions[cause]()}\n)"
        for prior in earlier:
            expr += f"\nunless {on}\n{selector(LIKELY_CAUSE, [*mine, eq('cause', prior)])}"
        out.append({"record": LIKELY_CAUSE, "labels": {"cause": cause},
                    "expr": f"0 * (\n{expr}\n) + 1"})
        earlier.append(cause)
    return out


def cause_alerts(config: Config, alert: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """`LLMTTFTLikelyCause`, one rule per cause (label `cause`), each telling on-call what
    that cause means; `alert` is alerts._alert."""
    al = config.alerting
    keep = kept(al)
    mine = scope_matchers(al)[:1] if "job" in keep else []
    n = SignalNames(al)
    where = "model {{ $labels.model }} on route {{ $labels.route }}"
    out = []
    for cause in CAUSES:
        rule = alert(
            "LLMTTFTLikelyCause", "ticket", selector(LIKELY_CAUSE, [*mine, eq("cause", cause)]),
            duration(120 * al.window_scale), f"TTFT up on {where}: likely {cause}",
            f"{TOLD[cause]} Decided from the last {n.window} against the same window "
            f"{n.offset} earlier (ttft-exporter diagnose gives the numbers; the runbook section "
            f"{RUNBOOK[cause]!r} what to do).", config)
        rule["labels"]["cause"] = cause
        out.append(rule)
    return out
