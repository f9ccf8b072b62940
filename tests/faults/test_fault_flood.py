"""A connection flood: `ttft-exporter serve` keeps serving everyone else.

Two floods, each keeping ~1,000 connections open and opening a new one whenever the server
closes one: more than the server's `max_connections`, and than its timeouts can clear in the
flood's lifetime. The idle flood sends half a request's headers and then nothing (from
127.0.0.2, or spread over 40 addresses). The never-reading flood asks for a multi-MB /metrics
body and never reads a byte of it (a tiny receive buffer), from eight addresses or 40. While
either lasts, a client on 127.0.0.1 asks /healthz and pushes (a real push worker, `Flusher`,
with the right token when the server requires one): every answer must come (under the
never-reading flood within a liveness probe's 1 s), and every push must be counted once. The
floods run in a child process, as an attack comes from elsewhere.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from exporter._internal import names
from exporter._internal.config.settings import Config, PushConfig
from exporter._internal.fleet import push
from exporter._internal.record.recorder import Recorder
from tests.faults.test_fault_slow_clients import NEVER_READ, preloaded_serve, resident_bytes
from tests.test_push import call
from tests.test_push_processes import Serve

FLOOD = 1100
ONE_SOURCE = ["127.0.0.2"]
MANY_SOURCES = [f"127.0.1.{i}" for i in range(1, 41)]  # 40 addresses, 27 connections each
EIGHT_SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
HALF_HEADERS = b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: "
#: The server closed the connection (a reset or its end), never data to read: a client that
#: does not read is told only of that.
CLOSED = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


class Flood:
    """`size` connections from `sources` in turn, each sending `request` and reading nothing,
    reopened as the server closes them, on a thread until `stop()`. `rcvbuf` shrinks each
    one's receive buffer (a client that never reads holds the server's send buffer full)."""

    def __init__(self, host: str, port: int, sources: list[str], request: bytes = HALF_HEADERS,
                 size: int = FLOOD, rcvbuf: int | None = None):
        self.target = (host, port)
        self.sources = sources
        self.request = request
        self.size = size
        self.rcvbuf = rcvbuf
        self.epoll = select.epoll()
        self.sockets: dict[int, socket.socket] = {}
        self.opened = 0
        self.closed_by_server = 0
        self.most_open = 0
        self._stopping = threading.Event()
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Flood":
        self._thread.start()
        return self

    def _open(self) -> None:
        s = socket.socket()
        if self.rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        s.bind((self.sources[self.opened % len(self.sources)], 0))
        s.settimeout(2)
        try:
            s.connect(self.target)
            s.sendall(self.request)
        except OSError:  # refused or reset at once: counted as closed, retried
            s.close()
            self.closed_by_server += 1
            return
        s.setblocking(False)
        self.epoll.register(s.fileno(), CLOSED)
        self.sockets[s.fileno()] = s
        self.opened += 1

    def _run(self) -> None:
        while not self._stopping.is_set():
            while len(self.sockets) < self.size and not self._stopping.is_set():
                self._open()
            self.most_open = max(self.most_open, len(self.sockets))
            self.ready.set()
            for fd, _ in self.epoll.poll(0.05):  # closed by the server
                self.epoll.unregister(fd)
                self.sockets.pop(fd).close()
                self.closed_by_server += 1
        for s in self.sockets.values():
            s.close()
        self.epoll.close()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)


class FloodProcess:
    """A `Flood` run by a child process, as an attack comes from elsewhere: the test's own
    requests then do not wait for the flood's thread to give up the GIL."""

    def __init__(self, *args, **kwargs):
        context = multiprocessing.get_context("fork")
        self._ready, self._stop = context.Event(), context.Event()
        self._results, child_end = context.Pipe(duplex=False)
        self._process = context.Process(target=self._run, args=(child_end, args, kwargs),
                                        daemon=True)
        self.opened = self.closed_by_server = self.most_open = 0

    def _run(self, results, args, kwargs) -> None:
        flood = Flood(*args, **kwargs).start()
        if flood.ready.wait(30):
            self._ready.set()
        self._stop.wait()
        flood.stop()
        results.send((flood.opened, flood.closed_by_server, flood.most_open))

    def start(self) -> "FloodProcess":
        self._process.start()
        return self

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def stop(self) -> None:
        """Stop the flood (its connections closed) and read what it did."""
        if self._process.pid is None or self._stop.is_set():
            return
        self._stop.set()
        if self._results.poll(30):
            self.opened, self.closed_by_server, self.most_open = self._results.recv()
        self._process.join(10)


