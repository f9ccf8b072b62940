"""Faults from the network: clients that trickle their headers or body, too many connections,
and the largest push the limits allow. The server closes what it must, counts it, and keeps
answering /healthz."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from dataclasses import replace

from exporter._internal import names
from exporter._internal.config.loader import load
from exporter._internal.config.settings import Config, ServerConfig
from exporter._internal.expose import connection_guard
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline

LIMITS = ServerConfig(max_connections=20, header_timeout_seconds=1.0, body_timeout_seconds=1.0)


def serving(config: Config = Config(), limits: ServerConfig = LIMITS
            ) -> tuple[ExporterServer, Aggregator]:
    agg = Aggregator(replace(config, server=limits))
    renderer = Renderer(agg.recorder, agg.families)
    server = ExporterServer(create_app(lambda: renderer, agg), "127.0.0.1", 0,
                            config=limits).start()
    return server, agg


def healthz(server: ExporterServer) -> bool:
    try:
        return urllib.request.urlopen(f"{server.base_url}/healthz", timeout=5).read() == b"ok\n"
    except OSError:
        return False


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True when the server closes `sock` within `within` seconds (reads EOF or a reset)."""
    sock.settimeout(within)
    try:
        return sock.recv(100) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def trickling(host: str, port: int, source: str = "127.0.0.1",
              request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ") -> socket.socket:
    """A connection from `source` that sends `request` (by default, half its headers)."""
    s = socket.socket()
    s.bind((source, 0))
    s.connect((host, port))
    s.sendall(request)
    return s


def closed_since(before: dict[str, int]) -> dict[str, int]:
    return {reason: n - before[reason] for reason, n in connection_guard.CLOSED.items()}


def test_trickling_headers_are_shed_oldest_first_then_closed_and_counted():
    before = dict(connection_guard.CLOSED)
    server, _ = serving()
    clients = []
    try:
        for _ in range(30):  # 20 may be open: each one past them sheds the oldest idle one
            clients.append(trickling("127.0.0.1", server.port))
        for s in clients[:10]:
            assert closed_by_peer(s, within=5)
        for s in clients[10:]:  # every trickling client is closed once its header time is up
            assert closed_by_peer(s, within=10)
        assert closed_since(before) == {"limit": 0, "shed": 10, "slow": 20}
        assert healthz(server)  # the slots are free again
    finally:
        for s in clients:
            s.close()
        server.stop()


def test_the_client_holding_most_connections_is_shed_first():
    before = dict(connection_guard.CLOSED)
    server, _ = serving(limits=replace(LIMITS, header_timeout_seconds=30))
    heavy = [trickling("127.0.0.1", server.port, "127.0.0.2") for _ in range(15)]
    light = [trickling("127.0.0.1", server.port) for _ in range(5)]
    try:
        time.sleep(0.3)  # (all 20 admitted)
        assert healthz(server)  # from 127.0.0.1, which holds fewer: 127.0.0.2's oldest goes
        assert closed_by_peer(heavy[0], within=5)
        assert not any(closed_by_peer(s, within=0.1) for s in heavy[1:] + light)
        assert closed_since(before)["shed"] == 1
    finally:
        for s in heavy + light:
            s.close()
        server.stop()


def test_a_new_connection_is_closed_when_every_slot_is_inside_a_handler():
    before = dict(connection_guard.CLOSED)
    server, _ = serving()
    push_head = (b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ttft-delta\r\n"
                 b"Content-Length: 1000\r\n\r\nabc")  # the body never comes: 408 after 1 s
    busy = [trickling("127.0.0.1", server.port, request=push_head) for _ in range(20)]
    guard = next(m.__self__ for m in server._app.middlewares
                 if isinstance(getattr(m, "__self__", None), connection_guard.ConnectionGuard))
    try:
        deadline = time.monotonic() + 10
        while guard.open < 20 or guard.idle:  # until all 20 handlers are reading their body
            assert time.monotonic() < deadline, (guard.open, guard.idle)
            time.sleep(0.02)  # poll
        extra = trickling("127.0.0.1", server.port)
        assert closed_by_peer(extra, within=2)
        assert closed_since(before)["limit"] == 1 and closed_since(before)["shed"] == 0
        extra.close()
    finally:
        for s in busy:
            s.close()
        server.stop()


def test_a_trickling_push_body_is_refused_with_408():
    before = connection_guard.CLOSED["slow"]
    server, agg = serving()
    try:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ttft-delta\r\n"
                  b"Content-Length: 1000\r\n\r\nabc")  # the rest never comes
        s.settimeout(10)
        answer = s.recv(1000)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert connection_guard.CLOSED["slow"] == before + 1
        s.close()
        assert sum(agg.rejected.values()) == 0 and healthz(server)
    finally:
        server.stop()


