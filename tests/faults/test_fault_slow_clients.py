"""Faults from the network: clients that trickle their headers or body, that never read the
bodies they ask for, too many connections, and the largest push the limits allow. The server
closes what it must, counts it, and keeps answering /healthz."""

from __future__ import annotations

import gzip
import json
import os
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from exporter._internal import names
from exporter._internal.config.loader import load
from exporter._internal.config.settings import Config, ServerConfig
from exporter._internal.expose import connection_guard
from exporter._internal.expose.server import ExporterServer, create_app
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import HELD_BODIES, Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline
from tests.test_push_processes import Serve

LIMITS = ServerConfig(max_connections=20, header_timeout_seconds=1.0, body_timeout_seconds=1.0)


def serving(config: Config = Config(), limits: ServerConfig = LIMITS
            ) -> tuple[ExporterServer, Aggregator]:
    agg = Aggregator(replace(config, server=limits))
    renderer = Renderer(agg.recorder, agg.families)
    server = ExporterServer(create_app(lambda: renderer, agg), "127.0.0.1", 0,
                            config=limits).start()
    return server, agg


def healthz(server: ExporterServer | Serve) -> bool:
    base = server.base_url if isinstance(server, ExporterServer) else server.base
    try:
        return urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok\n"
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
        assert closed_since(before) == {"limit": 0, "shed": 10, "slow": 20, "unread": 0, "large": 0}
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


PUSH_HEAD = (b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ttft-delta\r\n"
             b"Content-Length: 1000\r\n\r\nabc")  # the body never comes: 408 after the timeout


def test_a_new_connection_is_closed_when_every_slot_and_the_reserve_are_inside_handlers():
    """Pushes whose bodies trickle hold the 20 slots inside handlers, then the 8 reserved ones
    (which serve /push): a new connection finds none to shed and is closed at once."""
    before = dict(connection_guard.CLOSED)
    server, _ = serving(limits=replace(LIMITS, body_timeout_seconds=30))
    guard = next(m.__self__ for m in server._app.middlewares
                 if isinstance(getattr(m, "__self__", None), connection_guard.ConnectionGuard))
    busy: list[socket.socket] = []

    def inside_handlers(n: int) -> None:
        """Open connections until `n` trickle a push, and wait until every one reads its body
        (none sheddable: a connection opened while others are idle would shed them)."""
        busy.extend(trickling("127.0.0.1", server.port, request=PUSH_HEAD)
                    for _ in range(n - len(busy)))
        deadline = time.monotonic() + 10
        while guard.open < n or guard.main.sheddable or guard.reserve.sheddable:
            assert time.monotonic() < deadline, guard.open
            time.sleep(0.02)  # poll

    try:
        inside_handlers(LIMITS.max_connections)
        inside_handlers(LIMITS.max_connections + LIMITS.reserved_connections)
        assert guard.reserve.open == LIMITS.reserved_connections
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


