"""Faults: hostile or unbounded label values. Nothing unbounded, every call still counted."""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest

import exporter
from exporter._internal import names, runtime
from exporter._internal.config.loader import load
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.guard import INVALID
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

LIMITS = {"labels": {"max_series": 500, "max_models": 10, "max_routes": 20,
                     "max_providers": 4, "max_tenants": 5}}


class Unprintable:
    """A label value whose str() raises (a lazy object, a broken __str__)."""

    def __str__(self) -> str:
        raise RuntimeError("no string for you")


def test_a_label_whose_str_raises_is_replaced_and_the_call_counted():
    with exporter.labels(route=Unprintable(), tenant=Unprintable()):  # type: ignore[arg-type]
        with exporter.track(model="m", provider="p") as call:
            call.token()
    counters = runtime.state().recorder.counts()
    assert counters.rows[names.REQUESTS_TOTAL] == {("m", names.OK, "p", INVALID, INVALID): 1}
    assert counters.value(names.DROPPED, names.DROP_BAD_LABEL) == 2
    assert counters.value(names.DROPPED, names.DROP_INTERNAL) == 0


def call(rec: Recorder, i: int, model: str, route: str, tenant: str, provider: str = "p"):
    key = rec.started(model, provider, route)
    t = CallTimeline(start=0, model=model, provider=provider, route=route, tenant=tenant,
                     input_tokens=1000, cached_input_tokens=i % 1000,
                     upstream_address=f"10.{i % 250}.0.{i % 7}:443", fingerprint=f"fp_{i}")
    t.token(1_000_000 + i)
    t.end = 2_000_000
    t.outcome = names.OK
    rec.record_call(t, key)


def assert_bounded(rec: Recorder) -> None:
    """The bounds of docs/metrics.md ("Memory and scrape bounds")."""
    lab = rec.config.labels
    counters = rec.counts()
    assert counters.series <= lab.max_series
    assert sum(len(s.series) for s in rec.families.values()) == counters.series
    assert len(counters.rows[names.REQUESTS_TOTAL]) <= lab.max_series + len(names.OUTCOMES)
    assert len(counters.rows[names.REQUESTS_IN_FLIGHT]) <= lab.max_series + 1
    for rows in (counters.rows[names.USAGE_INPUT_TOKENS],
                 counters.rows[names.USAGE_CACHED_INPUT_TOKENS],
                 counters.rows[names.UPSTREAM_REQUESTS]):
        assert len(rows) <= lab.max_series + 1
    identity = [names.UPSTREAM_LABELS.index(label)
                for label in (names.ADDRESS, names.FINGERPRINT, names.REGION)]
    assert len({tuple(k[i] for i in identity) for k in counters.rows[names.UPSTREAM_REQUESTS]}
               ) <= (lab.max_models + 1) * lab.max_upstreams + 1
    assert len({k[0] for k in counters.rows[names.REQUESTS_TOTAL]}) <= lab.max_models + 1
    assert len({k[3] for k in counters.rows[names.REQUESTS_TOTAL]}) <= lab.max_routes + 1
    assert len({k[2] for k in counters.rows[names.REQUESTS_TOTAL]}) <= lab.max_providers + 1
    assert len(counters.rows[names.SELF_TENANT_FOLDS]) <= \
        (lab.max_models + 1) * (lab.max_routes + 1)
    guard = rec.guard
    assert sum(len(v) for v in guard._seen.values()) <= \
        lab.max_models + lab.max_routes + lab.max_providers
    assert sum(len(v) for v in guard._tenants.values()) <= lab.max_series


def memory_bound(rec: Recorder) -> int:
    """docs/metrics.md, "Memory and scrape bounds": the worst case of every part."""
    lab, window = rec.config.labels, rec.config.window
    counts_len = max(s.layout.counts_len for s in rec.families.values())
    per_series = (1 + window.slices) * counts_len * 4 + 1024  # counters, slices, key, object
    rows = 5 * lab.max_series + len(names.OUTCOMES) + 4
    values = lab.max_series + lab.max_models + lab.max_routes + lab.max_providers
    upstreams = (lab.max_models + 1) * lab.max_upstreams * 450
    return lab.max_series * per_series + rows * 300 + values * 2 * 150 + upstreams + 2**20


