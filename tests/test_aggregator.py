"""The aggregator: exact merge, idempotent retries, gauges, strict validation, auth, TLS,
snapshot and journal."""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import ssl
import time
import urllib.error
import urllib.request
import zlib

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hdrh.histogram import HdrHistogram

from exporter._internal import names
from exporter._internal.config.loader import load
from exporter._internal.config.settings import AggregatorConfig, Config, ConfigError, PushConfig
from exporter._internal.demo.far_region import self_signed
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import push, wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.histogram import quantiles_of
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline
from tests.support import require_module


def call(rec: Recorder, ttft_us: int, tenant: str = "t", model: str = "m",
         outcome: str = "ok", trace_id: str | None = None) -> None:
    t = CallTimeline(start=0, model=model, provider="p", route="r", tenant=tenant,
                     trace_id=trace_id)
    t.sent, t.headers = 1000, 50_000
    t.token(ttft_us * 1000, "reasoning")
    t.token(ttft_us * 1000 + 2_000_000)
    t.token(ttft_us * 1000 + 2_500_000)
    t.end = ttft_us * 1000 + 3_000_000
    t.outcome = outcome
    t.input_tokens, t.output_tokens, t.cached_input_tokens = 1000 + ttft_us % 7, 3, 512
    t.upstream_address, t.upstream_region = f"10.0.0.{ttft_us % 3}:443", "eu"
    rec.record_call(t)


def body_of(rec: Recorder, worker: str = "w1", seq: int = 1, final: bool = False,
            interval: float = 5.0) -> bytes:
    delta = take(rec)
    delta.worker, delta.seq, delta.final, delta.interval = worker, seq, final, interval
    return wire.encode(delta, rec.schema.layouts())


def doc_of(body: bytes) -> dict:
    return json.loads(zlib.decompress(body))


def compress(doc) -> bytes:
    return zlib.compress(json.dumps(doc).encode())


def histogram_lines(text: str) -> list[str]:
    """The served lines that must not depend on how the values were split across workers."""
    return sorted(line for line in text.splitlines() if line.startswith("llm_client_")
                  and "_window" not in line and "in_flight" not in line)


# --- exact merge --------------------------------------------------------------------------------

def test_merged_workers_serve_exactly_what_one_recorder_would():
    rng = random.Random(5)
    values = [int(rng.lognormvariate(13.5, 1.0)) + 1 for _ in range(2000)]
    single = Recorder()
    workers = [Recorder() for _ in range(4)]
    for i, v in enumerate(values):
        call(single, v, tenant=f"t{i % 3}", outcome="ok" if i % 9 else "error")
        call(workers[i % 4], v, tenant=f"t{i % 3}", outcome="ok" if i % 9 else "error")
    target = Recorder()
    agg = Aggregator(Config(), target)
    for w, rec in enumerate(workers):
        for seq in (1, 2):  # two pushes per worker, the second empty
            assert agg.accept(body_of(rec, f"w{w}", seq))[0] == 200
    assert histogram_lines(Renderer(target).render().decode()) == \
        histogram_lines(Renderer(single).render().decode())
    # p99 of the merge equals the p99 of one HdrHistogram fed all the values
    reference = HdrHistogram(1, 3_600_000_000, 2)
    ttft_parts = []
    for state in (target.families[names.TTFT.name],):
        for series in state.series.values():
            ttft_parts.append(series.hist)
    for v in values:
        reference.record_value(v)
    layout = target.families[names.TTFT.name].layout
    assert quantiles_of(ttft_parts, [0.99], layout)[0] == reference.get_value_at_percentile(99)


def test_window_quantiles_come_from_the_received_deltas():
    worker, target = Recorder(), Recorder()
    agg = Aggregator(Config(), target)
    for v in range(100_000, 1_100_000, 10_000):
        call(worker, v)
    agg.accept(body_of(worker))
    text = Renderer(target).render().decode()
    p50 = next(line for line in text.splitlines() if line.startswith(
        names.TTFT.window_name + "{") and 'quantile="0.5"' in line)
    assert abs(float(p50.split()[-1]) - 0.59) / 0.59 < 0.01


