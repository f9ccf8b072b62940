"""PromQL and SLO policy shared by the generated rules and the dashboards.

A panel and an alert that answer the same question call the same builder here, so a threshold
or an SLO scope can never mean one thing on a panel and another in an alert. Only what both
read lives here: the SLI definitions and SLO scopes, the SLI ratios and quantiles, the names of
the recordings the dashboards read, and the page burn rates a panel draws as thresholds. The
rules themselves (and alert-only policy) are in alerts.py, the panels in dashboards.py. Every
metric name comes from exporter.names; the recording rules' own names follow Prometheus'
`level:metric:operation` convention and keep their nominal windows at any `window_scale`.

Two modes (`dashboards.histograms`), each a `HistogramMode` chosen once from the config
(`histogram_mode`): `classic` reads the `le` buckets, `native` the native histograms Prometheus
scrapes over protobuf (`histogram_quantile` / `histogram_count` / `histogram_sum` on the one
series) and, for SLO ratios, the exact SLO counts served beside them (`names.slo_calls_name`,
whose `le="+Inf"` series counts every call): the same division of exact counts as
`_bucket{le=...}` / `_count`, so both modes give the same ratios. Every query over a histogram
asks the mode for its series; nothing else tells the two apart.

SLO scopes: the first SLO entry is the default, later entries override it for a (model, route)
selector and the last matching entry wins (config.slo_for). Each entry's queries select its own
(model, route) pairs and drop, with `unless on (model, route)`, the pairs a later entry claims.

Rule scope (kubernetes-mixin style): every rule selects `job=~"<alerting.exporter_job>"` and
the extra matchers of `alerting.selector`, and keeps the labels of `alerting.group_by` (default
`job`) besides model and route, so two releases or services never record the same series.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from . import names
from .config.settings import SLO, AlertingConfig, Config

# --- policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BurnRate:
    """Alert when the error ratio spends budget `factor`× too fast over both windows (seconds)."""

    factor: float
    long: int
    short: int


#: Multi-window, multi-burn-rate page pairs of the Google SRE workbook for a 30-day budget
#: (the overview's burn-rate panel draws their factors; the ticket pairs are in alerts.py).
PAGE_BURN = (BurnRate(14.4, 3600, 300), BurnRate(6, 21600, 1800))
#: Every window an SLI ratio is recorded over (every burn-rate pair uses these).
SLI_WINDOWS: tuple[int, ...] = (300, 1800, 3600, 7200, 21600, 86400, 259200)
#: Window of the p99 the regression alerts compare (the per-tenant p99's is
#: `alerting.tenant_window_seconds`).
REGRESSION_WINDOW = 3600

#: Outcomes that spend the error objective: the provider's failures (names.PROVIDER_FAILURES);
#: the caller's own (a 4xx, its 429s, cancelling, abandoning) never do.
ERROR_OUTCOMES = names.PROVIDER_FAILURES

#: SLI kind -> histogram family whose SLO threshold is a bucket boundary.
LATENCY_SLIS: dict[str, names.Family] = dict(names.SLO_FAMILIES)
ERRORS_SLI = "errors"
SLIS: tuple[str, ...] = (*LATENCY_SLIS, ERRORS_SLI)

# --- building blocks --------------------------------------------------------------------------

MODEL_ROUTE = (names.MODEL, names.ROUTE)
_UNITS = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def duration(seconds: float) -> str:
    """Prometheus duration of `seconds` in the largest unit that divides it (1w, 90s, 250ms)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be at least 1 ms, got {seconds} s")
    for unit, size in _UNITS:
        if ms % (size * 1000) == 0:
            return f"{ms // (size * 1000)}{unit}"
    return f"{ms}ms"


def le(seconds: float) -> str:
    """The `le` label value the exporter serves for a bucket bound (prometheus_client format)."""
    return floatToGoString(seconds)


