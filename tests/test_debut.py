"""A new series debuts at zero for scrapers (exporter/_internal/expose/debut.py): rate() and increase()
count nothing a series first appears with, so without the debut every tenant's first call is
missing from Prometheus."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import urllib.request
from urllib.parse import urlparse

import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.expose import protobuf, server
from exporter._internal.expose.debut import SCRAPER_HEADER
from exporter._internal.expose.text import Renderer
from exporter._internal.expose.textformat import OPENMETRICS, PROTOBUF
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config
from tests.test_exposition import record
from tests.test_protobuf_exposition import NATIVE_ACCEPT, decode, text_samples

TTFT = names.TTFT.name


def scrape(url: str, scraper: bool, tenant: str | None = None, **headers: str
           ) -> dict[tuple[str, tuple], float]:
    """The samples of a scrape; with `tenant`, that tenant's only (a body of thousands of
    series takes seconds to parse whole)."""
    if scraper:
        headers[SCRAPER_HEADER] = "10"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
        return text_samples(of_one_tenant(response.read().decode(), tenant))


def of_one_tenant(text: str, tenant: str | None) -> str:
    """The exposition's comment lines and the samples of `tenant` (all of it when None)."""
    if tenant is None:
        return text
    label = f'tenant="{tenant}"'
    return "".join(line for line in text.splitlines(keepends=True)
                   if line.startswith("#") or label in line)


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

    first = renderer.scrape(PROTOBUF, "prom")
    count, slo = ttft(first.body)
    assert count == 0 and slo and not any(slo)
    count, slo = ttft(renderer.render_protobuf("prom"))  # the first body was not delivered
    assert count == 0 and not any(slo)
    renderer.delivered(first.delivery)
    count, slo = ttft(renderer.render_protobuf("prom"))
    assert count == 1 and any(slo)


def test_series_older_than_the_renderer_continue_where_they_were() -> None:
    """An aggregator restores its state before it serves: a zero would read as a reset."""
    record(tenant="a", ttft_ms=120)
    renderer = Renderer(runtime.state().recorder)
    samples = text_samples(renderer.render(scraper="prom").decode())
    assert of_tenant(samples, "a")["count"] == 1 and of_tenant(samples, "a")["requests"] == 1


@pytest.mark.parametrize("debut", [True, False], ids=["debut", "without"])
def test_prometheus_counts_every_first_call(debut: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Real Prometheus scraping every second while new tenants make their first (slow,
    cold-cache) calls: increase() over the run counts every call, and the mean TTFT by rate is
    the true one, in both replicas of an HA pair (one address: told apart by a `scraper`
    parameter). Without the debut (the header renamed away), one call per series is lost."""
    require_prometheus()
    if not debut:
        monkeypatch.setattr(server, "SCRAPER_HEADER", "X-Not-Sent-By-Prometheus")
    srv = exporter.start_http_server(port=0)
    target = urlparse(srv.base_url).netloc
    replicas = ("a", "b") if debut else ("a",)
    configs = [scrape_config(target).replace(
        "    static_configs:", f"    params: {{scraper: [{name}]}}\n    static_configs:")
        for name in replicas]
    tenants = [f"t{i}" for i in range(4)]
    calls = sum(i % 3 + 2 for i in range(len(tenants)))
    try:
        with contextlib.ExitStack() as stack:
            proms = [stack.enter_context(PrometheusServer(config)) for config in configs]
            for prom in proms:
                prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
            for i, tenant in enumerate(tenants):  # each tenant: a cold first call, then warm
                record(tenant=tenant, ttft_ms=900)
                scraped_after(proms, time.time())  # a scrape sees the series with this call only
                for _ in range(i % 3 + 1):
                    record(tenant=tenant, ttft_ms=90)
            scraped_after(proms, time.time() + 1)  # two scrapes (1 s apart) past the last call
            seen = [counted_by(prom) for prom in proms]
    finally:
        srv.stop()
    first = len(tenants)
    true_mean = (first * 0.9 + (calls - first) * 0.09) / calls
    for counted, requests, mean in seen:
        if debut:
            assert counted == pytest.approx(calls) and requests == pytest.approx(calls)
            assert mean == pytest.approx(true_mean, rel=1e-3)
        else:  # each tenant's first call, the slow one, is missing (the rest extrapolated)
            assert counted < calls - first / 2 and requests < calls - first / 2
            assert mean < 0.6 * true_mean


def scraped_after(proms: list[PrometheusServer], moment: float) -> None:
    """Until every Prometheus has started a scrape of the exporter after `moment` (unix
    seconds): its samples are stamped with the scrape's start."""
    for prom in proms:
        prom.wait_for(f'timestamp(up{{job="ttft-exporter"}}) > {moment:.3f}', timeout=30,
                      interval=0.05)


def counted_by(prom: PrometheusServer) -> tuple[float, float, float]:
    """(TTFT count, requests, mean TTFT) this Prometheus counted by increase() over the run."""
    stamp = float(prom.query('timestamp(up{job="ttft-exporter"})')[0]["value"][1])
    window = f"{int(time.time() - stamp) + 60}s"

    def value(expr: str) -> float:
        return float(prom.query(expr, at=stamp)[0]["value"][1])

    return (value(f"sum(increase({TTFT}_count[{window}]))"),
            value(f"sum(increase({names.REQUESTS_TOTAL}[{window}]))"),
            value(f"sum(increase({TTFT}_sum[{window}])) / sum(increase({TTFT}_count[{window}]))"))


def test_a_scrape_that_fails_after_rendering_uses_up_no_debut() -> None:
    """The scraper sends its request and resets the connection (as on its timeout): the body
    rendered for it never arrives, so its next scrape still shows the new series at zero."""
    srv = exporter.start_http_server(port=0)
    try:
        record(tenant="a", ttft_ms=120)
        for i in range(40):  # a first render long enough to reset the connection in
            record(model=f"m{i % 10}", tenant=f"x{i}")
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{SCRAPER_HEADER}: 10\r\n"
                         "\r\n".encode())
        assert of_tenant(scrape(srv.url, scraper=True), "a")["count"] == 0  # parsed whole
        assert of_tenant(scrape(srv.url, scraper=True, tenant="a"), "a")["count"] == 1
        # a body delivered after the timeout the scraper announced: it gave up, no debut used
        record(tenant="b", ttft_ms=120)
        with urllib.request.urlopen(urllib.request.Request(
                srv.url, headers={SCRAPER_HEADER: "0"})) as response:
            body = of_one_tenant(response.read().decode(), "b")
            assert of_tenant(text_samples(body), "b")["count"] == 0
        assert of_tenant(scrape(srv.url, scraper=True, tenant="b"), "b")["count"] == 0
        assert of_tenant(scrape(srv.url, scraper=True, tenant="b"), "b")["count"] == 1
    finally:
        srv.stop()


