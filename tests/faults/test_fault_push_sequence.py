"""Faults in what workers send: batches out of order, and a worker the aggregator refuses."""

from __future__ import annotations

import logging

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.fleet import push, wire
from exporter._internal.fleet.aggregator import Aggregator, Applied
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline


def body(seq: int, calls: int) -> bytes:
    rec = Recorder()
    for i in range(calls):
        t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="t")
        t.token(1000 + i)
        t.end, t.outcome = 5000, names.OK
        rec.record_call(t)
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = "w", seq, 5.0
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
