"""A connection flood: `ttft-exporter serve` keeps serving everyone else.

The flood (from 127.0.0.2, or spread over 40 addresses) keeps 1,100 connections open that each send half a request's headers
and then nothing, and opens a new one whenever the server closes one: more than the server's
`max_connections` and than the header timeout can clear in the flood's lifetime. While it lasts,
a client on 127.0.0.1 asks /healthz and pushes (a real push worker, `Flusher`): every answer
must come, and every push must be counted once.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.fleet import push
from exporter._internal.record.recorder import Recorder
from tests.test_push import call
from tests.test_push_processes import Serve

FLOOD = 1100
ONE_SOURCE = ["127.0.0.2"]
MANY_SOURCES = [f"127.0.1.{i}" for i in range(1, 41)]  # 40 addresses, 27 connections each
HALF_HEADERS = b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Type: "


class Flood:
    """FLOOD idle half-header connections from `sources` in turn, reopened as the server
    closes them, on a thread until `stop()`."""

    def __init__(self, host: str, port: int, sources: list[str]):
        self.target = (host, port)
        self.sources = sources
        self.selector = selectors.DefaultSelector()
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
        s.bind((self.sources[self.opened % len(self.sources)], 0))
        s.settimeout(2)
        try:
            s.connect(self.target)
            s.sendall(HALF_HEADERS)
        except OSError:  # refused or reset at once: counted as closed, retried
            s.close()
            self.closed_by_server += 1
            return
        s.setblocking(False)
        self.selector.register(s, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        while not self._stopping.is_set():
            while len(self.selector.get_map()) < FLOOD and not self._stopping.is_set():
                self._open()
            self.most_open = max(self.most_open, len(self.selector.get_map()))
            self.ready.set()
            for key, _ in self.selector.select(timeout=0.05):  # closed by the server
                self.selector.unregister(key.fileobj)
                key.fileobj.close()
                self.closed_by_server += 1
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)


def healthz(base: str) -> float | None:
    """Seconds /healthz took to answer `ok`, None when it did not."""
    started = time.monotonic()
    try:
        ok = urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok\n"
    except OSError:
        return None
    return time.monotonic() - started if ok else None


@pytest.mark.parametrize("sources", [ONE_SOURCE, MANY_SOURCES], ids=["one", "many"])
def test_a_flood_does_not_starve_healthz_nor_other_pushers(tmp_path: Path, sources: list[str]):
    """From one address the flood holds `max_connections_per_client` (64) slots; from 40,
    the global `max_connections` (256), the heaviest client's oldest idle one shed first."""
    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  addr: 127.0.0.1\n")  # defaults: 256 connections, 10 s
    serve = Serve(config)
    host, port = serve.base.removeprefix("http://").rsplit(":", 1)
    flood = Flood(host, int(port), sources)
    worker_config = Config(push_url=serve.base)
    rec = Recorder(worker_config)
    flusher = push.Flusher(serve.base, worker_config, rec)
    try:
        flood.start()
        assert flood.ready.wait(30)  # the flood holds its connections
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
        during = (flood.opened, flood.closed_by_server)
        flood.stop()
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