def num(x: float) -> str:
    """A number for PromQL or text without float noise (1 - 0.99 -> 0.01)."""
    return format(x, ".12g")


def percent(ratio: float) -> str:
    """A ratio as a percentage for text (0.995 -> 99.5%)."""
    return f"{num(ratio * 100)}%"


def eq(label: str, value: str) -> str:
    """An equality matcher."""
    return f"{label}={json.dumps(value)}"


def regex(label: str, value: str) -> str:
    """A regular-expression matcher."""
    return f"{label}=~{json.dumps(value)}"


def selector(metric: str, matchers: Iterable[str] = ()) -> str:
    """`metric{matchers}`, or the bare name without matchers."""
    found = list(matchers)
    return f"{metric}{{{', '.join(found)}}}" if found else metric


def scope_matchers(al: AlertingConfig) -> list[str]:
    """What every rule selects: the exporter's job (a name or a regular expression), and the
    extra matchers of `alerting.selector`."""
    return [regex("job", al.exporter_job), *([al.selector] if al.selector else [])]


def kept(al: AlertingConfig) -> tuple[str, ...]:
    """Labels every SLI, recording and alert keeps: model, route and `alerting.group_by`."""
    return (*MODEL_ROUTE, *(label for label in al.group_by if label not in MODEL_ROUTE))


def runbook_url(al: AlertingConfig, section: str) -> str:
    """The absolute link to a section of docs/runbooks.md (its GitHub-style anchor)."""
    anchor = re.sub(r"[^a-z0-9_ -]", "", section.lower()).replace(" ", "-")
    return f"{al.runbook_url}#{anchor}"


def by(labels: Sequence[str]) -> str:
    """A label list for `by (...)` and `on (...)`."""
    return ", ".join(labels)


def indent(text: str) -> str:
    """Indent every line by two spaces (nested PromQL stays readable in YAML and JSON)."""
    return "\n".join("  " + line for line in text.splitlines())


def block(expr: str) -> str:
    """`expr` in parentheses on lines of its own, indented: a nested operand."""
    return f"(\n{indent(expr)}\n)"


def over(window: str, offset: str = "") -> str:
    """A range `[window]`, shifted back by `offset` when one is given."""
    return f"[{window}] offset {offset}" if offset else f"[{window}]"


# --- histogram modes --------------------------------------------------------------------------


class HistogramMode(ABC):
    """The PromQL vocabulary of one histogram mode: which series hold a family's buckets,
    count, sum and SLO counts, and how a query reads them. Rules, panels and diagnose ask it
    rather than test the mode; a mode itself says only where a part lives and how it is read."""

    #: The mode's name in the config (`dashboards.histograms`).
    name: str
    #: Legend of a query per bucket (a heatmap's).
    bucket_legend: str

    def quantile(self, q: float, family: names.Family, labels: Sequence[str], window: str,
                 matchers: Sequence[str] = (), offset: str = "") -> str:
        """`histogram_quantile` of the family's buckets over `window`, aggregated by
        `labels`."""
        rates = self.bucket_rate(family, labels, window, matchers, offset)
        return f"histogram_quantile({num(q)}, {rates})"

    def bucket_rate(self, family: names.Family, labels: Sequence[str], window: str,
                    matchers: Sequence[str] = (), offset: str = "") -> str:
        """The rate of each of the family's buckets over `window`, aggregated by `labels`
        (classic: one row per `le`; native: one histogram per row)."""
        buckets = selector(self._series(family, "bucket"), matchers)
        return f"{self._sum_buckets(labels)} (rate({buckets}{over(window, offset)}))"

    def rate(self, family: names.Family, part: str, matchers: Sequence[str], window: str,
             offset: str = "") -> str:
        """Per-second rate of a histogram's `count` or `sum` over `window`."""
        series = selector(self._series(family, part), matchers)
        return self._read(part, f"rate({series}{over(window, offset)})")

    def presence(self, family: names.Family) -> str:
        """The series holding the family's count, which the other mode does not store:
        whether Prometheus stores this mode."""
        return self._series(family, "count")

    @abstractmethod
    def bucket_increase(self, family: names.Family, matchers: Sequence[str], window: str) -> str:
        """Calls per bucket over `window`, the selection summed (a heatmap's query)."""

    @abstractmethod
    def calls(self, family: names.Family) -> tuple[str, list[str]]:
        """The counter (and matchers) whose rate counts the family's calls, exactly."""

    @abstractmethod
    def met(self, family: names.Family) -> str:
        """The counter of the family's calls at or under an SLO threshold (select its `le`)."""

    @abstractmethod
    def _series(self, family: names.Family, part: str) -> str:
        """The series holding a histogram's `bucket`, `count` or `sum`."""

    @abstractmethod
    def _read(self, part: str, rate: str) -> str:
        """The rate of a `count` or `sum` from the rate of its series."""

    @abstractmethod
    def _sum_buckets(self, labels: Sequence[str]) -> str:
        """The aggregation that keeps `labels` and the buckets."""