def healthz(base: str) -> float | None:
    """Seconds /healthz took to answer `ok`, None when it did not."""
    started = time.monotonic()
    try:
        ok = urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok\n"
    except OSError:
        return None
    return time.monotonic() - started if ok else None


def slowest(answers: list[float | None]) -> str:
    if None in answers:
        return f"{answers.count(None)} unanswered"
    return f"{max(answers) * 1000:.0f} ms"


def median(answers: list[float | None]) -> str:
    answered = sorted(a for a in answers if a is not None)
    return f"{answered[len(answered) // 2] * 1000:.0f} ms" if answered else "none"


@pytest.mark.parametrize("sources", [ONE_SOURCE, MANY_SOURCES], ids=["one", "many"])
def test_a_flood_does_not_starve_healthz_nor_other_pushers(tmp_path: Path, sources: list[str]):
    """From one address the flood holds `max_connections_per_client` (64) slots; from 40,
    the global `max_connections` (256), the heaviest client's oldest idle one shed first."""
    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  addr: 127.0.0.1\n")  # defaults: 256 connections, 10 s
    serve = Serve(config)
    host, port = serve.base.removeprefix("http://").rsplit(":", 1)
    flood = FloodProcess(host, int(port), sources)
    worker_config = Config(push_url=serve.base)
    rec = Recorder(worker_config)
    flusher = push.Flusher(serve.base, worker_config, rec)
    try:
        flood.start()
        assert flood.wait_ready(30)  # the flood holds its connections
        answers: list[float | None] = []
        pushed: list[bool] = []
        fds: list[int] = []  # the server's open descriptors
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # measured while the flood lasts
            answers.append(healthz(serve.base))
            call(rec, 1000)
            pushed.append(flusher.flush())
            fds.append(len(os.listdir(f"/proc/{serve.proc.pid}/fd")))
        flood_seconds = time.monotonic() - started
        flood.stop()
        during = (flood.opened, flood.closed_by_server)
        m = serve.metrics()
        slowest = max((a for a in answers if a is not None), default=0.0)
        print(f"flood: {during[0]} connections opened, {during[1]} closed by the server; "
              f"{len(answers)} /healthz in {flood_seconds:.1f} s ({answers.count(None)} "
              f"unanswered, slowest {slowest * 1000:.0f} ms); {sum(pushed)}/{len(pushed)} "
              f"pushes acknowledged; the server held at most {max(fds)} descriptors")
        assert all(a is not None for a in answers), answers
        assert all(pushed) and len(pushed) >= 3
        requests = sum(v for (name, _), v in m.items() if name == names.REQUESTS_TOTAL)
        assert requests == len(pushed)  # each push counted once
        closed = {dict(labels)["reason"]: v for (name, labels), v in m.items()
                  if name == names.SELF_HTTP_CLOSED}
        assert closed["shed"] >= FLOOD // 2  # the flood was shed (counted), its oldest first
        assert flood.most_open >= FLOOD - 1
        # The flood's held connections, the accept bursts in flight, and the rest of the
        # process. asyncio accepts at most one listen backlog (128) per loop pass; a burst's
        # transports are made one pass later, its connection_made sheds the oldest idle
        # connections the pass after, and their descriptors close on the third: up to three
        # bursts are open beyond the held ones when /proc is read (CI saw 416 of 448).
        held = 64 if sources == ONE_SOURCE else 256
        assert max(fds) < held + 3 * 128 + 40  # (not the 1,100 of the flood)
    finally:
        flood.stop()
        flusher.close(timeout=0)
        serve.stop()


