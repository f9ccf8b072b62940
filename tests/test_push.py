"""Worker side of push: the HDR V2 codec, the wire format, draining the recorder, and the
flusher's behaviour."""

from __future__ import annotations

import base64
import json
import random
import socket
import struct
import threading
import time
import zlib
from dataclasses import replace

import pytest
from hdrh.histogram import HdrHistogram

import exporter
from exporter._internal import names, runtime
from exporter._internal.config.settings import Config, PushConfig
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import codec as hdr_codec, push, validate, wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.histogram import Histogram, Layout
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

HOUR_US = 3_600_000_000


def call(rec: Recorder, ttft_us: int, tenant: str = "t", model: str = "m",
         outcome: str = "ok", trace_id: str | None = None) -> None:
    t = CallTimeline(start=0, model=model, provider="p", route="r", tenant=tenant,
                     trace_id=trace_id)
    t.token(ttft_us * 1000)
    t.token(ttft_us * 1000 + 2_000_000)
    t.end = ttft_us * 1000 + 3_000_000
    t.outcome = outcome
    t.input_tokens, t.output_tokens = 100, 2
    rec.record_call(t)


# --- codec -----------------------------------------------------------------------------------

def sample_hist(seed: int = 1, n: int = 3000) -> Histogram:
    layout = Layout(HOUR_US, 2, [5_000, 2_000_000, 10_000_000])
    rng = random.Random(seed)
    h = Histogram(layout)
    h.record_many([int(rng.lognormvariate(13, 1.5)) for _ in range(n)] + [0, 1, 2_000_000,
                                                                         5 * HOUR_US])
    return h


def test_v2_encoding_is_read_by_the_reference_hdrhistogram():
    h = sample_hist()
    raw = hdr_codec.encode_hist(h)
    compressed = zlib.compress(raw)
    wrapped = base64.b64encode(struct.pack(">II", 0x1C849314, len(compressed)) + compressed)
    reference = HdrHistogram.decode(wrapped)
    assert list(reference.counts) == list(h.to_hdrh().counts)
    assert reference.total_count == h.count


def test_reference_v2_encoding_decodes_to_the_same_counts():
    h = sample_hist(2)
    encoded = base64.b64decode(h.to_hdrh().encode())
    decoded = hdr_codec.decode_hist(h.layout, zlib.decompress(encoded[8:]))
    assert list(decoded.nonzero()) == list(h.nonzero())
    assert decoded.count == h.count


def test_large_counts_use_nine_byte_varints_and_survive():
    layout = Layout(HOUR_US, 2)
    h = Histogram(layout)
    h.record_many([1000, 2000])
    big = Histogram(layout)
    big._counts = __import__("array").array("Q", [2**62, 0, 0, 2**40])
    big._lo = 500
    big.count = 2**62 + 2**40
    for hist in (h, big):
        back = hdr_codec.decode_hist(layout, hdr_codec.encode_hist(hist))
        assert list(back.nonzero()) == list(hist.nonzero()) and back.count == hist.count


@pytest.mark.parametrize("cut", [1, 5, 39, 41])
def test_truncated_or_corrupt_hdr_is_a_push_error(cut):
    h = sample_hist(3)
    raw = hdr_codec.encode_hist(h)
    with pytest.raises(hdr_codec.MalformedHdr):
        hdr_codec.decode_hist(h.layout, raw[:-cut] if cut < 40 else raw[:cut])
    with pytest.raises(hdr_codec.IncompatibleHdr):
        hdr_codec.decode_hist(Layout(HOUR_US, 3), raw)  # another precision
    bad_cookie = b"\x00" + raw[1:]
    with pytest.raises(hdr_codec.MalformedHdr):
        hdr_codec.decode_hist(h.layout, bad_cookie)


def test_counts_carry_count_exact_sum_and_straddle_counts():
    h = sample_hist(4)
    counts = base64.b64encode(hdr_codec.encode_counts(h)).decode()
    back = validate._read_hist(h.layout, counts, h.count, h.total)
    validate._read_straddles(h.layout, [[0, p, n] for p, n in h.at_or_below.items()], [back])
    full = back.to_histogram()
    assert full.total == h.total and full.cumulative_at() == h.cumulative_at()
    assert list(full.nonzero()) == list(h.nonzero())
    # the counts plus the layout's V2 header are a standard encoding
    raw = base64.b64decode(counts)
    assert hdr_codec.v2_header(h.layout, len(raw)) + raw == hdr_codec.encode_hist(h)
    with pytest.raises(wire.PushError):  # a sum its buckets cannot produce
        validate._read_hist(h.layout, counts, h.count, 0)
    (pos, n), = list(h.at_or_below.items())[:1]
    with pytest.raises(wire.PushError):  # a straddle count above its bucket
        validate._read_straddles(h.layout, [[0, pos, h.count + 1]],
                             [validate._read_hist(h.layout, counts, h.count, h.total)])
    truncated = base64.b64encode(raw[:-2]).decode()
    with pytest.raises(wire.PushError):  # the counts no longer add up to the count
        validate._read_hist(h.layout, truncated, h.count, h.total)


