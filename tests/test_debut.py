"""A new series debuts at zero for scrapers (exporter/_internal/expose/debut.py): rate() and increase()
count nothing a series first appears with, so without the debut every tenant's first call is
missing from Prometheus."""

from __future__ import annotations

import time
import urllib.request
from urllib.parse import urlparse

import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.expose import server
from exporter._internal.expose.debut import SCRAPER_HEADER
from exporter._internal.expose.text import Renderer
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config
from tests.test_exposition import record
from tests.test_protobuf_exposition import decode, text_samples

TTFT = names.TTFT.name


def scrape(url: str, scraper: bool) -> dict[tuple[str, tuple], float]:
    headers = {SCRAPER_HEADER: "10"} if scraper else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
        return text_samples(response.read().decode())


def of_tenant(samples: dict[tuple[str, tuple], float], tenant: str) -> dict[str, float]:
    """The tenant's histogram count and sum, window count, requests and usage rows."""
    wanted = {f"{TTFT}_count": "count", f"{TTFT}_sum": "sum",
              f"{names.TTFT.window_name}_count": "window_count",
              names.REQUESTS_TOTAL: "requests",
              names.USAGE_INPUT_TOKENS: "input_tokens"}
    out = {}
    for (name, labels), value in samples.items():
        if name in wanted and ("tenant", tenant) in labels:
            out[wanted[name]] = value
    buckets = [v for (name, labels), v in samples.items()
               if name == f"{TTFT}_bucket" and ("tenant", tenant) in labels]
    out["buckets"] = max(buckets)
    return out


def test_a_scraper_sees_a_new_series_at_zero_first_and_a_person_sees_it_at_once() -> None:
    srv = exporter.start_http_server(port=0)
    try:
        record(tenant="a", ttft_ms=120)
        real = {"count": 1, "sum": 0.12, "window_count": 1, "requests": 1,
                "input_tokens": 1200, "buckets": 1}
        assert of_tenant(scrape(srv.url, scraper=False), "a") == real  # no debut used up
        zero = dict.fromkeys(real, 0)
        assert of_tenant(scrape(srv.url, scraper=True), "a") == zero
        assert of_tenant(scrape(srv.url, scraper=True), "a") == real
        record(tenant="a", ttft_ms=80)
        record(tenant="b", ttft_ms=80)
        after = scrape(srv.url, scraper=True)
        assert of_tenant(after, "a")["count"] == 2 and of_tenant(after, "a")["requests"] == 2
        assert of_tenant(after, "b") == zero
        assert of_tenant(scrape(srv.url, scraper=True), "b")["count"] == 1
    finally:
        srv.stop()


def test_the_native_histogram_and_its_slo_counts_debut_at_zero_too() -> None:
    renderer = runtime.state().renderer
    record(tenant="a", ttft_ms=120)

    def ttft(body: bytes) -> tuple[int, list[float]]:
        families = decode(body)
        metric, = (m for m in families[TTFT].metric
                   if ("tenant", "a") in ((p.name, p.value) for p in m.label))
        slo = [m.counter.value for m in families[names.slo_calls_name(names.TTFT)].metric
               if ("tenant", "a") in ((p.name, p.value) for p in m.label)]
        return metric.histogram.sample_count, slo

    count, slo = ttft(renderer.render_protobuf(scraper=True))
    assert count == 0 and slo and not any(slo)
    count, slo = ttft(renderer.render_protobuf(scraper=True))
    assert count == 1 and any(slo)


def test_series_older_than_the_renderer_continue_where_they_were() -> None:
    """An aggregator restores its state before it serves: a zero would read as a reset."""
    record(tenant="a", ttft_ms=120)
    renderer = Renderer(runtime.state().recorder)
    samples = text_samples(renderer.render(scraper=True).decode())
    assert of_tenant(samples, "a")["count"] == 1 and of_tenant(samples, "a")["requests"] == 1


@pytest.mark.parametrize("debut", [True, False], ids=["debut", "without"])
def test_prometheus_counts_every_first_call(debut: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A real Prometheus scraping every second while new tenants make their first (slow,
    cold-cache) calls: increase() over the run counts every call, and the mean TTFT by rate is
    the true one. Without the debut (the header renamed away), one call per series is lost."""
    require_prometheus()
    if not debut:
        monkeypatch.setattr(server, "SCRAPER_HEADER", "X-Not-Sent-By-Prometheus")
    srv = exporter.start_http_server(port=0)
    try:
        with PrometheusServer(scrape_config(urlparse(srv.base_url).netloc)) as prom:
            prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
            tenants = [f"t{i}" for i in range(4)]
            for i, tenant in enumerate(tenants):  # each tenant: a cold first call, then warm
                record(tenant=tenant, ttft_ms=900)
                time.sleep(1.1)  # a scrape (or two) sees the series with this call only
                for _ in range(i % 3 + 1):
                    record(tenant=tenant, ttft_ms=90)
            calls = sum(i % 3 + 2 for i in range(len(tenants)))
            time.sleep(3)  # two scrapes past the last call
            stamp = float(prom.query(f'timestamp(up{{job="ttft-exporter"}})')[0]["value"][1])
            window = f"{int(time.time() - stamp) + 60}s"

            def value(expr: str) -> float:
                return float(prom.query(expr, at=stamp)[0]["value"][1])

            counted = value(f"sum(increase({TTFT}_count[{window}]))")
            requests = value(f"sum(increase({names.REQUESTS_TOTAL}[{window}]))")
            mean = value(f"sum(increase({TTFT}_sum[{window}])) / "
                         f"sum(increase({TTFT}_count[{window}]))")
    finally:
        srv.stop()
    first = len(tenants)
    true_mean = (first * 0.9 + (calls - first) * 0.09) / calls
    if debut:
        assert counted == pytest.approx(calls) and requests == pytest.approx(calls)
        assert mean == pytest.approx(true_mean, rel=1e-3)
    else:  # each tenant's first call, the slow one, is missing (the rest extrapolated)
        assert counted < calls - first / 2 and requests < calls - first / 2
        assert mean < 0.6 * true_mean
