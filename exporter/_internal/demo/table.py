"""The demo's terminal table: what the exporter itself knows, per model and route.

Each column says its window: quantiles come from the same sliding-window HDR slices `/metrics`
serves (the last `window.seconds`, merged across tenants, exact to HDR precision); the request
rate from the requests counter since the previous table. `summary()` is printed at exit: the
whole run, from the cumulative histograms and counters.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

from .. import names
from ..record.histogram import Histogram, WindowPart, part_count, quantiles_of
from ..record.recorder import US_PER_SECOND, Recorder

QUANTILES = (0.5, 0.9, 0.99)
_ROW = "{:<14}{:<11}{:>9}{:>8}{:>8}{:>11}{:>8}"


class TerminalTable:
    def __init__(self, recorder: Recorder, window_seconds: float):
        self.recorder = recorder
        self.window_seconds = window_seconds
        self._last_counts: dict[tuple[str, str], int] = {}
        self._last_time = self._started = time.monotonic()

    def _windows(self, family: names.Family, by_tenant: bool) -> dict[tuple, list[WindowPart]]:
        """Live window slices per (model, route) or per tenant, from every matching series."""
        rec = self.recorder
        state = rec.families[family.name]
        current = time.perf_counter_ns() // rec.slice_ns
        index = {name: i for i, name in enumerate(state.label_names)}
        out: dict[tuple, list[WindowPart]] = defaultdict(list)
        for series in list(state.series.values()):
            values = series.values
            key = (values[index[names.TENANT]],) if by_tenant else \
                (values[index[names.MODEL]], values[index[names.ROUTE]])
            out[key].extend(rec.window_slices(series, current))
        return out

    def _calls(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for (model, _outcome, _provider, route, _tenant), n in \
                self.recorder.counts().rows[names.REQUESTS_TOTAL].items():
            counts[(model, route)] += n
        return counts

    def render(self) -> str:
        rec = self.recorder
        seconds = rec.families[names.TTFT.name].layout
        ttft = self._windows(names.TTFT, by_tenant=False)
        stall = self._windows(names.STALL, by_tenant=False)
        counts = self._calls()
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        window = f"last {self.window_seconds:g} s"
        lines = [f"TTFT and stall quantiles: {window} (the exporter's sliding window); "
                 f"req/s: last {elapsed:.0f} s",
                 _ROW.format("model", "route", "TTFT p50", "p90", "p99", "stall p99", "req/s")]
        for key in sorted(set(ttft) | set(counts)):
            p50, p90, p99 = (_s(v) for v in quantiles_of(ttft.get(key, []), QUANTILES, seconds))
            stall_p99 = _s(quantiles_of(stall.get(key, []), (0.99,), seconds)[0])
            rate = (counts[key] - self._last_counts.get(key, 0)) / elapsed
            lines.append(_ROW.format(*key, p50, p90, p99, stall_p99, f"{rate:.2f}"))
        self._last_counts, self._last_time = dict(counts), now
        by_tenant = self._windows(names.TTFT, by_tenant=True)
        slowest = sorted(((quantiles_of(parts, (0.99,), seconds)[0], tenant)
                          for (tenant,), parts in by_tenant.items()
                          if any(part_count(p) for p in parts)), reverse=True)[:5]
        lines.append(f"slowest tenants by TTFT p99 ({window}): " + ", ".join(
            f"{tenant} {_s(p99)}" for p99, tenant in slowest))
        return "\n".join(lines)

    def summary(self, incidents: Sequence[str] = ()) -> str:
        """The whole run: calls and outcomes, TTFT p50/p99 per model and route, incidents."""
        rec = self.recorder
        state = rec.families[names.TTFT.name]
        index = {name: i for i, name in enumerate(state.label_names)}
        merged: dict[tuple[str, str], Histogram] = {}
        for series, hist in rec.folded_copies(state):
            key = (series.values[index[names.MODEL]], series.values[index[names.ROUTE]])
            merged.setdefault(key, Histogram(state.layout)).add(hist)
        outcomes: dict[str, int] = defaultdict(int)
        for (_model, outcome, _provider, _route, _tenant), n in rec.counts().rows[names.REQUESTS_TOTAL].items():
            outcomes[outcome] += n
        minutes = (time.monotonic() - self._started) / 60
        lines = [f"summary of the whole run ({minutes:.1f} min): {sum(outcomes.values())} calls "
                 f"(" + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) + ")",
                 "{:<14}{:<11}{:>9}{:>9}{:>8}".format("model", "route", "calls", "TTFT p50",
                                                       "p99")]
        for key, hist in sorted(merged.items()):
            p50, p99 = hist.quantiles((0.5, 0.99))
            lines.append("{:<14}{:<11}{:>9}{:>9}{:>8}".format(*key, hist.count, _s(p50),
                                                               _s(p99)))
        if incidents:
            lines.append("incidents played: " + ", ".join(incidents))
        return "\n".join(lines)


def _s(value_us: int) -> str:
    return "-" if not value_us else f"{value_us / US_PER_SECOND:.2f}s"