def test_hundreds_of_thousands_of_routes_models_and_tenants_stay_bounded():
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rec = Recorder(load(LIMITS))
    for i in range(50_000):  # every call a new model, route and tenant (a hostile provider)
        call(rec, i, f"model-{i}", f"/route/{i}", f"tenant-{i}", provider=f"p{i % 9}")
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held <= memory_bound(rec), (held, memory_bound(rec))
    assert_bounded(rec)
    counters = rec.counts()
    # every call counted, none dropped
    assert sum(counters.rows[names.REQUESTS_TOTAL].values()) == 50_000
    assert counters.value(names.FOLDS_BY_LABEL, names.MODEL) == 50_000 - 10
    assert counters.value(names.FOLDS_BY_LABEL, names.ROUTE) > 0
    assert counters.value(names.FOLDS_BY_LABEL, names.PROVIDER) > 0
    assert counters.value(names.FOLDS_BY_LABEL, names.FOLD_UPSTREAM) > 0
    assert sum(counters.rows[names.UPSTREAM_REQUESTS].values()) == 50_000
    body = Renderer(rec).render()
    assert len(body) < 4 * 2**20  # a bounded scrape (docs/metrics.md: a few MB at most)


def test_the_aggregator_bounds_the_union_of_its_workers():
    config = load(LIMITS)
    agg = Aggregator(config)
    for w in range(6):  # each worker within its own caps, their union far beyond them
        worker = Recorder(config)
        for i in range(300):
            call(worker, i, f"w{w}m{i % 10}", f"w{w}r{i % 20}", f"w{w}t{i}")
        worker.started(f"w{w}m0", "p", f"w{w}r0")  # a call in flight at each worker
        delta = take(worker)
        delta.worker, delta.seq, delta.interval = f"w{w}", 1, 5.0
        status, _ = agg.accept(wire.encode(delta, worker.schema.layouts()))
        assert status == 200
    assert_bounded(agg.recorder)
    counters = agg.recorder.counts()
    assert sum(counters.rows[names.REQUESTS_TOTAL].values()) == 6 * 300
    assert sum(counters.rows[names.REQUESTS_IN_FLIGHT].values()) == 6


# --- label expiry: caps a hostile client filled are freed, through the store and the scrape ---

def tenant_rows(rec: Recorder) -> dict[str, int]:
    """Requests by tenant, as the store holds them."""
    out: dict[str, int] = {}
    for row, n in rec.counts().rows[names.REQUESTS_TOTAL].items():
        out[row[4]] = out.get(row[4], 0) + n
    return out


