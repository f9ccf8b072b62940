"""Panel builders for the generated dashboards, and the PromQL habits every panel shares.

Builders: one query, a time series, a share against its alert's limit, a stat, a heatmap (in
the histogram mode's buckets), a bar gauge, each with a link to the runbook section that
explains what it shows. `Queries`: the template-variable matchers, a
quantile only where calls were made (never NaN), 0 rather than nothing for counters, the top
(or bottom) 10 of a breakdown, the SLO attainment, budget and burn rate. What the dashboards
show is in dashboards.py; the grafanalib classes that render the panels are in grafana.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attr
from grafanalib import core

from .. import names, promql
from ..config.settings import Config
from ..promql import MODEL_ROUTE, HistogramMode, block, by, eq, num, regex, selector
from .grafana import BASE, BarGauge, BucketHeatmap, PromTarget, Row, Stat, TimeSeries, red_from

RATE = "$__rate_interval"
RANGE = "$__range"
INTERVAL = "$__interval"
ROW_HEIGHT = 8
#: At most this many series per panel: past it, a panel shows the top (or bottom) ones.
TOP = 10

Thresholds = list[dict[str, Any]]


def target(expr: str, legend: str = "", *, instant: bool = False,
           fmt: str = core.TIME_SERIES_TARGET_FORMAT) -> PromTarget:
    """A query; range queries over the buckets (classic or native) of a family with exemplars
    show them."""
    exemplar = not instant and any(f"{f.name}_bucket" in expr or f"{f.name}{{" in expr
                                   for f in names.WINDOWED)
    return PromTarget(expr=expr, legendFormat=legend, instant=instant, format=fmt,
                      exemplar=exemplar)


def _with_ref_ids(targets: Sequence[PromTarget]) -> list[PromTarget]:
    return [attr.evolve(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)]


def runbook_link(url: str) -> list[core.DataLink]:
    """The panel's link to its runbook section (opens in a new tab)."""
    return [core.DataLink(title="Runbook: what this shows, what to check",
                          linkUrl=url, isNewTab=True)]


def timeseries(title: str, description: str, targets: Sequence[PromTarget], unit: str,
               runbook: str, *, thresholds: Thresholds | None = None,
               stacked: bool = False) -> TimeSeries:
    return TimeSeries(
        title=title, description=description, targets=_with_ref_ids(targets), unit=unit,
        links=runbook_link(runbook), thresholds=thresholds or BASE,
        thresholdsStyleMode="line" if thresholds else "off",
        stacking={"group": "A", "mode": "normal"} if stacked else {"group": "A", "mode": "none"},
        fillOpacity=40 if stacked else 0, legendDisplayMode="table", legendPlacement="right",
        legendCalcs=["lastNotNull", "max"], tooltipMode="multi", tooltipSort="desc")


def stat(title: str, description: str, expr: str, legend: str, unit: str, runbook: str,
         thresholds: Thresholds) -> Stat:
    return Stat(title=title, description=description, links=runbook_link(runbook),
                targets=_with_ref_ids([target(expr, legend, instant=True)]), format=unit,
                color={"mode": "thresholds"}, decimals=2, thresholds=thresholds,
                reduceCalc="lastNotNull", graphMode="none", colorMode="background",
                noValue="no calls")


def heatmap(title: str, description: str, family: names.Family, matchers: Sequence[str],
            runbook: str, mode: HistogramMode) -> BucketHeatmap:
    bucketed = target(mode.bucket_increase(family, matchers, RATE), mode.bucket_legend,
                      fmt="heatmap")
    return BucketHeatmap(title=title, description=description, thresholds=BASE,
                         links=runbook_link(runbook), targets=_with_ref_ids([bucketed]))


def share_panel(title: str, description: str, share: str, legend: str, runbook: str,
                limit: float) -> TimeSeries:
    """The top 10 of a share, with its alert's limit drawn as a red line."""
    return timeseries(title, description, [target(top(share), legend)], "percentunit",
                      runbook, thresholds=red_from(limit))


