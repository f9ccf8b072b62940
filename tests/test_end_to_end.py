"""A real Prometheus scrapes the exporter under the demo's load.

It checks what a user of the dashboards relies on: Prometheus sees every call the exporter
counted, and `histogram_quantile(0.99, ...)` over the served classic buckets lands in the same
bucket as the exporter's own exact HDR p99.
"""

import bisect

from exporter._internal import names
from exporter._internal.record.histogram import Histogram
from tests.support.demo_load import DemoLoad
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config


def test_prometheus_agrees_with_the_exporter_under_demo_load():
    require_prometheus()
    with DemoLoad(rate=12) as demo, PrometheusServer(scrape_config(demo.target)) as prom:
        prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
        prom.wait_for(f"sum({names.TTFT.name}_count) > 150", timeout=60)
        demo.stop_load()
        rec = demo.recorder
        calls = sum(rec.counts().rows[names.REQUESTS_TOTAL].values())
        prom.wait_for(f"sum({names.REQUESTS_TOTAL})", timeout=20,
                      predicate=lambda r: bool(r) and float(r[0]["value"][1]) == calls)
        # the exporter's own exact p99 over every TTFT series (HDR merge)
        state = rec.families[names.TTFT.name]
        merged = Histogram(state.layout)
        for _, hist in rec.folded_copies(state):
            merged.add(hist)
        prom.wait_for(f"sum({names.TTFT.name}_count)", timeout=20,
                      predicate=lambda r: bool(r) and float(r[0]["value"][1]) == merged.count)
        # HDR and Prometheus round the rank q*n differently (nearest vs. next order statistic),
        # so the agreement is: within the classic buckets holding the HDR quantiles one order
        # statistic either side of q.
        n = merged.count
        below, hdr_p99, above = (v / 1e6 for v in merged.quantiles(
            [0.99 - 1 / n, 0.99, min(0.99 + 1 / n, 1.0)]))
        result = prom.query(f"histogram_quantile(0.99, sum by (le) ({names.TTFT.name}_bucket))")
        prom_p99 = float(result[0]["value"][1])
        bounds = [b / 1e6 for b in state.layout.boundaries]
        k_low, k_high = bisect.bisect_left(bounds, below), bisect.bisect_left(bounds, above)
        low = bounds[k_low - 1] if k_low > 0 else 0.0
        high = bounds[k_high] if k_high < len(bounds) else float("inf")
        assert low <= prom_p99 <= high, (hdr_p99, prom_p99, low, high)
        # every user-facing family and phase reached Prometheus
        for family in (names.TTFT, names.FIRST_ANSWER, names.ITL, names.STALL, names.DURATION,
                       names.TPOT, names.INPUT_TOKENS, names.CACHED_INPUT_TOKENS):
            assert prom.query(f"{family.name}_count"), family.name
        phases = {r["metric"]["phase"] for r in prom.query(f"{names.PHASE_FAMILY.name}_count")}
        assert {"prefill", "decode", "reasoning"} <= phases
        assert prom.query(f'{names.TTFT.window_name}{{quantile="0.99"}}')
        assert not [t for t in prom.targets() if t["health"] != "up"]
