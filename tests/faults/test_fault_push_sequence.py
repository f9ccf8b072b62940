"""Faults in what workers send: batches out of order, a worker the aggregator refuses, and a
retry that arrives after the aggregator forgot its worker."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from exporter._internal import names
from exporter._internal.config.settings import AggregatorConfig, Config, PushConfig
from exporter._internal.demo.relay import RelayThread
from exporter._internal.fleet import push, wire
from exporter._internal.fleet.aggregator import Aggregator, Applied
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline


def body(seq: int, calls: int, worker: str = "w", retry: bool = False) -> bytes:
    rec = Recorder()
    for i in range(calls):
        t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="t")
        t.token(1000 + i)
        t.end, t.outcome = 5000, names.OK
        rec.record_call(t)
    delta = take(rec)
    delta.worker, delta.seq, delta.interval, delta.retry = worker, seq, 5.0, retry
    return wire.encode(delta, rec.schema.layouts())


def test_out_of_order_batches_are_applied_once_each():
    agg = Aggregator(Config())
    answers = [agg.accept(body(seq, 1000))[1]["applied"] for seq in (5, 3, 4, 3, 5, 1, 2, 6)]
    assert answers == [True, True, True, False, False, True, True, True]
    assert sum(agg.recorder.counts().rows[names.REQUESTS_TOTAL].values()) == 6000
    assert (agg.applied["w"].floor, agg.applied["w"].above) == (6, set())


def test_a_permanent_gap_does_not_grow_the_applied_set():
    seqs = Applied()
    for seq in range(2, 2 + 10 * Applied.MAX_ABOVE):  # seq 1 was given up by its worker
        seqs.add(seq)
    assert len(seqs.above) == 0 and seqs.floor == 1 + 10 * Applied.MAX_ABOVE
    assert 1 in seqs  # the floor stepped over the gap


def test_batches_a_worker_gives_up_are_counted_on_both_sides(tmp_path, caplog):
    """A wrong token: the aggregator counts the refused pushes, the worker counts and logs the
    batches it gives up at exit (its own exposition serves the count)."""
    from dataclasses import replace

    from exporter._internal.config.settings import AggregatorConfig, PushConfig
    from exporter._internal.expose.text import Renderer
    from tests.test_push import Aggregated, call

    token = tmp_path / "token"
    token.write_text("right")
    agg = Aggregated(Config(aggregator=AggregatorConfig(push_token_file=str(token))))
    try:
        wrong = tmp_path / "wrong"
        wrong.write_text("wrong")
        config = Config(push_url=agg.url, push=replace(PushConfig(), token_file=str(wrong)))
        rec = Recorder(config)
        flusher = push.Flusher(agg.url, config, rec)
        call(rec, 1000)
        call(rec, 2000)
        with caplog.at_level(logging.ERROR, logger="exporter.push"):
            flusher.close(timeout=0.3)  # the exit path: retried until the deadline, then given up
        assert agg.aggregator.rejected[names.REJECT_UNAUTHORIZED] >= 1  # the aggregator's side
        assert flusher.lost_total == 1 and flusher.pending() == 0  # the worker's side
        assert "gave up 1 unacknowledged batches" in caplog.text and "(2 calls)" in caplog.text
        body = Renderer(rec, flusher.families).render().decode()
        assert f"{names.SELF_PUSH_LOST} 1.0" in body
        # a rotated secret is read again on the next attempt: the batch then goes through
        rec2 = Recorder(config)
        flusher2 = push.Flusher(agg.url, config, rec2)
        call(rec2, 3000)
        assert not flusher2.flush()
        wrong.write_text("right")
        assert flusher2.flush() and agg.calls() == 1
    finally:
        agg.stop()


def test_a_retry_the_aggregator_cannot_place_is_refused_and_nothing_else():
    agg = Aggregator(Config(aggregator=AggregatorConfig(max_workers=2)))
    assert agg.accept(body(1, 10, "a", retry=True))[0] == 200  # nothing evicted yet: applied
    agg.accept(body(1, 1, "b"))
    agg.accept(body(1, 1, "c"))  # "a" is evicted
    status, answer = agg.accept(body(1, 10, "a", retry=True))  # applied before? cannot tell
    assert (status, answer["error"]) == (409, names.REJECT_EVICTED)
    assert agg.rejected[names.REJECT_EVICTED] == 1
    assert agg.accept(body(2, 10, "a"))[1]["applied"]  # a new batch of "a" is applied
    assert agg.accept(body(3, 10, "a", retry=True))[1]["applied"]  # known again: placed
    assert agg.accept(body(3, 10, "a", retry=True))[1] == {"applied": False, "seq": 3}
    assert sum(agg.recorder.counts().rows[names.REQUESTS_TOTAL].values()) == 32


def test_the_evictions_survive_a_restart(tmp_path):
    config = Config(aggregator=AggregatorConfig(max_workers=1,
                                                snapshot_path=str(tmp_path / "state")))
    agg = Aggregator(config)
    agg.accept(body(1, 1, "a"))
    agg.accept(body(1, 1, "b"))
    agg.close()
    restarted = Aggregator(config)
    assert restarted.evicted_workers == 1
    assert restarted.accept(body(1, 1, "a", retry=True))[0] == 409


@pytest.mark.parametrize("max_workers", [2, 10])
def test_a_retry_after_its_worker_was_evicted_counts_once(tmp_path: Path, max_workers: int):
    """Real processes and sockets: worker A's push reaches `ttft-exporter serve` (through a relay
    one second away) after A gave up waiting; two other workers push; A retries. With room for
    two workers, A's entry is gone: the retry is refused and A counts it lost; with room for
    ten, it is acknowledged as a duplicate. Either way every call is counted once."""
    from tests.test_push import call
    from tests.test_push_processes import Serve

    config = tmp_path / "serve.yaml"
    config.write_text(f"aggregator:\n  max_workers: {max_workers}\n")
    serve = Serve(config)
    port = int(serve.base.rsplit(":", 1)[1])

    def requests() -> float:
        return sum(v for (name, _), v in serve.metrics().items()
                   if name == names.REQUESTS_TOTAL)

    try:
        with RelayThread(port, one_way=1.0) as relay:
            slow = Config(push_url=relay.base_url, push=PushConfig(timeout_seconds=0.5))
            rec_a = Recorder(slow)
            a = push.Flusher(relay.base_url, slow, rec_a)
            for _ in range(6):
                call(rec_a, 1000)
            assert not a.flush()  # no answer within 0.5 s ...
            deadline = time.monotonic() + 10
            while requests() < 6:  # ... but the push arrives, and is applied
                assert time.monotonic() < deadline
                time.sleep(0.1)  # poll
            relay.relay.one_way = 0.0  # A's next connection is answered at once
            for worker in ("b", "c"):
                direct = Config(push_url=serve.base)
                rec = Recorder(direct)
                for _ in range(3):
                    call(rec, 2000)
                assert push.Flusher(serve.base, direct, rec).flush()
            assert a.flush()  # the retry: answered (refused, or a duplicate)
        m = serve.metrics()
        rejected = m[(names.SELF_PUSH_REJECTED, (("reason", names.REJECT_EVICTED),))]
        duplicates = m[(names.SELF_PUSH_BATCHES, (("result", names.PUSH_DUPLICATE),))]
        assert requests() == 12  # A's 6 once, B's and C's 3
        if max_workers == 2:
            assert (rejected, duplicates, a.lost_total) == (1, 0, 1)
        else:
            assert (rejected, duplicates, a.lost_total) == (0, 1, 0)
    finally:
        serve.stop()


def test_a_push_failing_inside_the_aggregator_is_answered_500_and_counted(monkeypatch):
    """A bug while applying (injected: `accept` raises): the worker gets a 500 and keeps the
    batch; the aggregator counts an internal-error drop, which TTFTExporterDroppingSamples
    reads."""
    from tests.test_push import Aggregated, call

    agg = Aggregated()
    try:
        def broken(body: bytes):
            raise RuntimeError("a bug")

        monkeypatch.setattr(agg.aggregator, "accept", broken)
        config = Config(push_url=agg.url)
        rec = Recorder(config)
        flusher = push.Flusher(agg.url, config, rec)
        call(rec, 1000)
        assert not flusher.flush() and flusher.pending() == 1
        drops = agg.recorder.counts().rows[names.SELF_DROPS]
        assert drops[(names.DROP_INTERNAL,)] == 1
    finally:
        agg.stop()
