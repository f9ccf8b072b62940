"""The push worker role: send this process's HDR deltas to `ttft-exporter serve`.

A daemon thread (the flusher) wakes every `push.interval_seconds`, takes what the recorder holds
since its previous visit (take.py: one lock hold of pointer swaps; the HDR indexing of pending
values runs afterwards on the flusher thread), and POSTs it in the wire format (wire.py)
to `<push_url>/push` with the worker's id and a per-worker sequence number. The aggregator merges
it exactly and answers 200; a batch it has already applied is acknowledged again and ignored, so
a retry never counts twice. A batch one of whose attempts reached a connection without a
definite answer (a timeout, a reset at any point of the body, a proxy's 503 or 502, which may
come after the proxy forwarded the body, a kept-alive connection found closed) may have been
applied: from then on every resend of it is marked `retry`, and an aggregator that has forgotten
this worker (evicted from its bounded map) refuses it with 409 rather than apply it twice; the
worker then gives it up and counts it, like any batch refused for good. Only an attempt that
never connected, or an answer of the aggregator itself saying `"applied": false`, leaves a
batch unmarked. A batch's first attempt is sent only once every earlier batch was acknowledged
or given up, which lets the aggregator ignore a late copy of an earlier one.

Nothing here runs on the app's threads or raises into them, and nothing here waits on the
network on a caller's behalf: when the process stops pushing (configure() turned it off or
changed it), the flusher's own thread makes the last push (`retire()`). Batches not yet
acknowledged stay queued and are resent in order with exponential backoff; while the head of the
queue is being retried, new drains are merged into one tail batch that has never been sent
(merging deltas is exact), so an outage costs memory in proportion to the label cardinality,
not to its length. The queue is bounded by `push.max_pending_bytes`: past it the oldest batch is
dropped and counted (`lost_batches`, served by the aggregator as
`ttft_exporter_push_lost_batches_total`).

When a process pushes, and what happens at exit and fork, is decided in runtime.py.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import secrets
import select
import socket
import ssl
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.core import Metric

from ..config.settings import Config
from ..expose.self_metrics import PUSH_FAILURES, PUSH_LOST, family
from ..record.store import Store
from .take import take
from .wire import CONTENT_TYPE, PUSH_PATH, Delta, encode

log = logging.getLogger("exporter.push")

ENV_URL = "TTFT_EXPORTER_PUSH_URL"
ENV_TOKEN = "TTFT_EXPORTER_PUSH_TOKEN"


def push_url(config: Config) -> str:
    """The URL this process pushes to: the env var wins over the config; '' when off."""
    return os.environ.get(ENV_URL, "").strip() or config.push_url


def new_worker_id() -> str:
    host = "".join(ch for ch in socket.gethostname() if ch.isprintable())[:60] or "host"
    return f"{host}/{os.getpid()}/{secrets.token_hex(4)}"


@dataclass
class _Batch:
    seq: int
    delta: Delta
    body: bytes
    attempted: bool = False


@dataclass
class _Attempt:
    """What one POST came to: `status` 0 when no answer (`timed_out`: none within
    push.timeout_seconds); `connected` when the request may have reached the aggregator (a
    connection was open), `refused` when the aggregator itself answered that it did not apply
    it."""

    status: int
    detail: str
    connected: bool
    refused: bool = False
    timed_out: bool = False


#: HTTP answers after which resending the same batch cannot succeed: drop it (and count it).
_PERMANENT = frozenset({400, 404, 405, 409, 413, 415, 422})


class Flusher:
    """One per pushing process: drains the recorder every interval and pushes the deltas."""

    def __init__(self, url: str, config: Config, recorder: Store):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"push URL must be http(s)://host[:port][/path], got {url!r}")
        self.url = url
        self.config = config
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path.rstrip("/") + PUSH_PATH
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            self._ssl = ssl.create_default_context(cafile=config.push.ca_file or None)
        self._token = _read_token(config.push.token_file)
        self._token_stale = False
        self.worker = new_worker_id()
        self.recorder = recorder
        self._retired: list[Store] = []
        self._seq = 0
        self._pending: deque[_Batch] = deque()
        self._lost = 0  # batches dropped and not yet reported to the aggregator
        self._failures = 0  # failed attempts not yet reported
        #: Batches given up and failed attempts since start, served by this worker's own
        #: exposition (`families()`): a loss the aggregator never hears of is counted here.
        self.lost_total = 0
        self.failures_total = 0
        self._lock = threading.Lock()  # the queue and the connection; never taken by app threads
        self._conn: http.client.HTTPConnection | None = None
        #: Set once to stop, and a pipe to wake the thread: both safe to use from a signal
        #: handler that interrupted the app's own thread anywhere (an Event's lock is not).
        self._stopped = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # closed with the object, never earlier: a write to a closed and reused descriptor
        # would land in someone else's file
        self._close_pipe = weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self._deadline = 0.0  # monotonic time until which the last push is retried
        self._retry_at = 0.0
        self._backoff_step = 0
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="ttft-exporter-push", daemon=True)
        self.acked = 0  # batches acknowledged (tests, bench)
        self._last_failure = ""

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> "Flusher":
        self._thread.start()
        return self

    def follow(self, recorder: Store) -> None:
        """The process switched to a new recorder (configure()): drain the old one once more."""
        with self._lock:
            if recorder is not self.recorder:
                self._retired.append(self.recorder)
                self.recorder = recorder

    def retire(self, timeout: float | None = None) -> None:
        """Stop pushing without waiting: the flusher's thread makes the last push, retrying
        for `timeout` s (default `push.exit_timeout_seconds`), then ends."""
        if not self._stopped:  # (a second stop keeps the first one's deadline)
            self._deadline = time.monotonic() + (
                self.config.push.exit_timeout_seconds if timeout is None else timeout)
            self._stopped = True
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # the pipe is full: the thread is woken already
            pass

    def close(self, timeout: float | None = None) -> None:
        """Stop and wait for the last push, retried for `timeout` s (at exit)."""
        self.retire(timeout)
        if not self._thread.is_alive():
            if self._thread.ident is None:  # never started: push from here
                self._last_push()
            return
        self.wait_closed()

    def wait_closed(self) -> None:
        """Wait (bounded by the deadline) for the last push of a flusher being stopped. Takes
        no lock but the thread's own: safe from a signal handler that interrupted `close()`."""
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            left = max(self._deadline - time.monotonic(), 0.0)
            self._thread.join(left + self.config.push.timeout_seconds + 1.0)

    def abandon(self) -> None:
        """In a forked child: this flusher (and its queue) belongs to the parent; forget it."""
        self._stopped = True
        self._wake_w = -1  # (our copies of the descriptors close with the object)
        conn, self._conn = self._conn, None
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.close()  # our copy of the descriptor only; the parent keeps its own
            except OSError:
                pass

    def flush(self) -> bool:
        """Drain now and try to send everything; True when nothing is left unacknowledged."""
        with self._lock:
            self._collect(final=False)
            self._retry_at = 0.0
            self._send_pending()
            return not self._pending

    def pending(self) -> int:
        return len(self._pending)

    def families(self) -> list[Metric]:
        """This worker's own push counters, for its exposition (if it serves one)."""
        return [family(PUSH_LOST, self.lost_total), family(PUSH_FAILURES, self.failures_total)]

    def _run(self) -> None:
        interval = self.config.push.interval_seconds
        next_at = time.monotonic() + interval
        while not self._stopped:
            if self._sleep(next_at - time.monotonic()):
                continue
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # we fell behind (suspended process): do not burst
                next_at = now + interval
            try:
                with self._lock:
                    self._collect(final=False)
                    if now >= self._retry_at:
                        self._send_pending()
            except Exception:  # never let the thread die: the process would stop pushing
                log.exception("ttft-exporter push: unexpected error (will retry)")
        self._last_push()

    def _sleep(self, seconds: float) -> bool:
        """Wait up to `seconds`; True when woken (stopping)."""
        try:
            ready, _, _ = select.select([self._wake_r], [], [], max(seconds, 0.0))
        except (OSError, ValueError):  # the pipe was closed: we are stopping
            return True
        return bool(ready)



    def _last_push(self) -> None:
        """A last drain, then retry what is unacknowledged until the deadline."""
        try:
            with self._lock:
                self._collect(final=True)
                self._retry_at = 0.0
                delay = 0.05
                while self._pending:
                    self._send_pending()
                    left = self._deadline - time.monotonic()
                    if not self._pending or left <= 0:
                        break
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, 1.0)
                self._close_connection()
                if self._pending:
                    self._give_up()
        except Exception:
            log.exception("ttft-exporter push: final push failed")

    def _give_up(self) -> None:
        """The last push's deadline passed with batches unacknowledged: they are lost, and
        said so (the aggregator hears of it only if it can still be reached later, by no one)."""
        batches = list(self._pending)
        self._pending.clear()
        calls = sum(b.delta.calls() for b in batches)
        for batch in batches:
            self._lost += 1 + batch.delta.lost_batches
            self.lost_total += 1
        log.error("ttft-exporter push: gave up %d unacknowledged batches of worker %s (%d "
                  "calls) at exit: %s", len(batches), self.worker, calls,
                  self._last_failure or "no answer in time")

    # draining and queueing ---------------------------------------------------------------------

    def _collect(self, final: bool) -> None:
        """Drain the recorder(s) into the queue (merging into a never-sent tail batch)."""
        delta = take(self.recorder)
        for old in self._retired:
            delta.absorb(take(old))
        self._retired.clear()
        delta.worker = self.worker
        delta.interval = self.config.push.interval_seconds
        delta.final = final
        delta.lost_batches, self._lost = self._lost, 0
        delta.push_failures, self._failures = self._failures, 0
        layouts = self.recorder.schema.layouts()
        tail = self._pending[-1] if self._pending else None
        if tail is not None and not tail.attempted:
            tail.delta.absorb(delta)
            tail.body = encode(tail.delta, layouts)
        else:
            self._seq += 1
            delta.seq = self._seq
            self._pending.append(_Batch(self._seq, delta, encode(delta, layouts)))
        limit = self.config.push.max_pending_bytes
        while len(self._pending) > 1 and sum(len(b.body) for b in self._pending) > limit:
            self._drop(self._pending.popleft(), "the unacknowledged deltas exceed "
                                                "push.max_pending_bytes")

    def _drop(self, batch: _Batch, why: str) -> None:
        self._lost += 1 + batch.delta.lost_batches
        self.lost_total += 1
        self._failures += batch.delta.push_failures
        log.warning("ttft-exporter push: dropped batch %d of worker %s (%d calls): %s",
                    batch.seq, self.worker, batch.delta.calls(), why)

    # sending ------------------------------------------------------------------------------------

    def _send_pending(self) -> None:
        while self._pending:
            batch = self._pending[0]
            batch.attempted = True
            attempt = self._post(batch)
            status, detail = attempt.status, attempt.detail
            if 200 <= status < 300:
                self._pending.popleft()
                self.acked += 1
                self._backoff_step = 0
                if self._failing:
                    self._failing = False
                    log.warning("ttft-exporter push: %s reachable again", self.url)
                continue
            if status in _PERMANENT:
                self._pending.popleft()
                self._drop(batch, f"the aggregator rejected it: HTTP {status} {detail}")
                continue
            self._failures += 1
            self.failures_total += 1
            self._last_failure = detail or f"HTTP {status}"
            if status in (401, 403):  # a rotated secret: read the token again at the retry
                self._token_stale = True
            if not self._failing:
                self._failing = True
                log.warning("ttft-exporter push: cannot push to %s (%s); keeping the deltas and "
                            "retrying", self.url, detail or f"HTTP {status}")
            interval = self.config.push.interval_seconds
            delay = min(interval * 2 ** self._backoff_step, max(60.0, interval))
            self._backoff_step = min(self._backoff_step + 1, 16)
            self._retry_at = time.monotonic() + delay * random.uniform(0.5, 1.0)
            return

    def _in_doubt(self, batch: _Batch, attempt: _Attempt) -> None:
        """After an attempt that may have been applied, every resend says so (`retry`)."""
        if attempt.connected and not attempt.refused and not batch.delta.retry:
            batch.delta.retry = True
            batch.body = encode(batch.delta, self.recorder.schema.layouts())

    def _post(self, batch: _Batch) -> _Attempt:
        """POST a batch; on a kept-alive connection the server had closed, once more on a
        fresh one (marked `retry`: a proxy may have taken the first)."""
        if self._token_stale:
            self._token = _read_token(self.config.push.token_file)
            self._token_stale = False
        reused = self._conn is not None
        attempt = self._post_once(batch.body)
        self._in_doubt(batch, attempt)
        if attempt.status == 0 and reused and not attempt.timed_out:
            attempt = self._post_once(batch.body)
            self._in_doubt(batch, attempt)
        return attempt

    def _post_once(self, body: bytes) -> _Attempt:
        headers = {"Content-Type": CONTENT_TYPE, "Content-Length": str(len(body))}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        connected = False
        try:
            conn = self._connection()
            if conn.sock is None:
                conn.connect()  # a failure here sent nothing
            connected = True
            conn.request("POST", self._path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read(4096)
            if response.will_close:
                self._close_connection()
            detail = text.decode("utf-8", "replace").strip()
            return _Attempt(response.status, detail, True, _says_not_applied(detail))
        except (OSError, http.client.HTTPException) as e:
            self._close_connection()
            return _Attempt(0, f"{type(e).__name__}: {e}", connected,
                            timed_out=isinstance(e, TimeoutError))

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = self.config.push.timeout_seconds
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                         context=self._ssl)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _says_not_applied(detail: str) -> bool:
    """The aggregator's own refusals say `"applied": false` (a proxy's error page does not)."""
    try:
        answer = json.loads(detail)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("applied") is False and "error" in answer


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _read_token(path: str) -> str:
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            log.warning("ttft-exporter push: cannot read push.token_file %s: %s", path,
                        e.strerror or e)
            return ""
    return os.environ.get(ENV_TOKEN, "").strip()