def maximal_push(config: Config) -> bytes:
    """A push at the edge of the limits: max_series series of large, sparse histograms."""
    rec = Recorder(config)
    for i in range(config.labels.max_series // 4):  # 4 histogram families per call
        t = CallTimeline(start=0, model="m", provider="p", route=f"r{i % 50}",
                         tenant=f"t{i}")
        for k in range(40):
            t.token(1_000 + (k * 7_919_171 + i * 104_729) % 3_000_000_000)
        t.end, t.outcome = 3_100_000_000, names.OK
        rec.record_call(t)
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = "big", 1, 5.0
    return wire.encode(delta, rec.schema.layouts())


def test_healthz_answers_while_the_largest_push_is_applied():
    """Pushes are validated and merged on the aggregator's own thread: while it works (held
    here on purpose, so the test does not depend on how fast the machine is), the event loop
    answers /healthz; then the largest push the limits allow is applied whole."""
    config = load({"labels": {"max_series": 4000, "max_tenants": 10_000}})
    server, agg = serving(config)
    body = maximal_push(config)
    busy, release = threading.Event(), threading.Event()
    agg.worker.submit(lambda: (busy.set(), release.wait(30)))  # the aggregator's thread is busy
    answers: list[int] = []
    try:
        def pushing() -> None:
            request = urllib.request.Request(f"{server.base_url}/push", data=body,
                                             headers={"Content-Type": wire.CONTENT_TYPE})
            answers.append(urllib.request.urlopen(request, timeout=60).status)

        assert busy.wait(10)
        thread = threading.Thread(target=pushing)
        thread.start()
        assert all(healthz(server) for _ in range(3)) and not answers  # the push waits
        release.set()
        thread.join(60)
        assert answers == [200] and agg.batches[names.PUSH_APPLIED] == 1
        assert agg.recorder.counts().series > 3000  # applied whole, within max_series
    finally:
        release.set()
        server.stop()


def test_connections_that_never_start_tls_are_shed_like_any_idle_one(tmp_path):
    """With TLS, the handshake runs behind the guard: 100 connections from 127.0.0.2 that never
    send a ClientHello hold at most `max_connections_per_client` slots (asyncio's TLS server
    kept every one of them, uncounted, for 60 s), and /healthz over TLS answers."""
    import ssl

    from exporter._internal.config.settings import AggregatorConfig
    from tests.test_aggregator import self_signed

    cert, key = self_signed(tmp_path)
    config = Config(aggregator=AggregatorConfig(tls_cert_file=str(cert), tls_key_file=str(key)))
    limits = replace(LIMITS, max_connections_per_client=5, header_timeout_seconds=30)
    agg = Aggregator(replace(config, server=limits))
    renderer = Renderer(agg.recorder, agg.families)
    server = ExporterServer(create_app(lambda: renderer, agg), "127.0.0.1", 0,
                            agg.access.ssl_context(), config=limits).start()
    before = dict(connection_guard.CLOSED)
    silent = []
    try:
        for _ in range(100):
            silent.append(trickling("127.0.0.1", server.port, "127.0.0.2", request=b""))
        assert sum(closed_by_peer(s, within=5) for s in silent[:95]) == 95
        assert not any(closed_by_peer(s, within=0.1) for s in silent[95:])
        assert closed_since(before)["shed"] == 95
        trusted = ssl.create_default_context(cafile=str(cert))
        answer = urllib.request.urlopen(f"https://127.0.0.1:{server.port}/healthz",
                                        context=trusted, timeout=5).read()
        assert answer == b"ok\n"
    finally:
        for s in silent:
            s.close()
        server.stop()
