"""Faults in what workers send: batches out of order, a worker the aggregator refuses, and a
retry that arrives after the aggregator forgot its worker."""

from __future__ import annotations

import http.client
import itertools
import logging
import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from urllib.parse import urlsplit

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


def test_a_first_attempt_settles_every_earlier_batch_and_resends_are_placed_once():
    """A worker sends a batch's first attempt only once every earlier batch was settled, so a
    copy of an earlier batch arriving after it (delayed in the network) is ignored; resends
    (`retry`) arriving out of order are each applied once."""
    agg = Aggregator(Config())
    answers = [agg.accept(body(seq, 1000))[1]["applied"] for seq in (5, 3, 4, 3, 5, 1, 2, 6)]
    assert answers == [True, False, False, False, False, False, False, True]
    assert sum(agg.recorder.counts().rows[names.REQUESTS_TOTAL].values()) == 2000
    assert (agg.applied["w"].floor, agg.applied["w"].above) == (6, set())
    resends = [agg.accept(body(seq, 1000, "r", retry=True))[1]["applied"]
               for seq in (5, 3, 4, 3, 5, 1, 2)] + [agg.accept(body(6, 1000, "r"))[1]["applied"]]
    assert resends == [True, True, True, False, False, True, True, True]
    assert sum(agg.recorder.counts().rows[names.REQUESTS_TOTAL].values()) == 8000
    assert (agg.applied["r"].floor, agg.applied["r"].above) == (6, set())


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


# --- a misbehaving proxy between the worker and `ttft-exporter serve` ----------------------------

