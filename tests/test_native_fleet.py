"""End to end on a real Prometheus 2.42 with native histograms: a fleet of three exporters.

Two pods serve /metrics themselves; the third pushes to a real `ttft-exporter serve`
aggregator, which Prometheus scrapes instead (both roles answer over protobuf). Each pod records
a known, different TTFT and stall distribution (tests/support/fleet_pod.py). Prometheus must
store one native series per histogram and no classic series, count every call exactly, put the
fleet's p50/p90/p99 within native.error_bound of the exact quantiles of the union, hold the
same exact counts at every SLO threshold as the classic `le` buckets of the same exporters, and
evaluate every generated native-mode rule and dashboard query without an error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from exporter._internal import names, promql
from exporter._internal.config import loader as config_loader, settings as config
from exporter._internal.expose.native import error_bound
from exporter._internal.generate.files import ALERTING_FILE, RECORDING_FILE, generate
from exporter._internal.record.histogram import Layout
from tests.support import fleet_pod
from tests.support.prometheus import (PrometheusServer, grafana_expr, require_prometheus,
                                      scrape_config)
from tests.test_alerts import recorded_names
from tests.test_dashboards import UIDS, panels
from tests.test_push_processes import Serve

US = 1_000_000
TTFT = names.TTFT.name


class Pod:
    """tests/support/fleet_pod.py in its own process."""

    def __init__(self, pod: int, push_url: str = ""):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fleet_pod", str(pod),
             *([push_url] if push_url else [])], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()  # blocks until it serves (or pushes)
        assert self.url, "the pod process did not start"

    def record(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("record\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "recorded"

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def value(result: list) -> float:
    return float(result[0]["value"][1])


def classic_counts(url: str) -> dict[tuple[str, str], float]:
    """(sample name, le) -> sum over the series, from the text format of one exporter."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, s.labels.get("le", ""))
            out[key] = out.get(key, 0.0) + s.value
    return out