def test_exemplars_travel_to_the_aggregator():
    worker, target = Recorder(), Recorder()
    agg = Aggregator(Config(), target)
    call(worker, 150_000, trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    agg.accept(body_of(worker))
    text = Renderer(target).render(openmetrics=True).decode()
    assert '# {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 0.15' in text


def test_gauges_are_the_sum_of_live_workers_and_expire():
    now = [100.0]
    target = Recorder()
    agg = Aggregator(Config(), target, clock=lambda: now[0])
    a, b = Recorder(), Recorder()
    for _ in range(2):
        a.started("m", "p", "r")
    b.started("m", "p", "r")
    agg.accept(body_of(a, "a", interval=5.0))
    agg.accept(body_of(b, "b", interval=1.0))
    assert target.counts().rows[names.REQUESTS_IN_FLIGHT] == {("m", "p", "r"): 3}
    now[0] += 12  # b (interval 1 s: ttl 10 s) stopped pushing; a (ttl 15 s) is still live
    agg.expire()
    assert target.counts().rows[names.REQUESTS_IN_FLIGHT] == {("m", "p", "r"): 2}
    agg.accept(body_of(a, "a", seq=2, final=True))  # a's last push: its gauges go at once
    assert target.counts().rows[names.REQUESTS_IN_FLIGHT] == {}
    assert "ttft_exporter_push_workers 0.0" in Renderer(target, agg.families).render().decode()


def test_tenants_are_capped_again_over_the_union_of_workers():
    config = load({"labels": {"max_tenants": 3}})
    target = Recorder(config)
    agg = Aggregator(config, target)
    for w in range(3):  # each worker sees 2 tenants: 6 in all, 3 kept
        rec = Recorder(config)
        for t in range(2):
            call(rec, 1000, tenant=f"w{w}t{t}")
        agg.accept(body_of(rec, f"w{w}"))
    counters = target.counts()
    tenants = {key[4] for key in counters.rows[names.REQUESTS_TOTAL]}
    assert len(tenants - {names.OTHER_TENANT}) == 3 and names.OTHER_TENANT in tenants
    assert sum(counters.rows[names.REQUESTS_TOTAL].values()) == 6
    assert counters.rows[names.SELF_TENANT_FOLDS] == {("m", "r"): 3}
    ttft = target.families[names.TTFT.name]
    assert {s.values[3] for s in ttft.series.values()} == tenants


def test_upstreams_are_capped_again_over_the_union_of_workers():
    config = load({"labels": {"max_upstreams": 2}})
    target = Recorder(config)
    agg = Aggregator(config, target)
    ttfts = []
    for w in range(3):  # per worker: 10.0.0.0 (call()), 10.1.w.0, and 10.1.w.1 folded by it
        rec = Recorder(config)
        for i in range(2):
            ttfts.append(3 * (2 * w + i + 1))  # a multiple of 3: address 10.0.0.0, region eu
            call(rec, ttfts[-1], tenant="t")
            rec.record_call(CallTimeline(start=0, model="m", provider="p", route="r",
                                         tenant="t", upstream_address=f"10.1.{w}.{i}:443",
                                         outcome="ok", end=1))
        agg.accept(body_of(rec, f"w{w}"))
    counters = target.counts()
    addresses = {key[0] for key in counters.rows[names.UPSTREAM_REQUESTS]}
    assert addresses == {"10.0.0.0:443", "10.1.0.0:443", names.OTHER_TENANT}, addresses
    assert sum(counters.rows[names.UPSTREAM_REQUESTS].values()) == 12
    # 3 folded by the workers, then 10.1.1.0 and 10.1.2.0 by the aggregator
    assert counters.value(names.FOLDS_BY_LABEL, names.FOLD_UPSTREAM) == 5
    assert sum(counters.rows[names.USAGE_INPUT_TOKENS].values()) == sum(1000 + v % 7 for v in ttfts)
    assert sum(counters.rows[names.USAGE_CACHED_INPUT_TOKENS].values()) == 512 * len(ttfts)


# --- rejects --------------------------------------------------------------------------------

@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "push-token"
    path.write_text("correct-horse\n")
    return path


async def test_bad_pushes_are_rejected_counted_and_change_nothing(token_file):
    config = Config(aggregator=AggregatorConfig(push_token_file=str(token_file),
                                                max_body_bytes=1 << 20))
    target = Recorder(config)
    agg = Aggregator(config, target)
    client = TestClient(TestServer(create_app(lambda: Renderer(target, agg.families), agg)))
    await client.start_server()
    try:
        auth = {"Authorization": "Bearer correct-horse"}
        worker = Recorder()
        call(worker, 12_345)
        good = body_of(worker)
        raw = doc_of(good)
        truncated = copy.deepcopy(raw)  # an HDR counts payload cut short
        entry = truncated["histograms"][names.TTFT.name]
        entry[1] = base64.b64encode(base64.b64decode(entry[1])[:-1]).decode()
        other_layout = copy.deepcopy(raw)
        other_layout["layouts"]["seconds"][2] = [1, 2, 3]
        bomb = zlib.compress(b" " * (80 << 20), 9)  # small on the wire, 80 MB inflated
        cases = [
            ({}, good, 401, names.REJECT_UNAUTHORIZED),
            ({"Authorization": "Bearer wrong"}, good, 401, names.REJECT_UNAUTHORIZED),
            ({"Authorization": "Basic Y29ycmVjdC1ob3JzZQ=="}, good, 401,
             names.REJECT_UNAUTHORIZED),
            (auth, b"garbage", 400, names.REJECT_MALFORMED),
            (auth, zlib.compress(b"[1, 2"), 400, names.REJECT_MALFORMED),
            (auth, good[:-10], 400, names.REJECT_MALFORMED),
            (auth, compress(truncated), 400, names.REJECT_MALFORMED),
            (auth, compress({**raw, "version": 2}), 409, names.REJECT_INCOMPATIBLE),
            (auth, compress(other_layout), 409, names.REJECT_INCOMPATIBLE),
            (auth, os.urandom(10 << 20), 413, names.REJECT_TOO_LARGE),
            (auth, bomb, 413, names.REJECT_TOO_LARGE),
        ]
        for headers, body, status, reason in cases:
            before = agg.rejected[reason]
            response = await client.post("/push", data=body, headers=headers)
            assert response.status == status, (reason, await response.text())
            assert agg.rejected[reason] == before + 1
        # a chunked body (no Content-Length) over the limit is cut off too
        async def chunks():
            for _ in range(20):
                yield b"x" * 65536
        response = await client.post("/push", data=chunks(), headers=auth)
        assert response.status == 413
        # a Content-Encoding would let the HTTP layer inflate before any limit
        response = await client.post("/push", data=good, headers={
            **auth, "Content-Encoding": "deflate"})
        assert response.status == 400
        assert target.series_count == 0 and not target.counts().rows[names.REQUESTS_TOTAL]
        metrics = await (await client.get("/metrics")).text()
        assert f'{names.SELF_PUSH_REJECTED}{{reason="unauthorized"}} 3.0' in metrics
        assert f'{names.SELF_PUSH_REJECTED}{{reason="too_large"}} 3.0' in metrics
        response = await client.post("/push", data=good, headers=auth)
        assert response.status == 200 and (await response.json())["applied"] is True
        assert sum(target.counts().rows[names.REQUESTS_TOTAL].values()) == 1
    finally:
        await client.close()


def mutations(rng: random.Random, doc):
    """A few structure-aware mutations of a payload document."""
    doc = copy.deepcopy(doc)
    weird = [None, True, -1, 2**64, 1.5, float("nan"), "", "x" * 300, "\x00", [], {}, [[]],
             "AAAA", -2**63, 0]
    paths = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + [i])

    walk(doc, [])
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths[1:])
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            key = path[-1]
            choice = rng.random()
            if choice < 0.5:
                parent[key] = rng.choice(weird)
            elif choice < 0.7 and isinstance(parent[key], str):
                s = parent[key]
                data = bytearray(base64.b64decode(s)) if len(s) % 4 == 0 and s else bytearray()
                if data:  # flip a byte inside an HDR blob
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                    parent[key] = base64.b64encode(bytes(data)).decode()
            elif choice < 0.85 and isinstance(parent, list):
                del parent[key]
            elif isinstance(parent[key], int) and not isinstance(parent[key], bool):
                parent[key] += rng.choice([-1, 1, 10**6])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return doc