@pytest.mark.flaky(reruns=2, reruns_delay=1)  # (a bound on time, on a shared 2-core machine)
@pytest.mark.parametrize("sources", [EIGHT_SOURCES, MANY_SOURCES], ids=["eight", "many"])
def test_never_reading_scrapers_leave_healthz_and_pushes_answered_within_a_second(
        tmp_path: Path, sources: list[str]):
    """1,000 connections from eight addresses (or 40) each ask for a ~2 MB /metrics body with
    the scraper header and never read it, reopened as the server closes them. Their responses
    are shed (the heaviest client's oldest first) or abandoned after
    `server.write_timeout_seconds`; /healthz and a worker's push (with its token) from 127.0.0.1
    get a slot and are answered within 1 s each, the push counted once; the server's memory
    stays within its caps. From more addresses than `server.max_unread_responses` (8), each
    response taken back frees its address for another render: the renders are spaced and a
    paused address gets none (render_turns.py), else they ran back to back and held the GIL."""
    serve, size = preloaded_serve(tmp_path)
    host, port = serve.base.removeprefix("http://").rsplit(":", 1)
    token = tmp_path / "token"  # (the one the server requires)
    flood = FloodProcess(host, int(port), sources, NEVER_READ, size=1000, rcvbuf=1024)
    worker_config = Config(push_url=serve.base, push=PushConfig(token_file=str(token)))
    rec = Recorder(worker_config)
    flusher = push.Flusher(serve.base, worker_config, rec)
    resident = [resident_bytes(serve.proc.pid)]
    try:
        flood.start()
        assert flood.wait_ready(30)  # the flood holds its connections
        health: list[float | None] = []
        pushes: list[float | None] = []
        started = time.monotonic()
        while time.monotonic() - started < 4.0:  # measured while the flood lasts
            health.append(healthz(serve.base))
            call(rec, 1000)
            began = time.monotonic()
            pushes.append(time.monotonic() - began if flusher.flush() else None)
            resident.append(resident_bytes(serve.proc.pid))
        flood.stop()
        during = (flood.opened, flood.closed_by_server, flood.most_open)
        m = serve.metrics()
        closed = {dict(labels)["reason"]: v for (name, labels), v in m.items()
                  if name == names.SELF_HTTP_CLOSED}
        answered = [a for a in health + pushes if a is not None]
        print(f"never-reading flood: {during[0]} connections opened, {during[1]} closed by the "
              f"server, at most {during[2]} open; closed by reason {closed}; {len(health)} "
              f"/healthz (median {median(health)}, slowest {slowest(health)}), {len(pushes)} "
              f"pushes (median {median(pushes)}, slowest {slowest(pushes)}); resident "
              f"{resident[0] / 2**20:.0f} MiB before, at most {max(resident) / 2**20:.0f} MiB; "
              f"body {size / 2**20:.1f} MiB")
        assert None not in health and None not in pushes, (health, pushes)
        assert max(answered) < 1.0, (health, pushes)
        requests = sum(v for (name, labels), v in m.items()
                       if name == names.REQUESTS_TOTAL and dict(labels)[names.ROUTE] == "r")
        assert requests == len(pushes)  # each push counted once
        assert during[2] >= 990 and closed["shed"] + closed["unread"] >= 500
        # a body and its chunk of buffer per address (8) and two renders in the making; every
        # slot's buffers at most (a request head of 32 KiB held twice); allocator slack
        assert max(resident) - resident[0] < 10 * size + 264 * 68 * 1024 + 32 * 2**20
    finally:
        flood.stop()
        flusher.close(timeout=0)
        serve.stop()