def served_tenants(body: bytes) -> dict[str, float]:
    """Requests by tenant, as a scrape shows them."""
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith(names.REQUESTS_TOTAL + "{"):
            tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
            out[tenant] = out.get(tenant, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_tenant_caps_a_hostile_client_filled_free_after_the_expiry_and_their_series_go():
    """A client that controls the tenant header fills the (model, route)'s tenant cap with
    forged values, then stops. A real tenant calling all along keeps its slot and its count;
    a newcomer folds into __other__ until the forged values have been unseen for
    `labels.expire_seconds`, then gets its own series, and the forged series leave the store
    and the scrape (the series count and the guard shrink back). A forged value that comes
    back starts from zero, and a scraper sees it at zero first (its debut), so rate() counts
    its new calls and only those."""
    from tests.support.clock import ManualClock

    from exporter._internal.expose.textformat import TEXT

    clock = ManualClock()
    rec = Recorder(load({"labels": {"max_tenants": 4, "expire_seconds": 60}}), clock=clock)
    renderer = Renderer(rec)
    calls = [0]

    def scrape() -> bytes:
        """A scrape by Prometheus, its body delivered (its debuts used up)."""
        answer = renderer.scrape(TEXT, "prom")
        renderer.delivered(answer.delivery)
        return answer.body

    def one(tenant: str) -> None:
        calls[0] += 1
        call(rec, calls[0], "m", "/chat", tenant)

    one("gold")
    for i in range(20):
        one(f"forged-{i}")
    one("newcomer")
    assert set(tenant_rows(rec)) == {"gold", "forged-0", "forged-1", "forged-2",
                                     names.OTHER_TENANT}
    scrape()
    series_full = rec.counts().series
    for _ in range(5):  # 75 s: gold calls every 15 s, the newcomer too; scrapes every 15 s
        clock.advance(15)
        one("gold")
        one("newcomer")
        scrape()  # (the last one frees the forged slots)
    one("newcomer")
    rows = tenant_rows(rec)
    assert rows.get("newcomer") == 1 and not any(t.startswith("forged") for t in rows), rows
    assert rows["gold"] == 6  # never evicted, never reset
    served = served_tenants(renderer.render())
    assert not any(t.startswith("forged") for t in served) and served["gold"] == 6
    assert rec.counts().series < series_full
    assert sum(len(v) for v in rec.guard._tenants.values()) == 2  # gold, newcomer
    assert sum(len(s.series) for s in rec.families.values()) == rec.counts().series
    # a forged value that comes back is a new series: from zero, seen at zero first
    one("forged-0")
    assert tenant_rows(rec)["forged-0"] == 1
    assert served_tenants(scrape())["forged-0"] == 0.0
    assert served_tenants(scrape())["forged-0"] == 1.0


def test_an_aggregators_snapshot_does_not_hold_the_caps_for_good(tmp_path):
    """The snapshot brings every tenant back at restart (they fill the caps again); those no
    worker pushes any more expire `labels.expire_seconds` after the restart, and the next
    snapshot no longer holds them."""
    from exporter._internal.fleet.journal import StateFiles
    from tests.support.clock import ManualClock

    config = load({"labels": {"max_tenants": 3, "expire_seconds": 60},
                   "aggregator": {"snapshot_path": str(tmp_path / "state")}})
    first = Aggregator(config)
    worker = Recorder(config)
    for i in range(3):
        call(worker, i, "m", "/chat", f"forged-{i}")
    delta = take(worker)
    delta.worker, delta.seq, delta.interval = "w", 1, 5.0
    assert first.accept(wire.encode(delta, worker.schema.layouts()))[0] == 200
    first.close()

    clock = ManualClock()
    agg = Aggregator(config, Recorder(config, clock=clock))  # restored: the caps are full
    assert set(tenant_rows(agg.recorder)) == {"forged-0", "forged-1", "forged-2"}
    renderer = Renderer(agg.recorder, agg.families)

    def created_lines() -> list[str]:  # the aggregator's own counters' created timestamps
        return [line for line in renderer.render(openmetrics=True).decode().splitlines()
                if line.startswith("ttft_exporter_push_") and "_created" in line]

    created = created_lines()
    assert created
    seq = 1
    for _ in range(6):  # 90 s of pushes from a worker with a real tenant only, scraped
        clock.advance(15)
        renderer.render()
        worker = Recorder(config)
        call(worker, 1, "m", "/chat", "gold")
        delta = take(worker)
        seq += 1
        delta.worker, delta.seq, delta.interval = "w2", seq, 5.0
        assert agg.accept(wire.encode(delta, worker.schema.layouts()))[0] == 200
    rows = tenant_rows(agg.recorder)
    assert rows.get("gold") == 6 - rows.get(names.OTHER_TENANT, 0) and rows["gold"] >= 2
    assert not any(t.startswith("forged") for t in rows), rows
    assert agg.recorder.removals and created_lines() == created  # (they never restarted)
    agg.close()
    kept = StateFiles(str(tmp_path / "state")).read_snapshot()
    assert "forged-0" not in str(kept) and "gold" in str(kept)


def test_the_aggregators_in_flight_keys_free_their_slots_with_the_label_expiry():
    """Workers' in-flight keys fill `labels.max_series` (4) and the workers stop: once their
    labels have been unseen for `labels.expire_seconds` the keys free their slots, and a new
    worker's calls in flight get their own row, not the overflow one. A key a live worker
    still has keeps its slot."""
    from tests.support.clock import ManualClock

    clock = ManualClock()
    config = load({"labels": {"max_series": 4, "expire_seconds": 60},
                   "aggregator": {"gauge_ttl_seconds": 10}})
    agg = Aggregator(config, Recorder(config, clock=clock), clock=lambda: clock.now_ns / 1e9)
    seqs = {}

    def in_flight(worker: str, *models: str) -> int:
        """`worker` pushes a call in flight on each model: the status of its push."""
        rec = Recorder(config)
        for model in models:
            rec.started(model, "p", "/chat")
        delta = take(rec)
        seqs[worker] = seqs.get(worker, 0) + 1
        delta.worker, delta.seq, delta.interval = worker, seqs[worker], 5.0
        return agg.accept(wire.encode(delta, rec.schema.layouts()))[0]

    assert in_flight("old", "m0", "m1", "m2") == 200
    assert in_flight("live", "m3") == 200
    rows = agg.recorder.counts().rows[names.REQUESTS_IN_FLIGHT]
    assert rows == {("m0", "p", "/chat"): 1, ("m1", "p", "/chat"): 1, ("m2", "p", "/chat"): 1,
                    ("m3", "p", "/chat"): 1}
    for _ in range(6):  # 90 s: "old" stopped pushing, "live" pushes every 15 s
        clock.advance(15)
        assert in_flight("live", "m3") == 200
        agg.expire()
    assert in_flight("new", "m4") == 200
    rows = agg.recorder.counts().rows[names.REQUESTS_IN_FLIGHT]
    assert rows == {("m3", "p", "/chat"): 1, ("m4", "p", "/chat"): 1}, rows
    assert len(agg.gauges.keys) == 2


def test_prometheus_counts_a_label_value_across_its_expiry_and_return():
    """A real Prometheus scraping every second, `labels.expire_seconds: 4`. A tenant makes
    three calls and stops: its series leave the exposition once it has been unseen for the
    expiry, and Prometheus sees them go (stale). It comes back with two calls: its series start
    again from zero and show zero first (their debut), so increase() (and rate(), its quotient)
    over the whole run counts all five calls, while a tenant calling all along is counted
    exactly."""
    import json
    import urllib.request
    from urllib.parse import urlparse

    from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config
    from tests.test_exposition import record

    require_prometheus()
    exporter.configure({"labels": {"expire_seconds": 4}})
    srv = exporter.start_http_server(port=0)
    requests = names.REQUESTS_TOTAL
    ttft_count = names.TTFT.name + "_count"
    calls = {"gone": 0, "steady": 0}

    def one(tenant: str) -> None:
        record(tenant=tenant)
        calls[tenant] += 1

    def exposed(tenant: str) -> bool:
        """Whether the exposition has the tenant's series (read as a person: no debut used)."""
        body = urllib.request.urlopen(srv.url, timeout=10).read().decode()
        return f'tenant="{tenant}"' in body

    try:
        with PrometheusServer(scrape_config(urlparse(srv.base_url).netloc)) as prom:
            prom.wait_for('up{job="ttft-exporter"} == 1', timeout=30)
            for _ in range(3):
                one("gone")
                one("steady")
            prom.wait_for(f'{requests}{{tenant="gone"}} == 3', timeout=15)
            left = time.monotonic()
            while exposed("gone"):  # the steady tenant calls on; the other is unseen
                one("steady")
                time.sleep(0.5)
                assert time.monotonic() - left < 15, "the expired tenant's series stayed"
            prom.wait_for(f'absent({requests}{{tenant="gone"}})', timeout=15)
            one("gone")
            one("gone")
            one("steady")
            prom.wait_for(f'{requests}{{tenant="gone"}} == 2', timeout=15)
            time.sleep(1.5)  # a scrape more: the window ends on a sample of each series
            stamp = float(prom.query('timestamp(up{job="ttft-exporter"})')[0]["value"][1])
            window = f"{int(time.time() - left) + 60}s"

            def value(expr: str) -> float:
                result = prom.query(expr, at=stamp)
                return float(result[0]["value"][1]) if result else 0.0

            samples = [float(v) for _, v in prom.query(
                f'{requests}{{tenant="gone"}}[{window}]', at=stamp)[0]["values"]]
            gone_increase = value(f'sum(increase({requests}{{tenant="gone"}}[{window}]))')
            gone_ttft = value(f'sum(increase({ttft_count}{{tenant="gone"}}[{window}]))')
            steady = value(f'sum(increase({requests}{{tenant="steady"}}[{window}]))')
    finally:
        srv.stop()
    print(json.dumps({"samples of the expiring tenant": samples, "increase": gone_increase,
                      "steady": [steady, calls["steady"]]}))
    # at zero first, then 3; after the expiry at zero again, then 2
    assert samples[0] == 0 and 3 in samples and samples[-1] == 2
    back = len(samples) - 1 - samples[::-1].index(3.0)
    assert 0.0 in samples[back:], samples
    assert calls["gone"] == 5
    assert gone_increase == pytest.approx(5, rel=1e-9) and gone_ttft == pytest.approx(5, rel=1e-9)
    assert steady == pytest.approx(calls["steady"], rel=1e-9)