def test_fuzzed_payloads_never_crash_and_a_reject_changes_nothing():
    hypothesis = require_module("hypothesis")
    from hypothesis import HealthCheck, given, settings, strategies as st

    worker = Recorder()
    for i in range(40):
        call(worker, 1000 + 997 * i, tenant=f"t{i % 2}", trace_id=f"tr{i}")
    worker.started("m", "p", "r")
    good = body_of(worker)
    raw = doc_of(good)
    target = Recorder()
    agg = Aggregator(Config(), target)

    def check(body: bytes) -> None:
        before = (target.series_count, dict(target.counts().rows[names.REQUESTS_TOTAL]))
        status, answer = agg.accept(body)
        assert status == 200 or 400 <= status < 500, answer
        if status != 200:
            assert (target.series_count, dict(target.counts().rows[names.REQUESTS_TOTAL])) == before

    @settings(max_examples=400, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2**32), st.binary(max_size=64), st.integers(0, len(good)))
    def fuzz(seed, junk, cut):
        rng = random.Random(seed)
        check(compress(mutations(rng, raw)))  # structure-aware
        text = bytearray(zlib.decompress(good))  # bytes of the JSON
        for _ in range(rng.randint(1, 4)):
            text[rng.randrange(len(text))] = rng.randrange(256)
        check(zlib.compress(bytes(text)))
        check(good[:cut] + junk)  # the compressed stream itself

    started = time.monotonic()
    fuzz()
    assert time.monotonic() - started < 60
    assert hypothesis is not None