def test_a_protobuf_render_that_falls_back_to_text_keeps_the_debut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The protobuf render fails after choosing its zeros: the text served instead shows the
    new series at zero, and the next scrape its value."""
    srv = exporter.start_http_server(port=0)
    try:
        record(tenant="a", ttft_ms=120)

        def broken(family: object) -> bytes:
            raise RuntimeError("a bug in the last step of the protobuf render")

        monkeypatch.setattr(protobuf, "small_family", broken)
        fell_back = scrape(srv.url, scraper=True, Accept=NATIVE_ACCEPT)
        assert of_tenant(fell_back, "a")["count"] == 0
        assert fell_back[(names.SELF_DROPS, (("reason", "internal_error"),))] == 1
        assert of_tenant(scrape(srv.url, scraper=True), "a")["count"] == 1
    finally:
        srv.stop()


def test_each_scraper_has_its_own_debut() -> None:
    """Two scrapers (addresses, or a `scraper` query parameter: Prometheus replicas behind
    one address) each see a new series at zero once; a person never does; a scraper that
    first comes after the series reached another one sees its value (it would otherwise count
    every series' whole history as new)."""
    srv = exporter.start_http_server(port=0)
    try:
        replica = {name: f"{srv.url}?scraper={name}" for name in ("a", "b")}
        for url in replica.values():
            scrape(url, scraper=True)
        record(tenant="a", ttft_ms=120)
        assert of_tenant(scrape(replica["a"], scraper=True), "a")["count"] == 0
        assert of_tenant(scrape(srv.url, scraper=False), "a")["count"] == 1
        assert of_tenant(scrape(replica["a"], scraper=True), "a")["count"] == 1
        assert of_tenant(scrape(replica["b"], scraper=True), "a")["count"] == 0
        assert of_tenant(scrape(replica["b"], scraper=True), "a")["count"] == 1
        assert of_tenant(scrape(srv.url, scraper=True), "a")["count"] == 1  # a late one
        record(tenant="b", ttft_ms=120)
        assert of_tenant(scrape(srv.url, scraper=True), "b")["count"] == 0  # ... from now on
    finally:
        srv.stop()


def test_an_exemplar_recorded_before_the_first_scrape_is_served_with_the_debut() -> None:
    renderer = runtime.state().renderer
    record(tenant="a", ttft_ms=120, trace_id="f" * 32)
    debut = renderer.scrape(OPENMETRICS, "prom")
    line, = (line for line in debut.body.decode().splitlines()
             if line.startswith(f"{TTFT}_bucket") and 'tenant="a"' in line and "trace_id" in line)
    assert line.split(" # ")[0].endswith(" 0.0") and 'trace_id="' + "f" * 32 in line
    ttft = decode(renderer.scrape(PROTOBUF, "prom").body)[TTFT]
    exemplars = [e.label[0].value for m in ttft.metric for e in m.histogram.exemplars]
    assert exemplars == ["f" * 32] and ttft.metric[0].histogram.sample_count == 0


def test_prometheus_stores_an_exemplar_recorded_before_the_first_scrape() -> None:
    """A real Prometheus (exemplar storage on) scrapes a series whose first call, traced, was
    recorded before its first scrape; a second traced call in the same bucket follows that
    scrape ("latest wins" replaces the first exemplar). Both traces are stored: the first came
    with the debut's zero."""
    require_prometheus()
    srv = exporter.start_http_server(port=0)
    traces = ["e" * 32, "f" * 32]
    config = scrape_config(urlparse(srv.base_url).netloc).replace(
        "scrape_interval: 1s", "scrape_interval: 4s")  # room to record between two scrapes
    try:
        record(tenant="a", ttft_ms=120, trace_id=traces[0])
        with PrometheusServer(config, extra_flags=["--enable-feature=exemplar-storage"]) as prom:
            prom.wait_for(f'{TTFT}_count{{tenant="a"}} == 0', timeout=30)  # the debut
            record(tenant="a", ttft_ms=120, trace_id=traces[1])
            prom.wait_for(f'{TTFT}_count{{tenant="a"}} == 2', timeout=30)
            now = time.time()
            found = {e["labels"]["trace_id"] for series in prom._get(
                "/api/v1/query_exemplars", {"query": f"{TTFT}_bucket", "start": str(now - 300),
                                            "end": str(now + 5)})
                     for e in series["exemplars"]}
    finally:
        srv.stop()
    assert found == set(traces)