def bargauge(title: str, description: str, expr: str, legend: str, runbook: str,
             thresholds: Thresholds) -> BarGauge:
    return BarGauge(title=title, description=description, thresholds=thresholds,
                    links=runbook_link(runbook),
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


# --- queries ------------------------------------------------------------------------------


def rate(metric: str, matchers: Sequence[str], window: str = RATE) -> str:
    return f"rate({selector(metric, matchers)}[{window}])"


def sum_by(labels: Sequence[str], inner: str) -> str:
    return f"sum by ({by(labels)}) ({inner})"


def top(expr: str, k: int = TOP, bottom: bool = False) -> str:
    """The k highest (`bottom`: lowest) series of `expr` over the panel's whole range, drawn at
    every step: a time series panel of the top k never draws more than k lines.

    `topk` alone picks anew at each step (a "top 10" panel drew 11-19 lines over its range).
    Each series is ranked once, evaluated at the range's end (`@ end()`, on by default since
    Prometheus 2.33), and only the picked series are drawn. The highest rank by their peak over
    the range. The lowest (shares) rank by their last value: a share has a floor at 0 that
    every series touches while its window holds only a few calls, all uncached (each
    tenant's first ones, and any quiet spell), so ranking by the trough tied nearly every
    series at 0 and dropped the one that is low now.
    """
    kind, over = ("bottomk", "last_over_time") if bottom else ("topk", "max_over_time")
    pick = f"{kind}({k}, {over}({block(expr)}[{RANGE}:{INTERVAL}] @ end()))"
    return f"{block(expr)}\nand\n{pick}"


def top_now(expr: str, k: int = TOP, bottom: bool = False) -> str:
    """The k highest (lowest) series of `expr` at one instant: for instant panels (a stat, a
    bar gauge), which evaluate once."""
    return f"{'bottomk' if bottom else 'topk'}({k}, {expr})"


class Queries:
    """PromQL of one dashboard's panels: template-variable matchers, SLO scopes, runbook links.

    Records whether a query used `$tenant`, so the dashboard shows that variable only then.
    """

    def __init__(self, config: Config):
        self.config = config
        self.al = config.alerting
        self.scopes = promql.scopes(config)
        self.mode = promql.histogram_mode(config)
        self.uses_tenant = False

    def mr(self) -> list[str]:
        """$job (and alerting.selector), $model, $route."""
        extra = [self.al.selector] if self.al.selector else []
        return [regex("job", "$job"), *extra, regex(names.MODEL, "$model"),
                regex(names.ROUTE, "$route")]

    def vars(self, family: names.Family | None = None) -> list[str]:
        """`mr()` and, when the family carries it, $tenant (None: the requests counter)."""
        if family is None or self.config.family_has_tenant(family):
            self.uses_tenant = True
            return [*self.mr(), regex(names.TENANT, "$tenant")]
        return self.mr()

    def recorded(self) -> list[str]:
        """Matchers of the rules' recordings: $job when they keep it, $model, $route."""
        job = [regex("job", "$job")] if "job" in promql.kept(self.al) else []
        return [*job, regex(names.MODEL, "$model"), regex(names.ROUTE, "$route")]

    def runbook(self, section: str) -> str:
        return promql.runbook_url(self.al, section)

    def hrate(self, family: names.Family, part: str, matchers: Sequence[str]) -> str:
        """Per-second rate of a histogram's `count` or `sum` (classic or native)."""
        return self.mode.rate(family, part, matchers, RATE)

    def calls(self, labels: Sequence[str], family: names.Family | None = None) -> str:
        """Calls per second by `labels` (a family's count, or the requests counter)."""
        if family is None:
            return sum_by(labels, rate(names.REQUESTS_TOTAL, self.vars()))
        return sum_by(labels, self.hrate(family, "count", self.vars(family)))

    def where_calls(self, expr: str, labels: Sequence[str], family: names.Family,
                    matchers: Sequence[str] | None = None) -> str:
        """`expr` only where the family has values in the window: a quantile without calls
        is NaN, which Grafana draws as a gap or a false zero."""
        count = sum_by(labels, self.hrate(family, "count",
                                          self.vars(family) if matchers is None else matchers))
        return f"{expr}\nand on ({by(labels)}) {count} > 0"

    def quantile(self, q: float, family: names.Family, labels: Sequence[str],
                 matchers: Sequence[str] | None = None) -> str:
        m = self.vars(family) if matchers is None else matchers
        return self.where_calls(self.mode.quantile(q, family, labels, RATE, m), labels, family,
                                m)

    def quantiles(self, family: names.Family, qs: Sequence[float], legend: str = "",
                  matchers: Sequence[str] | None = None) -> list:
        """Quantiles of the selection (every selected model and route together)."""
        return [target(self.quantile(q, family, (), matchers),
                       f"p{num(q * 100)} {legend}".strip()) for q in qs]

    def top_quantile(self, q: float, family: names.Family, labels: Sequence[str] = MODEL_ROUTE,
                     matchers: Sequence[str] | None = None) -> str:
        return top(self.quantile(q, family, labels, matchers))

    def or_zero(self, expr: str, labels: Sequence[str] = MODEL_ROUTE) -> str:
        """`expr`, and 0 for every (model, route) with calls but no such event."""
        zero = f"0 * {self.calls(labels)}"
        return f"{block(expr)}\nor on ({by(labels)})\n{zero}"

    def attainment(self, sli: str, family: names.Family) -> str:
        """Share of calls that met objective `sli` over the selected range (worst 10)."""
        ratios = (promql.sli_good_ratio(sli, s, RANGE, self.vars(family)) for s in self.scopes)
        return top_now("\n  or\n".join(block(ratio) for ratio in ratios), bottom=True)

    def budget_left(self, sli: str) -> str:
        """The error budget left over the SLO period (0: exhausted), worst 10."""
        left = selector(promql.PERIOD_BUDGET_REMAINING, [eq("sli", sli), *self.recorded()])
        return top_now(f"clamp_min({left}, 0)", bottom=True)

    def burn(self, sli: str, window: int, k: int) -> str:
        record = promql.sli_record(window)
        per_scope = "\nor\n".join(
            f"{selector(record, [eq('sli', sli), eq('slo', s.id), *self.recorded()])} "
            f"/ {num(1 - getattr(s.slo, sli).target)}" for s in self.scopes)
        return top(per_scope, k)