def test_a_fleet_of_three_on_prometheus_with_native_histograms(tmp_path: Path) -> None:
    require_prometheus()
    cfg = config_loader.load({"dashboards": {"histograms": "native"},
                       "alerting": {"window_scale": 1 / 60}})
    generate(cfg, tmp_path)
    rules = [tmp_path / "alerts" / name for name in (RECORDING_FILE, ALERTING_FILE)]
    (tmp_path / "serve.yaml").write_text("{}\n")
    aggregator = Serve(tmp_path / "serve.yaml")
    pods: list[Pod] = []
    try:
        pods = [Pod(0), Pod(1), Pod(2, aggregator.base)]
        urls = [pods[0].url, pods[1].url, aggregator.base + "/metrics"]
        # the pushed warm-up complete before the first scrape, as the other pods' is (each
        # series' first scrape sees it at zero, its debut: the rate check below counts it)
        deadline = time.monotonic() + 30
        while classic_counts(urls[2]).get((TTFT + "_count", "")) != fleet_pod.CALLS // 10:
            assert time.monotonic() < deadline, "the push worker's warm-up did not arrive"
            time.sleep(0.1)  # polling the aggregator, which merges pushes every 0.2 s
        targets = [u.split("//", 1)[1].split("/", 1)[0] for u in urls]
        with PrometheusServer(scrape_config(*targets), rule_files=rules,
                              extra_flags=["--enable-feature=native-histograms"]) as prom:
            warm = 3 * (fleet_pod.CALLS // 10)
            prom.wait_for(f"histogram_count(sum({TTFT}))", timeout=30,
                          predicate=lambda r: bool(r) and value(r) == warm)
            for pod in pods:
                pod.record()
            total = 3 * fleet_pod.CALLS
            # histogram_count is exact: every call of the three pods, no more, no less
            prom.wait_for(f"histogram_count(sum({TTFT}))", timeout=30,
                          predicate=lambda r: bool(r) and value(r) == total)
            prom.wait_for(f"histogram_count(sum({names.STALL.name}))", timeout=30,
                          predicate=lambda r: bool(r) and value(r) == total)
            assert not [t for t in prom.targets() if t["health"] != "up"]
            check_one_native_series_per_histogram(prom)
            check_fleet_quantiles(prom, targets)
            check_slo_counts(prom, urls)
            check_native_rules_and_dashboards(prom, cfg, tmp_path)
    finally:
        for pod in pods:
            pod.stop()
        aggregator.stop()


def check_one_native_series_per_histogram(prom: PrometheusServer) -> None:
    by_name = {r["metric"]["__name__"]: value([r]) for r in prom.query(
        f'count by (__name__) ({{__name__=~"{TTFT}.*"}})')}
    assert by_name == {TTFT: 12}  # 3 exporters x 4 tenants, one series each: no _bucket...
    families = "|".join(f.name for f in names.HISTOGRAMS)
    assert not prom.query(f'{{__name__=~"({families})_(bucket|count|sum)"}}')
    assert len(prom.query(f'{{__name__=~"{families}"}}')) > 12
    assert prom.query(f"{TTFT}")[0]["histogram"][1]["buckets"]  # native buckets, stored


def exact(values: list[int], qs: list[float]) -> list[float]:
    return list(np.quantile(np.array(values) / US, qs, method="inverted_cdf"))


def check_fleet_quantiles(prom: PrometheusServer, targets: list[str]) -> None:
    everything = [ttft for pod in range(3) for ttft, _ in fleet_pod.calls(pod)]
    bound = error_bound(config.Config().histograms.native_schema, Layout(3600 * US, 2))
    qs = [0.5, 0.9, 0.99]
    for q, e in zip(qs, exact(everything, qs)):
        got = value(prom.query(f"histogram_quantile({q}, sum({TTFT}))"))
        assert abs(got - e) / e <= bound, (q, got, e, bound)
    # Over a rate: every call (each series debuts at zero, so its first values count too),
    # each series scaled by rate's own extrapolation factor (its sample times): the exact
    # reference is the union weighted so.
    weights = {(r["metric"]["instance"], r["metric"]["tenant"]): value([r]) for r in prom.query(
        f"histogram_count(rate({TTFT}[1h]))")}
    weighted: list[tuple[float, float]] = []
    for pod, target in enumerate(targets):
        calls = fleet_pod.calls(pod)
        for tenant in range(4):
            mine = [t for i, (t, _) in enumerate(calls) if i % 4 == tenant]
            weight = weights[(target, f"t{tenant}")] / len(mine)
            weighted += [(t / US, weight) for t in mine]
    weighted.sort()
    cumulative = np.cumsum([w for _, w in weighted])
    e99 = weighted[int(np.searchsorted(cumulative, 0.99 * cumulative[-1]))][0]
    got = value(prom.query(f"histogram_quantile(0.99, sum(rate({TTFT}[1h])))"))
    assert abs(got - e99) / e99 <= bound, (got, e99, bound)


def check_slo_counts(prom: PrometheusServer, urls: list[str]) -> None:
    values = [call for pod in range(3) for call in fleet_pod.calls(pod)]
    truth = {(names.TTFT, "2.0"): sum(t <= 2 * US for t, _ in values),
             (names.FIRST_ANSWER, "10.0"): sum(t <= 10 * US for t, _ in values),
             (names.STALL, "5.0"): sum(g <= 5 * US for _, g in values)}
    classic: dict[tuple[str, str], float] = {}
    for url in urls:  # the same exporters in the text format
        for key, v in classic_counts(url).items():
            classic[key] = classic.get(key, 0.0) + v
    for (family, le), count in truth.items():
        assert 0 < count < len(values)
        slo = names.slo_calls_name(family)
        assert value(prom.query(f'sum({slo}{{le="{le}"}})')) == count
        assert classic[(family.name + "_bucket", le)] == count
        assert value(prom.query(f'sum({slo}{{le="+Inf"}})')) == len(values)
        assert classic[(family.name + "_count", "")] == len(values)


def check_native_rules_and_dashboards(prom: PrometheusServer, cfg: config.Config,
                                      out: Path) -> None:
    recorded = [ttft for pod in range(3) for ttft, _ in fleet_pod.calls(pod)
                [fleet_pod.CALLS // 10:]]
    missed = sum(t > 2 * US for t in recorded) / len(recorded)
    where = f'sli="ttft", model="{fleet_pod.MODEL}", route="{fleet_pod.ROUTE}"'
    # The 72 min window (3d at this window scale) holds every call recorded since the warm-up;
    # rate's extrapolation weighs each exporter by its own sample times, hence the tolerance
    # (promtool proves the native and classic recordings equal on equal samples).
    record = f"{promql.sli_record(259200)}{{{where}}}"
    prom.wait_for(record, timeout=20,
                  predicate=lambda r: bool(r) and abs(value(r) - missed) <= 0.02)
    for record in sorted(recorded_names(cfg)):
        prom.query(record)
    broken = [(r["name"], r.get("lastError")) for g in prom.rules() for r in g["rules"]
              if r["health"] == "err"]
    assert not broken
    for uid in UIDS:
        board = json.loads((out / "dashboards" / f"{uid}.json").read_text())
        for panel in panels(board):
            for target in panel["targets"]:
                prom.query(grafana_expr(target["expr"]))  # raises on an error
    p99 = prom.query(grafana_expr(promql.NATIVE.quantile(0.99, names.TTFT, promql.MODEL_ROUTE,
                                                         "1h")))
    assert 0.5 < value(p99) < 60