class ClassicMode(HistogramMode):
    """Classic histograms: one `_bucket` series per `le`, `_count` and `_sum` beside them."""

    name, bucket_legend = "classic", "{{le}}"

    def bucket_increase(self, family: names.Family, matchers: Sequence[str], window: str) -> str:
        return f"sum by (le) (increase({selector(family.name + '_bucket', matchers)}[{window}]))"

    def calls(self, family: names.Family) -> tuple[str, list[str]]:
        return self._series(family, "count"), []

    def met(self, family: names.Family) -> str:
        return self._series(family, "bucket")

    def _series(self, family: names.Family, part: str) -> str:
        return f"{family.name}_{part}"

    def _read(self, part: str, rate: str) -> str:
        return rate

    def _sum_buckets(self, labels: Sequence[str]) -> str:
        return f"sum by ({by([*labels, 'le'])})"


class NativeMode(HistogramMode):
    """Native histograms: one series holds the buckets, count and sum (Grafana draws the
    buckets itself); the exact SLO counts served beside them count calls under a threshold."""

    name, bucket_legend = "native", ""

    def bucket_increase(self, family: names.Family, matchers: Sequence[str], window: str) -> str:
        return f"sum(increase({selector(family.name, matchers)}[{window}]))"

    def calls(self, family: names.Family) -> tuple[str, list[str]]:
        return names.slo_calls_name(family), [eq("le", "+Inf")]

    def met(self, family: names.Family) -> str:
        return names.slo_calls_name(family)

    def _series(self, family: names.Family, part: str) -> str:
        return family.name

    def _read(self, part: str, rate: str) -> str:
        return f"histogram_{part}({rate})"

    def _sum_buckets(self, labels: Sequence[str]) -> str:
        return f"sum by ({by(labels)})" if labels else "sum"


CLASSIC, NATIVE = ClassicMode(), NativeMode()
MODES: dict[str, HistogramMode] = {mode.name: mode for mode in (CLASSIC, NATIVE)}


def histogram_mode(config: Config) -> HistogramMode:
    """The mode the config's generated queries read (`dashboards.histograms`)."""
    return MODES[config.dashboards.histograms]


# --- SLO scopes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """The (model, route) pairs one SLO entry governs: its selector minus later matching entries."""

    id: str
    slo: SLO
    matchers: tuple[str, ...]
    excluded: tuple[tuple[str, ...], ...]
    mode: HistogramMode


def scopes(config: Config) -> list[Scope]:
    """One scope per SLO entry, default first; ids are `default` or the entry's selector."""
    out: list[Scope] = []
    seen: set[str] = set()
    for i, slo in enumerate(config.slos):
        excluded = tuple(_matchers(later) for later in config.slos[i + 1:]
                         if _may_overlap(slo, later))
        parts = [f"{label}={value}" for label, value in _selector(slo) if value]
        ident = "default" if i == 0 else ",".join(parts) or "all"
        if ident in seen:
            ident = f"{ident}#{i}"
        seen.add(ident)
        out.append(Scope(ident, slo, _matchers(slo), excluded, histogram_mode(config)))
    return out