class MisbehavingProxy:
    """A loopback HTTP/1.1 proxy in front of `serve`. `mode` says what it does with each push:
    `pass` forwards it and relays the answer; `503` forwards it whole, then answers 503 with its
    own error page (a proxy whose upstream answer came too late); `reset` forwards it, then
    resets the worker's connection; `timeout` forwards it and answers nothing for `hold`
    seconds; `cut_body` resets the connection half-way through the body, forwarding nothing;
    `close_reused` forwards a request that came on a kept-alive connection, then closes it
    unanswered; `trickle` forwards the head and half the body, then nothing, and relays the
    answer. `forwarded` lists the `retry` flag of each push it forwarded (in part or whole)."""

    def __init__(self, upstream: str, hold: float = 2.0):
        self.upstream = urlsplit(upstream)
        self.mode, self.hold = "pass", hold
        self.forwarded: list[bool] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            for index in itertools.count():
                head = []
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    if line in (b"\r\n", b"\n"):
                        break
                    head.append(line.decode("latin-1"))
                headers = dict(h.split(":", 1) for h in head[1:])
                length = int(next(v for k, v in headers.items()
                                  if k.lower() == "content-length"))
                mode = self.mode
                if mode == "cut_body":
                    reader.read(length // 2)
                    return _reset(conn)
                data = reader.read(length)
                if mode == "trickle":
                    return conn.sendall(self._trickle(head[0], data))
                status, answer = self._forward(data)
                if mode == "pass" or (mode == "close_reused" and index == 0):
                    conn.sendall(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (status, len(answer), answer))
                    continue
                if mode == "503":
                    page = b"<html><body>503 upstream timed out</body></html>"
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html"
                                 b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(page), page))
                elif mode == "reset":
                    return _reset(conn)
                elif mode == "timeout":
                    time.sleep(self.hold)
                return
        except OSError:
            return
        finally:
            reader.close()
            conn.close()

    def _forward(self, data: bytes) -> tuple[int, bytes]:
        self.forwarded.append(b'"retry":true' in zlib.decompress(data))
        upstream = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                              timeout=30)
        try:
            upstream.request("POST", wire.PUSH_PATH, body=data,
                             headers={"Content-Type": wire.CONTENT_TYPE})
            response = upstream.getresponse()
            return response.status, response.read()
        finally:
            upstream.close()


    def _trickle(self, request_line: str, data: bytes) -> bytes:
        """Send `serve` the head and half the body of this push, and its answer (raw)."""
        self.forwarded.append(b'"retry":true' in zlib.decompress(data))
        with socket.create_connection((self.upstream.hostname, self.upstream.port)) as upstream:
            upstream.sendall(request_line.encode("latin-1") + b"Host: x\r\nContent-Type: "
                             + wire.CONTENT_TYPE.encode() + b"\r\nContent-Length: %d\r\n\r\n"
                             % len(data) + data[:len(data) // 2])
            upstream.settimeout(30)
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += upstream.recv(65536)
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            while len(answer) < len(head) + 4 + length:
                answer += upstream.recv(65536)
            return answer


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset (RST), as a crashing proxy or a middlebox does."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _pushed_calls(serve) -> float:
    return sum(v for (name, _), v in serve.metrics().items() if name == names.REQUESTS_TOTAL)


def _metric(serve, name: str, label: str, value: str) -> float:
    return serve.metrics().get((name, ((label, value),)), 0.0)


@pytest.mark.parametrize("mode,resend_by", [
    ("503", "flush"), ("reset", "flush"), ("timeout", "flush"), ("cut_body", "flush"),
    ("503", "close")])
def test_every_resend_is_marked_and_applied_at_most_once(tmp_path: Path, mode: str,
                                                        resend_by: str):
    """Real `serve` (room for 3 workers) behind a proxy that fails worker A's attempt in
    `mode` (after forwarding it whole, except `cut_body`). Round 1: A resends at once, marked
    `retry`: applied once (a duplicate when the proxy had forwarded it). Round 2: another
    failed attempt, then three other workers push and A's entry is evicted: A's resend (by its
    flusher, or by its last push when it stops, `resend_by`) is refused, and A counts it lost;
    A's next batch is applied. Every call is counted at most once, and exactly once unless its
    batch is the one A counted lost."""
    from tests.test_push import call
    from tests.test_push_processes import Serve

    config = tmp_path / "serve.yaml"
    config.write_text("aggregator:\n  max_workers: 3\n")
    serve = Serve(config)
    proxy = MisbehavingProxy(serve.base)
    forwards = mode != "cut_body"
    try:
        worker = Config(push_url=proxy.url, push=PushConfig(timeout_seconds=0.5))
        rec = Recorder(worker)
        a = push.Flusher(proxy.url, worker, rec)

        def failed_attempt(calls: int) -> None:
            for _ in range(calls):
                call(rec, 1000)
            proxy.mode = mode
            assert not a.flush() and a.pending() == 1
            proxy.mode = "pass"

        failed_attempt(6)  # round 1
        assert a.flush()
        assert _pushed_calls(serve) == 6
        assert _metric(serve, names.SELF_PUSH_BATCHES, "result", names.PUSH_DUPLICATE) == \
            (1 if forwards else 0)
        failed_attempt(5)  # round 2
        for other in ("b", "c", "d"):
            direct = Config(push_url=serve.base)
            rec_other = Recorder(direct)
            for _ in range(3):
                call(rec_other, 2000)
            assert push.Flusher(serve.base, direct, rec_other).flush()
        if resend_by == "flush":
            assert a.flush() and a.pending() == 0  # refused for good: given up
            call(rec, 3000)  # A's next batch, after its entry was evicted
            assert a.flush()
            expected = 6 + (5 if forwards else 0) + 9 + 1
        else:
            a.close(timeout=3)  # the flusher stops: its last push resends the batch
            expected = 6 + (5 if forwards else 0) + 9
        assert _pushed_calls(serve) == expected
        assert a.lost_total == 1
        assert _metric(serve, names.SELF_PUSH_REJECTED, "reason", names.REJECT_EVICTED) == 1
        # each round: the failed first attempt (a cut one never arrived), its resend marked
        # `retry`, then the next batches' first attempts (the flush's own drain, A's next)
        # (round 2's attempt went on a kept-alive connection: after a reset, the worker tries
        # once more at once on a fresh one, and that is a resend too)
        first = [False] if forwards else []
        again = [True] if mode == "reset" else []
        after = [False, False] if resend_by == "flush" else [False]
        assert proxy.forwarded == first + [True, False] + first + again + [True] + after
    finally:
        a.close(timeout=0)
        proxy.close()
        serve.stop()


def test_a_resend_on_a_fresh_connection_after_a_kept_alive_one_closed_is_marked(tmp_path):
    """The proxy forwards a push that came on a kept-alive connection, then closes it
    unanswered (as a server closing an idle connection would, racing the request): the worker
    resends at once on a fresh connection, marked `retry`, and it is counted once."""
    from tests.test_push import call
    from tests.test_push_processes import Serve

    config = tmp_path / "serve.yaml"
    config.write_text("{}\n")
    serve = Serve(config)
    proxy = MisbehavingProxy(serve.base)
    try:
        worker = Config(push_url=proxy.url)
        rec = Recorder(worker)
        a = push.Flusher(proxy.url, worker, rec)
        call(rec, 1000)
        assert a.flush()  # the connection is kept alive
        proxy.mode = "close_reused"
        for _ in range(4):
            call(rec, 1000)
        assert a.flush()  # forwarded, closed unanswered, resent at once: acknowledged
        assert proxy.forwarded == [False, False, True]
        assert _pushed_calls(serve) == 5
        assert _metric(serve, names.SELF_PUSH_BATCHES, "result", names.PUSH_DUPLICATE) == 1
        a.close(timeout=0)
    finally:
        proxy.close()
        serve.stop()


def test_a_push_whose_body_was_too_slow_is_resent_unmarked_and_counted_once(tmp_path: Path):
    """A push whose body trickles past `server.body_timeout_seconds` (a slow proxy) is answered
    408 saying `"applied": false` (its body never arrived whole, so nothing of it was applied):
    the worker resends it as a first attempt, not a `retry` an aggregator that evicted it
    would refuse, and it is counted once."""
    from tests.test_push import call
    from tests.test_push_processes import Serve

    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  body_timeout_seconds: 1\n")
    serve = Serve(config)
    proxy = MisbehavingProxy(serve.base)
    try:
        worker = Config(push_url=proxy.url, push=PushConfig(timeout_seconds=5))
        rec = Recorder(worker)
        a = push.Flusher(proxy.url, worker, rec)
        for _ in range(4):
            call(rec, 1000)
        proxy.mode = "trickle"
        assert not a.flush() and a.pending() == 1
        proxy.mode = "pass"
        assert a.flush() and a.pending() == 0
        # the trickled attempt, its resend (no `retry`), the flush's own drain
        assert proxy.forwarded == [False, False, False]
        assert _pushed_calls(serve) == 4
    finally:
        a.close(timeout=0)
        proxy.close()
        serve.stop()
