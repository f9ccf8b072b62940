"""The demo's terminal table: what the exporter itself knows, per model and route, right now.

Quantiles come from the same sliding-window HDR slices `/metrics` serves, merged across
tenants (exact to HDR precision); request rates from the requests counter between two prints.
"""

from __future__ import annotations

import time
from collections import defaultdict

from .. import names
from ..histogram import WindowPart, part_count, quantiles_of
from ..recorder import US_PER_SECOND, Recorder

QUANTILES = (0.5, 0.9, 0.99)


class TerminalTable:
    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self._last_counts: dict[tuple[str, str], int] = {}
        self._last_time = time.monotonic()

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

    def render(self) -> str:
        rec = self.recorder
        seconds = rec.families[names.TTFT.name].layout
        ttft = self._windows(names.TTFT, by_tenant=False)
        stall = self._windows(names.STALL, by_tenant=False)
        requests = rec.counters().requests
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for (model, _outcome, _provider, route, _tenant), n in requests.items():
            counts[(model, route)] += n
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        lines = [f"{'model':<14}{'route':<11}{'TTFT p50':>9}{'p90':>8}{'p99':>8}"
                 f"{'stall p99':>11}{'req/s':>8}"]
        for key in sorted(set(ttft) | set(counts)):
            p50, p90, p99 = (_s(v) for v in quantiles_of(ttft.get(key, []), QUANTILES, seconds))
            stall_p99 = _s(quantiles_of(stall.get(key, []), (0.99,), seconds)[0])
            rate = (counts[key] - self._last_counts.get(key, 0)) / elapsed
            lines.append(f"{key[0]:<14}{key[1]:<11}{p50:>9}{p90:>8}{p99:>8}{stall_p99:>11}"
                         f"{rate:>8.2f}")
        self._last_counts, self._last_time = dict(counts), now
        by_tenant = self._windows(names.TTFT, by_tenant=True)
        slowest = sorted(((quantiles_of(parts, (0.99,), seconds)[0], tenant)
                          for (tenant,), parts in by_tenant.items()
                          if any(part_count(p) for p in parts)), reverse=True)[:5]
        lines.append("slowest tenants by TTFT p99: " + ", ".join(
            f"{tenant} {_s(p99)}" for p99, tenant in slowest))
        return "\n".join(lines)


def _s(value_us: int) -> str:
    return "-" if not value_us else f"{value_us / US_PER_SECOND:.2f}s"