def _selector(slo: SLO) -> tuple[tuple[str, str], ...]:
    return (names.MODEL, slo.model), (names.ROUTE, slo.route)


def _matchers(slo: SLO) -> tuple[str, ...]:
    return tuple(eq(label, value) for label, value in _selector(slo) if value)


def _may_overlap(a: SLO, b: SLO) -> bool:
    """False only when the two selectors name different values for the same label."""
    return all(not (x and y and x != y) for x, y in ((a.model, b.model), (a.route, b.route)))


def _claim(expr: str, scope: Scope, presence_metric: str, window: str) -> str:
    """`expr` restricted to the pairs `scope` governs (later entries' pairs removed)."""
    if not scope.excluded:
        return expr
    unless = "\n".join(
        f"unless on ({by(MODEL_ROUTE)}) present_over_time({selector(presence_metric, m)}[{window}])"
        for m in scope.excluded)
    return f"{block(expr)}\n{unless}"


# --- ratios and quantiles ---------------------------------------------------------------------


def sli_error_ratio(sli: str, scope: Scope, window: str, extra: Sequence[str] = (),
                    keep: Sequence[str] = MODEL_ROUTE) -> str:
    """Share of `scope`'s calls that missed objective `sli` over `window`, by `keep`.

    `extra` adds matchers (the rules' scope, the dashboards' template variables). The error
    SLI is 0, not empty, while a (model, route) has calls but no errors; with no calls in the
    window there is no value (never NaN). Clamped to [0, 1]: `rate()` extrapolates each counter
    to the window's edges on its own, and the two counters of a ratio apart (`_clamped`).
    """
    return _sli_ratio(sli, scope, window, extra, keep, good=False)


def sli_good_ratio(sli: str, scope: Scope, window: str, extra: Sequence[str] = (),
                   keep: Sequence[str] = MODEL_ROUTE) -> str:
    """Share of `scope`'s calls that met objective `sli` over `window`, by `keep`."""
    return _sli_ratio(sli, scope, window, extra, keep, good=True)


def sli_events(sli: str, mode: HistogramMode) -> tuple[str, list[str]]:
    """The counter (and matchers) whose rate counts an SLI's events: the family's calls in
    `mode` (HistogramMode.calls); for errors, the requests counter (every call)."""
    if sli == ERRORS_SLI:
        return names.REQUESTS_TOTAL, []
    return mode.calls(LATENCY_SLIS[sli])


def _sli_ratio(sli: str, scope: Scope, window: str, extra: Sequence[str],
               keep: Sequence[str], good: bool) -> str:
    m = [*scope.matchers, *extra]
    events, at_inf = sli_events(sli, scope.mode)
    total = f"sum by ({by(keep)}) (rate({selector(events, [*at_inf, *m])}[{window}]))"
    if sli == ERRORS_SLI:
        bad_sel = selector(names.REQUESTS_TOTAL,
                           [regex(names.OUTCOME, "|".join(ERROR_OUTCOMES)), *m])
        bad = f"sum by ({by(keep)}) (rate({bad_sel}[{window}]))"
        ratio = f"(\n  {bad}\n  or 0 * {total}\n)\n/ ({total} > 0)"
        expr = f"1 - {block(ratio)}" if good else ratio
        return _claim(_clamped(expr), scope, names.REQUESTS_TOTAL, window)
    threshold = eq("le", le(getattr(scope.slo, sli).threshold_seconds))
    met_sel = selector(scope.mode.met(LATENCY_SLIS[sli]), [threshold, *m])
    met = f"sum by ({by(keep)}) (rate({met_sel}[{window}]))"
    ratio = f"{met}\n/ ({total} > 0)"
    expr = ratio if good else f"1 - {block(ratio)}"
    return _claim(_clamped(expr), scope, events, window)