# --- snapshot and journal --------------------------------------------------------------------

def snapshot_config(tmp_path) -> Config:
    return Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state.snap")))


def test_snapshot_restores_counts_and_the_applied_map(tmp_path):
    config = snapshot_config(tmp_path)
    target = Recorder(config)
    agg = Aggregator(config, target)
    worker = Recorder()
    for i in range(200):
        call(worker, 5000 + i * 113, tenant=f"t{i % 4}", trace_id=f"x{i}")
    body = body_of(worker, "w1", 1)
    assert agg.accept(body) == (200, {"applied": True, "seq": 1})
    agg.accept(b"junk")
    served = histogram_lines(Renderer(target).render().decode())
    agg.close()  # SIGTERM path: a final snapshot
    assert os.path.getsize(agg.files.journal_path) == 0

    target2 = Recorder(config)
    agg2 = Aggregator(config, target2)
    assert histogram_lines(Renderer(target2).render().decode()) == served
    assert agg2.accept(body) == (200, {"applied": False, "seq": 1})  # the retry after restart
    assert agg2.rejected[names.REJECT_MALFORMED] == 1  # self-metrics do not reset either
    assert agg2.batches[names.PUSH_APPLIED] == 1
    text = Renderer(target2).render(openmetrics=True).decode()
    assert '# {trace_id="x' in text


def test_journal_replays_what_was_acknowledged_after_the_last_snapshot(tmp_path):
    config = snapshot_config(tmp_path)
    target = Recorder(config)
    agg = Aggregator(config, target)
    worker = Recorder()
    bodies = []
    for seq in range(1, 6):
        for i in range(10):
            call(worker, 1000 * seq + i)
        bodies.append(body_of(worker, "w1", seq))
    for body in bodies[:2]:
        agg.accept(body)
    agg.snapshot()
    for body in bodies[2:]:
        agg.accept(body)
    served = histogram_lines(Renderer(target).render().decode())
    # a SIGKILL now: no close(), the journal holds pushes 3-5 plus a record cut short
    with open(agg.files.journal_path, "ab") as f:
        f.write(b"\x00\x00\x10\x00partial")
    target2 = Recorder(config)
    agg2 = Aggregator(config, target2)
    assert histogram_lines(Renderer(target2).render().decode()) == served
    assert sum(target2.counts().rows[names.REQUESTS_TOTAL].values()) == 50
    assert [agg2.accept(b)[1]["applied"] for b in bodies] == [False] * 5


def test_an_unreadable_snapshot_is_moved_aside_not_fatal(tmp_path):
    config = snapshot_config(tmp_path)
    (tmp_path / "state.snap").write_bytes(b"not a snapshot")
    agg = Aggregator(config, Recorder(config))
    assert (tmp_path / "state.snap.unreadable").exists()
    assert agg.batches[names.PUSH_APPLIED] == 0


# --- /metrics auth and TLS --------------------------------------------------------------------

async def test_metrics_can_require_a_token_or_basic_auth(tmp_path):
    (tmp_path / "token").write_text("scrape-token")
    (tmp_path / "password").write_text("pa:ss")
    config = Config(aggregator=AggregatorConfig(
        metrics_token_file=str(tmp_path / "token"), metrics_username="prom",
        metrics_password_file=str(tmp_path / "password")))
    target = Recorder(config)
    agg = Aggregator(config, target)
    client = TestClient(TestServer(create_app(lambda: Renderer(target, agg.families), agg)))
    await client.start_server()
    try:
        basic = base64.b64encode(b"prom:pa:ss").decode()
        wrong = base64.b64encode(b"prom:nope").decode()
        for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                                ({"Authorization": f"Basic {wrong}"}, 401),
                                ({"Authorization": "Basic !!"}, 401),
                                ({"Authorization": "Bearer scrape-token"}, 200),
                                ({"Authorization": f"Basic {basic}"}, 200)):
            response = await client.get("/metrics", headers=headers)
            assert response.status == status, headers
            if status == 401:
                assert response.headers["WWW-Authenticate"].startswith("Basic")
        assert (await client.get("/healthz")).status == 200  # probes need no credentials
    finally:
        await client.close()