def test_push_bodies_held_at_once_are_bounded_and_the_rest_answered_503():
    """Each connection slot could hold a body of `max_body_bytes` being read: past
    HELD_BODIES bodies' worth at once a push is refused (503, not applied, Retry-After) and
    its connection closed, so the bodies held are bounded whatever the connections; once they
    go, a push is taken again."""
    limit = 64 * 1024
    config = load({"aggregator": {"max_body_bytes": limit}})
    limits = replace(LIMITS, body_timeout_seconds=20.0)
    server, agg = serving(config, limits)
    head = (b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ttft-delta\r\n"
            b"Content-Length: %d\r\n\r\n" % limit)
    held = []
    try:
        for _ in range(HELD_BODIES):  # each sends all but one byte of its body, then waits
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(head + b"x" * (limit - 1))
            held.append(s)
        deadline = time.monotonic() + 10
        while agg.held_bytes < HELD_BODIES * (limit - 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert agg.held_bytes == HELD_BODIES * (limit - 1)
        extra = socket.create_connection(("127.0.0.1", server.port))
        extra.sendall(head + b"x" * limit)
        extra.settimeout(10)
        answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 1" in answer and b'"applied": false' in answer, answer
        assert closed_by_peer(extra, within=5)
        assert agg.held_bytes == HELD_BODIES * (limit - 1) and healthz(server)
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while agg.held_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert agg.held_bytes == 0  # a client gone mid-body gives its bytes back
        request = urllib.request.Request(f"{server.base_url}/push", data=b"not a push",
                                         headers={"Content-Type": wire.CONTENT_TYPE})
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as e:
            assert e.code == 400  # read whole and judged again: malformed, not busy
        assert agg.held_bytes == 0 and sum(agg.batches.values()) == 0
    finally:
        for s in held:
            s.close()
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


# --- against `ttft-exporter serve`: clients that never read ----------------------------------

TOKEN = "s3cret"
#: A store whose /metrics body is ~2 MB (maximal_push at this max_series).
PRELOAD_LABELS = {"max_series": 500, "max_tenants": 10_000}
#: A scrape (the scraper header: the body is written inside the handler) that wants no gzip.
NEVER_READ = (b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n"
              b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n")


def preloaded_serve(tmp_path: Path, labels: dict[str, int] = PRELOAD_LABELS,
                    **server: object) -> tuple[Serve, int]:
    """`ttft-exporter serve` (with `server` settings, a push token) holding the store
    maximal_push makes under `labels` (~2 MB of text by default), and its /metrics size."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps({  # (JSON is YAML)
        "server": {"addr": "127.0.0.1", **server}, "labels": labels,
        "aggregator": {"push_token_file": str(token)}}))
    serve = Serve(config)
    assert push_status(serve.base, maximal_push(load({"labels": labels}))) == 200
    body = urllib.request.urlopen(f"{serve.base}/metrics", timeout=30).read()
    assert len(body) > 2_000_000
    return serve, len(body)


def push_status(base: str, body: bytes, token: str = TOKEN) -> int:
    request = urllib.request.Request(f"{base}/push", data=body, headers={
        "Content-Type": wire.CONTENT_TYPE, "Authorization": f"Bearer {token}"})
    try:
        return urllib.request.urlopen(request, timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code


def host_port(serve: Serve) -> tuple[str, int]:
    host, port = serve.base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def never_reading(serve: Serve, source: str, request: bytes = NEVER_READ) -> socket.socket:
    """A client from `source` that asks for /metrics and never reads (a tiny receive buffer:
    the server's send buffer stays full)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.bind((source, 0))
    s.connect(host_port(serve))
    s.sendall(request)
    return s


def reset_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server ends `sock` within `seconds` (read nothing: the client does not)."""
    poll = select.poll()
    poll.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poll.poll(seconds * 1000))


def closed_counts(serve: Serve) -> dict[str, float]:
    return {dict(labels)["reason"]: v for (name, labels), v in serve.metrics().items()
            if name == names.SELF_HTTP_CLOSED}


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_response_left_unread_is_abandoned_after_the_write_timeout(tmp_path: Path):
    """A scrape whose client never reads was written for good inside the handler (no timer
    there): now the rest of a response that filled the send buffer must be taken within
    `server.write_timeout_seconds`, else the connection is closed and counted `unread`."""
    serve, _ = preloaded_serve(tmp_path, write_timeout_seconds=1)
    try:
        before = closed_counts(serve)
        started = time.monotonic()
        clients = [never_reading(serve, source) for source in ("127.0.0.2", "127.0.0.3")]
        assert all(reset_within(s, 10) for s in clients)
        took = time.monotonic() - started
        after = closed_counts(serve)
        assert after["unread"] - before["unread"] == 2 and 0.9 < took < 10, (took, after)
        assert healthz(serve)
        for s in clients:
            s.close()
    finally:
        serve.stop()


def test_clients_keeping_responses_unread_hold_one_body_each(tmp_path: Path):
    """200 scrapes from four addresses that never read: each address gets one render at a
    time (its next waits until that response is read, shed or timed out) and at most
    `max_waiting` scrapes wait, the rest shed; so the server holds four ~2 MB bodies, not 200
    (each of which pinned the body and a copy of its unsent part, ~0.8 GB), and a scraper from
    another address gets its whole body."""
    serve, size = preloaded_serve(tmp_path)
    clients: list[socket.socket] = []
    try:
        before = resident_bytes(serve.proc.pid)
        for i in range(200):
            clients.append(never_reading(serve, f"127.0.0.{2 + i % 4}"))
        time.sleep(3.0)  # (today's code rendered them all by then: ~20 ms a render)
        held = resident_bytes(serve.proc.pid) - before
        request = urllib.request.Request(f"{serve.base}/metrics", headers={
            "X-Prometheus-Scrape-Timeout-Seconds": "10"})
        assert len(urllib.request.urlopen(request, timeout=10).read()) > 2_000_000
        print(f"200 never-reading scrapes: the server holds {held / 2**20:.0f} MiB more "
              f"(a body is {size / 2**20:.1f} MiB)")
        # four bodies and their chunk of buffer, 264 connections' buffers, allocator slack
        assert held < 4 * size + 264 * 64 * 1024 + 32 * 2**20, held
        assert closed_counts(serve)["shed"] >= 200 - 32 - 4
    finally:
        for s in clients:
            s.close()
        serve.stop()


def test_healthz_and_push_are_answered_when_every_slot_is_inside_a_handler(tmp_path: Path):
    """20 pushes whose bodies trickle (with the token: a slow worker fleet) hold every slot of
    `max_connections` inside a handler, which no new connection can shed: a probe's /healthz
    and a worker's push take reserved slots and are answered; /metrics is not served there
    (503, counted `limit`: a render is heavy)."""
    serve, _ = preloaded_serve(tmp_path, max_connections=20, reserved_connections=4,
                               body_timeout_seconds=30)
    head = PUSH_HEAD.replace(b"Content-Length", f"Authorization: Bearer {TOKEN}\r\n"
                                                f"Content-Length".encode())
    busy = [trickling(*host_port(serve), source="127.0.0.2", request=head) for _ in range(20)]
    try:
        time.sleep(1.0)  # (every handler reading its body)
        refused = trickling(*host_port(serve), request=b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        refused.settimeout(5)
        assert refused.recv(100).startswith(b"HTTP/1.1 503"), "a reserved slot served /metrics"
        refused.close()
        started = time.monotonic()
        assert healthz(serve)
        assert push_status(serve.base, maximal_push(load({"labels": {"max_series": 8}}))) == 200
        print(f"every slot inside a handler: /healthz and a push answered in "
              f"{(time.monotonic() - started) * 1000:.0f} ms")
    finally:
        for s in busy:
            s.close()
    try:
        assert closed_counts(serve)["limit"] >= 1
    finally:
        serve.stop()


def event_loop_thread(pid: int) -> int:
    """The thread of `pid` waiting in epoll (the server's event loop: its other threads wait
    on locks)."""
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + 10
    while True:  # (until it waits: it may be serving the tick or the scrape just made)
        waiting = [int(t.name) for t in tasks.iterdir()
                   if (t / "wchan").read_text().strip() == "do_epoll_wait"]
        if len(waiting) == 1:
            return waiting[0]
        assert time.monotonic() < deadline, waiting
        time.sleep(0.05)  # poll


def cpu_seconds(pid: int, tid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_gzip_runs_off_the_event_loop_with_the_same_bytes(tmp_path: Path):
    """Twelve gzip scrapes of an ~18 MB body: compressing them takes the event loop's thread
    almost no CPU (it ran there, ~70 ms a body, while /healthz and pushes waited), and the
    compressed body is the identity body."""
    serve, size = preloaded_serve(tmp_path, {"max_series": 4000, "max_tenants": 10_000})
    try:
        loop = event_loop_thread(serve.proc.pid)
        identity = urllib.request.urlopen(f"{serve.base}/metrics", timeout=30).read()
        cpu = time.thread_time()
        gzip.compress(identity, 1)
        one_gzip = time.thread_time() - cpu
        before = cpu_seconds(serve.proc.pid, loop)
        bodies: list[bytes] = []

        def scrape() -> None:
            request = urllib.request.Request(f"{serve.base}/metrics",
                                             headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.headers["Content-Encoding"] == "gzip"
                bodies.append(response.read())

        threads = [threading.Thread(target=scrape) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        spent = cpu_seconds(serve.proc.pid, loop) - before
        print(f"12 gzip scrapes of {size / 2**20:.0f} MiB: the event loop's thread spent "
              f"{spent * 1000:.0f} ms of CPU; one gzip takes {one_gzip * 1000:.0f} ms here")
        assert len(bodies) == 12
        assert spent < 12 * one_gzip / 2, (spent, one_gzip)
        assert self_metrics_apart(gzip.decompress(bodies[-1])) == self_metrics_apart(identity)
    finally:
        serve.stop()


def self_metrics_apart(body: bytes) -> list[bytes]:
    """The body's lines but the exporter's own (the scrape's duration changes each time)."""
    return [line for line in body.splitlines() if b"ttft_exporter_" not in line]


def test_request_headers_past_32_kib_are_closed_at_once(tmp_path: Path):
    """aiohttp takes 128 headers of 16 KB: 200 clients sending 127 headers of 8 KB and never
    ending them held ~2 MiB each (~400 MiB) until the header timeout. Past 32 KiB of head, the
    connection is closed at once, counted `large`; a request with 8 KB of headers is served."""
    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  addr: 127.0.0.1\n")
    serve = Serve(config)
    host, port = host_port(serve)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%03d: %s\r\n" % (i, b"v" * 8000) for i in range(127))
    clients: list[socket.socket] = []
    try:
        before = resident_bytes(serve.proc.pid)
        for i in range(200):
            clients.append(trickling(host, port, f"127.0.0.{2 + i % 4}", request=b""))
            try:
                clients[-1].sendall(head)
            except OSError:  # closed while sending: what is tested
                pass
        assert all(reset_within(s, 10) for s in clients)
        held = resident_bytes(serve.proc.pid) - before
        assert held < 32 * 2**20, held
        assert closed_counts(serve)["large"] == 200
        request = urllib.request.Request(f"{serve.base}/healthz", headers={"X-Big": "v" * 8000})
        assert urllib.request.urlopen(request, timeout=5).read() == b"ok\n"
    finally:
        for s in clients:
            s.close()
        serve.stop()