# --- drain --------------------------------------------------------------------------------------

def test_drain_takes_everything_once_and_leaves_zeros():
    rec = Recorder()
    for i in range(300):
        call(rec, 1000 + 37 * i, tenant=f"t{i % 3}", trace_id=f"trace{i}")
    started = rec.started("m", "p", "r")
    delta = take(rec)
    assert sum(delta.rows[names.REQUESTS_TOTAL].values()) == 300
    ttft = {k: h for k, h in delta.histograms.items() if k[0] == names.TTFT.name}
    assert sum(h.count for h in ttft.values()) == 300
    assert delta.rows[names.REQUESTS_IN_FLIGHT] == {started: 1}
    assert any(delta.exemplars.values())
    again = take(rec)
    assert not again.histograms and not again.rows[names.REQUESTS_TOTAL]
    assert again.rows[names.REQUESTS_IN_FLIGHT] == {started: 1}
    call(rec, 5000)
    third = take(rec)
    assert sum(h.count for k, h in third.histograms.items() if k[0] == names.TTFT.name) == 1


def test_drain_is_one_short_lock_hold(monkeypatch):
    """The app's threads wait for pointer swaps only: the HDR folding runs after the lock."""
    rec = Recorder()
    for i in range(20_000):
        call(rec, 1000 + i, tenant=f"t{i % 50}")
    acquisitions, folded_under_lock = [], []
    original_acquire, original_bucketize = rec._acquire, Layout.bucketize

    def acquire():
        acquisitions.append(1)
        return original_acquire()

    def bucketize(layout, values):
        folded_under_lock.append(rec._lock.locked())
        return original_bucketize(layout, values)

    monkeypatch.setattr(rec, "_acquire", acquire)
    monkeypatch.setattr(Layout, "bucketize", bucketize)
    delta = take(rec)
    assert len(acquisitions) == 1  # one lock hold
    assert folded_under_lock and not any(folded_under_lock)  # every fold after it
    assert sum(h.count for k, h in delta.histograms.items() if k[0] == names.TTFT.name) == 20_000


# --- the flusher against a real aggregator -----------------------------------------------------