def _clamped(ratio: str) -> str:
    """`ratio` held within [0, 1].

    A share of calls cannot leave [0, 1], but a ratio of two `rate()`s can: each counter is
    extrapolated to the window's start on its own, no further back than where its line reaches
    zero, and past 1.1 sample intervals by half an interval instead. So the part, whose first
    value is smaller against its increase, can be stretched further than the whole: a bucket
    first seen at 1 and a count at 3, each up by one good call in the window, read a share of
    4/3 (alerts/tests/slo_burn.yaml). Only a series born in the window, or after missed
    scrapes, does that; the clamp reads it as "no error" instead of a negative error ratio and
    a budget above 100 %.
    """
    return f"clamp(\n{indent(ratio)},\n  0, 1\n)"


def outcome_ratio(outcome: str, scope: Scope, window: str, extra: Sequence[str] = (),
                  keep: Sequence[str] = MODEL_ROUTE) -> str:
    """Share of `scope`'s calls that ended with `outcome` over `window`, by `keep`."""
    m = [*scope.matchers, *extra]
    part = selector(names.REQUESTS_TOTAL, [eq(names.OUTCOME, outcome), *m])
    total = selector(names.REQUESTS_TOTAL, m)
    expr = (f"sum by ({by(keep)}) (rate({part}[{window}]))\n"
            f"/ (sum by ({by(keep)}) (rate({total}[{window}])) > 0)")
    return _claim(expr, scope, names.REQUESTS_TOTAL, window)


# --- recording rule names ---------------------------------------------------------------------


def sli_record(window_seconds: float) -> str:
    """Name of the SLI error-ratio recording (labels: model, route, the kept labels, sli, slo
    and Sloth's sloth_id, sloth_service, sloth_slo)."""
    return f"slo:sli_error:ratio_rate{duration(window_seconds)}"


#: Sloth's names of the budget recordings, per SLI and SLO scope (alerts.py records them).
PERIOD_BUDGET_REMAINING = "slo:period_error_budget_remaining:ratio"
PERIOD_BURN_RATE = "slo:period_burn_rate:ratio"
CURRENT_BURN_RATE = "slo:current_burn_rate:ratio"


@dataclass(frozen=True)
class Names:
    """Names of the latency recording rules; nominal durations (from the unscaled config)."""

    ttft_p99: str
    ttft_p99_baseline: str
    connect_p99: str
    connect_p99_baseline: str
    tenant_p99: str
    tenant_p99_baseline: str
    tenant_p99_rise: str
    tenants_degraded_ratio: str

    @classmethod
    def of(cls, al: AlertingConfig) -> Names:
        reg, ten = duration(REGRESSION_WINDOW), duration(al.tenant_window_seconds)
        reg_off = duration(al.regression_offset_seconds)
        ten_off = duration(al.tenant_baseline_offset_seconds)
        ttft, phase = names.TTFT.name, names.PHASE_FAMILY.name
        return cls(
            ttft_p99=f"model_route:{ttft}:p99_rate{reg}",
            ttft_p99_baseline=f"model_route:{ttft}:p99_rate{reg}_offset{reg_off}",
            connect_p99=f"model_route_phase:{phase}:p99_rate{reg}",
            connect_p99_baseline=f"model_route_phase:{phase}:p99_rate{reg}_offset{reg_off}",
            tenant_p99=f"model_route_tenant:{ttft}:p99_rate{ten}",
            tenant_p99_baseline=f"model_route_tenant:{ttft}:p99_rate{ten}_offset{ten_off}",
            tenant_p99_rise=f"model_route_tenant:{ttft}:p99_rate{ten}_vs_offset{ten_off}",
            tenants_degraded_ratio=f"model_route:{ttft}:tenants_degraded_ratio",
        )