def test_tls_serves_metrics_and_takes_pushes(tmp_path):
    cert, key = self_signed(tmp_path)
    config = Config(aggregator=AggregatorConfig(tls_cert_file=str(cert),
                                                tls_key_file=str(key)))
    target = Recorder(config)
    agg = Aggregator(config, target)
    renderer = Renderer(target, agg.families)
    server = ExporterServer(create_app(lambda: renderer, agg), "127.0.0.1", 0,
                            agg.access.ssl_context()).start()
    try:
        assert server.url.startswith("https://")
        base = f"https://127.0.0.1:{server.port}"
        with pytest.raises(urllib.error.URLError):  # not trusted without the CA
            urllib.request.urlopen(base + "/healthz", timeout=5)
        trusted = ssl.create_default_context(cafile=str(cert))
        assert urllib.request.urlopen(base + "/healthz", context=trusted,
                                      timeout=5).read() == b"ok\n"
        worker_config = Config(push_url=base, push=PushConfig(ca_file=str(cert)))
        rec = Recorder(worker_config)
        flusher = push.Flusher(base, worker_config, rec)
        call(rec, 4242)
        assert flusher.flush()
        flusher.close(timeout=1)
        assert sum(target.counts().rows[names.REQUESTS_TOTAL].values()) == 1
    finally:
        server.stop()


def test_serve_refuses_unusable_secrets_and_certificates(tmp_path):
    for section, key in ((dict(push_token_file=str(tmp_path / "missing")),
                          "aggregator.push_token_file"),
                         (dict(metrics_username="u", metrics_password_file=str(tmp_path)),
                          "aggregator.metrics_password_file")):
        with pytest.raises(ConfigError) as e:
            Aggregator(Config(aggregator=AggregatorConfig(**section)), Recorder())
        assert e.value.errors[0][0] == key
    (tmp_path / "bad.pem").write_text("nope")
    config = Config(aggregator=AggregatorConfig(tls_cert_file=str(tmp_path / "bad.pem"),
                                                tls_key_file=str(tmp_path / "bad.pem")))
    with pytest.raises(ConfigError):
        Aggregator(config, Recorder()).access.ssl_context()


def test_config_sections_are_validated_with_key_paths():
    config = load({"push_url": "http://agg:9469", "push": {"interval_seconds": 2,
                                                           "token_file": "/run/token"},
                   "aggregator": {"snapshot_path": "/data/state", "max_body_bytes": 2048}})
    assert config.push.interval_seconds == 2.0 and config.aggregator.max_body_bytes == 2048
    with pytest.raises(ConfigError) as e:
        load({"push": {"interval_seconds": 0, "max_pending_bytes": 10, "nope": 1}})
    assert [p for p, _ in e.value.errors] == ["push.nope", "push.interval_seconds",
                                              "push.max_pending_bytes"]  # all in one pass
    with pytest.raises(ConfigError) as e:
        load({"push": {"interval_seconds": 0, "max_pending_bytes": 10},
              "aggregator": {"tls_cert_file": "c", "metrics_username": "a:b",
                             "max_body_bytes": 1, "snapshot_interval_seconds": 0}})
    paths = {p for p, _ in e.value.errors}
    # (each error at a key the user wrote: the missing partner is named in the reason)
    assert {"push.interval_seconds", "push.max_pending_bytes", "aggregator.tls_cert_file",
            "aggregator.metrics_username", "aggregator.max_body_bytes",
            "aggregator.snapshot_interval_seconds"} == paths


def test_layout_mismatch_is_named_in_the_answer():
    target = Recorder(load({"histograms": {"seconds_buckets": [0.1, 1.0]}}))
    agg = Aggregator(target.config, target)
    worker = Recorder()
    call(worker, 1000)
    status, answer = agg.accept(body_of(worker))
    assert status == 409 and "seconds histogram layout" in answer["detail"]