class Aggregated:
    """An in-process aggregator (`create_app` + `Aggregator`) on a loopback port."""

    def __init__(self, config: Config | None = None, port: int = 0):
        self.config = config or Config()
        self.recorder = Recorder(self.config)
        self.aggregator = Aggregator(self.config, self.recorder)
        self.renderer = Renderer(self.recorder)
        self.server = ExporterServer(create_app(lambda: self.renderer, self.aggregator),
                                     "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def calls(self) -> int:
        return sum(self.recorder.counts().rows[names.REQUESTS_TOTAL].values())

    def stop(self) -> None:
        self.server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flusher_pushes_and_the_aggregator_counts_exactly():
    agg = Aggregated()
    try:
        config = Config(push_url=agg.url)
        rec = Recorder(config)
        flusher = push.Flusher(agg.url, config, rec)
        for i in range(100):
            call(rec, 2000 + i)
        assert flusher.flush()
        for i in range(50):
            call(rec, 9000 + i)
        flusher.close(timeout=2)
        assert agg.calls() == 150
        assert agg.aggregator.batches[names.PUSH_APPLIED] == 2
        assert flusher.worker not in agg.aggregator.gauges  # the last push said final
    finally:
        agg.stop()


def test_unacknowledged_deltas_are_kept_merged_and_resent_in_order():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = Config(push_url=url, push=PushConfig(timeout_seconds=1))
    rec = Recorder(config)
    flusher = push.Flusher(url, config, rec)
    for round_ in range(5):  # aggregator down: the head stays, later drains merge into one tail
        for i in range(10):
            call(rec, 1000 * (round_ + 1) + i)
        assert not flusher.flush()
    assert flusher.pending() == 2
    agg = Aggregated(port=port)
    try:
        assert flusher.flush()
        assert agg.calls() == 50
        assert agg.aggregator.batches[names.PUSH_APPLIED] == 2
        assert agg.aggregator.push_failures == 5  # reported with the next push
        ttft = agg.recorder.families[names.TTFT.name]
        assert sum(s.hist.count for s in ttft.series.values()) == 50
    finally:
        flusher.close(timeout=0)
        agg.stop()


def test_a_retry_of_an_applied_batch_is_not_counted_twice():
    agg = Aggregated()
    try:
        config = Config(push_url=agg.url)
        rec = Recorder(config)
        flusher = push.Flusher(agg.url, config, rec)
        call(rec, 1234)
        flusher._collect(final=False)
        batch = flusher._pending[0]
        for _ in range(3):  # the ack was lost: the worker sends the same batch again
            assert flusher._post(batch).status == 200
        assert agg.calls() == 1
        assert agg.aggregator.batches == {names.PUSH_APPLIED: 1, names.PUSH_DUPLICATE: 2}
    finally:
        agg.stop()


def test_queue_bound_drops_the_oldest_and_counts_it():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # bypass validation to make the bound tiny: every batch is over it
    config = Config(push_url=url, push=PushConfig(timeout_seconds=1, max_pending_bytes=1))
    rec = Recorder(config)
    flusher = push.Flusher(url, config, rec)
    for round_ in range(4):
        call(rec, 1000 + round_)
        flusher.flush()
        flusher._pending[-1].attempted = True  # no merging: one batch per drain
    assert flusher.pending() == 1  # only the newest is kept
    # 3 dropped: the count travels with the next batches (and is re-added if they drop too)
    assert flusher._lost + flusher._pending[0].delta.lost_batches == 3
    agg = Aggregated(port=port)
    try:
        with flusher._lock:
            flusher._send_pending()
        assert agg.calls() == 1  # the newest batch's call
        flusher.config = replace(config, push=PushConfig())
        flusher.close(timeout=2)
        assert agg.aggregator.lost_batches == 3
    finally:
        agg.stop()


def test_a_rejected_batch_is_dropped_and_counted_not_retried_forever():
    agg = Aggregated(Config(histograms=replace(Config().histograms, significant_digits=3)))
    try:
        config = Config(push_url=agg.url)
        rec = Recorder(config)
        flusher = push.Flusher(agg.url, config, rec)
        call(rec, 1000)
        assert flusher.flush()  # 409: another layout. Dropped, nothing left to retry
        assert flusher._lost == 1
        assert agg.aggregator.rejected[names.REJECT_INCOMPATIBLE] == 1
    finally:
        agg.stop()


def test_a_hanging_aggregator_never_slows_the_app_nor_configure():
    """The socket accepts but never answers: the flusher waits, recording and configure() do
    not (neither needs the flusher's lock nor the network)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(30)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    conn = None
    try:
        exporter.configure({"push_url": url, "push": {"interval_seconds": 0.05,
                                                      "timeout_seconds": 60}})
        flusher = runtime.current_flusher()
        assert flusher is not None
        rec = runtime.state().recorder
        call(rec, 1000)
        conn, _ = listener.accept()  # the flusher connected and is sending its POST
        conn.settimeout(30)
        assert conn.recv(65536).startswith(b"POST /push")
        assert flusher._lock.locked()  # it waits for an answer that never comes
        for i in range(2000):  # recording needs neither the flusher's lock nor the network
            call(rec, 1000 + i)
        done = threading.Event()

        def reconfigure():
            runtime.configure(None)  # retires the flusher: its own thread makes the last push
            done.set()

        threading.Thread(target=reconfigure, daemon=True).start()
        assert done.wait(20), "configure() waited for the hanging aggregator"
        assert flusher._lock.locked()  # the POST is still unanswered
        assert runtime.current_flusher() is None
        # the first one is being sent
        assert sum(rec.counts().rows[names.REQUESTS_TOTAL].values()) == 2000
    finally:
        runtime.configure(None)
        if conn is not None:
            conn.close()  # the retired flusher's POST fails now; its thread ends
        listener.close()


def test_configure_and_env_var_turn_push_on_and_off(monkeypatch):
    agg = Aggregated()
    try:
        exporter.configure({"push_url": agg.url, "push": {"interval_seconds": 0.05}})
        flusher = runtime.current_flusher()
        assert flusher is not None and flusher.url == agg.url
        with exporter.track(model="m", provider="p", route="r", tenant="t") as c:
            c.token()
        deadline = time.monotonic() + 5
        while agg.calls() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert agg.calls() == 1
        runtime.configure(None)
        assert runtime.current_flusher() is None
        monkeypatch.setenv(push.ENV_URL, agg.url)
        runtime.configure(None)
        assert runtime.current_flusher() is not None
        assert runtime.current_flusher().worker != flusher.worker
        monkeypatch.delenv(push.ENV_URL)
        runtime.configure(None)
        assert runtime.current_flusher() is None
    finally:
        agg.stop()


def test_payload_is_compressed_json_with_the_documented_fields():
    rec = Recorder()
    call(rec, 1500, trace_id="abc")
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = "w", 1, 5.0
    doc = json.loads(zlib.decompress(wire.encode(delta, rec.schema.layouts())))
    assert doc["format"] == "ttft-exporter-delta" and doc["version"] == 1
    assert set(doc) == {"format", "version", "worker", "seq", "interval", "final", "layouts",
                        "labels", "histograms", "straddles", "exemplars", "requests",
                        "in_flight", "tenant_folds", "label_folds", "counters", "dropped",
                        "lost_batches", "push_failures", "input_tokens", "cached_tokens",
                        "upstreams"}
    ref, counts, count, total = doc["histograms"][names.TTFT.name]
    assert doc["labels"][ref] == ["m", "p", "r", "t"] and count == 1 and total == 1500
    assert doc["exemplars"][names.TTFT.name][0][2] == "abc"
    assert doc["requests"] == [["m", "ok", "p", "r", "t", 1]]
    assert doc["input_tokens"] == [["m", "p", "r", "t", 100]] and doc["cached_tokens"] == []


def test_token_is_sent_from_file_or_env(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    agg_config = Config(aggregator=replace(Config().aggregator, push_token_file=str(token)))
    agg = Aggregated(agg_config)
    try:
        for push_config, env in ((PushConfig(token_file=str(token)), None),
                                 (PushConfig(), "s3cret"), (PushConfig(), None)):
            if env:
                monkeypatch.setenv(push.ENV_TOKEN, env)
            else:
                monkeypatch.delenv(push.ENV_TOKEN, raising=False)
            config = Config(push_url=agg.url, push=push_config)
            rec = Recorder(config)
            flusher = push.Flusher(agg.url, config, rec)
            call(rec, 1000)
            assert flusher.flush() is (env is not None or push_config.token_file != "")
            flusher.close(timeout=0)
        assert agg.calls() == 2
        assert agg.aggregator.rejected[names.REJECT_UNAUTHORIZED] >= 1
    finally:
        agg.stop()


def test_flusher_thread_pushes_on_its_own():
    agg = Aggregated()
    try:
        config = Config(push_url=agg.url, push=PushConfig(interval_seconds=0.05))
        rec = Recorder(config)
        flusher = push.Flusher(agg.url, config, rec).start()
        stop = threading.Event()

        def app_thread():
            i = 0
            while not stop.is_set():
                call(rec, 1000 + i)
                i += 1
                time.sleep(0.001)
            return i

        t = threading.Thread(target=app_thread)
        t.start()
        deadline = time.monotonic() + 30
        while agg.aggregator.batches[names.PUSH_APPLIED] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # poll: the flusher pushes every 50 ms on its own
        stop.set()
        t.join()
        flusher.close(timeout=2)
        total = agg.calls()
        assert total > 50 and agg.aggregator.batches[names.PUSH_APPLIED] >= 3
        ttft = agg.recorder.families[names.TTFT.name]
        assert sum(s.hist.count for s in ttft.series.values()) == total
    finally:
        agg.stop()


def test_counts_codec_round_trips_random_histograms():
    """Every mix of short and long runs, single- and multi-byte counts and zero runs."""
    rng = random.Random(8)
    layout = Layout(HOUR_US, 2)
    for _ in range(150):
        h = Histogram(layout)
        for _ in range(rng.randint(1, 40)):
            value = rng.choice([rng.randint(0, 200), int(rng.lognormvariate(10, 3))])
            h.record_many([min(value, 10 * HOUR_US)] * rng.choice([1, 2, 63, 64, 65, 300,
                                                                  9000]))
        back = hdr_codec.decode_hist(layout, hdr_codec.encode_hist(h))
        assert list(back.nonzero()) == list(h.nonzero()) and back.count == h.count
        assert list(back.to_histogram().nonzero()) == list(h.nonzero())


def test_push_benchmark_runs_quick():
    """bench/push.py runs (tiny sizes, no timing assertion), so it never rots."""
    from bench.push import run

    lines = run(quick=True)
    assert lines[0].startswith("| figure |")
    assert any("aggregator CPU" in line for line in lines)
    assert any("payload bytes per series" in line for line in lines)
