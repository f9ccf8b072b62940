"""`ttft-exporter serve` as the aggregator: many worker processes, one exact scrape target.

Workers (push.py) POST deltas to `/push`. Each body is validated completely before
anything is applied (`validate.decode`), so a bad push changes nothing; it is answered with a 4xx
and counted in `ttft_exporter_push_rejected_total{reason}`: `unauthorized` (401: bearer token
missing or wrong, compared in constant time), `too_large` (413: over `max_body_bytes`, or
inflating past `max_decompressed_bytes`), `malformed` (400), `incompatible` (409: another
format version or histogram layout). A valid push is merged exactly into the process's recorder
(HDR add with the straddle counts and exact sums; window slices fed at receive time; counters
added) unless its (worker, seq) was already applied: then it is acknowledged and ignored, which
makes the workers' retries idempotent. A worker sends a batch's first attempt only once every
earlier batch was acknowledged or given up, so a first attempt (not `retry`) of seq n settles
every seq below n: a copy of one of them arriving later is ignored. The map is bounded
(`max_workers`, least recently pushed evicted first): a resend that says it may have been
applied (`retry`: an earlier attempt reached a connection without a definite answer) from a
worker no longer in it cannot be placed once any worker was evicted, so it is refused (409,
`evicted`): the worker gives it up and counts it, never counted twice; its next batch is a
first attempt, applied as usual. The in-flight gauge is the sum of each live worker's latest
value; a worker's gauges expire when it stops pushing (`gauge_ttl_seconds`, default 3 × its
interval) or at once when its last push says `final`.

Restart safety, with `snapshot_path` (journal.py): every push is journalled before it is
applied and acknowledged, and the whole state (histograms, counters, the applied (worker, seq)
map, the self-metrics) is snapshotted every `snapshot_interval_seconds` and at shutdown. At start
the snapshot is loaded and the journal replayed (duplicates skipped by seq), so a SIGTERM or even
a SIGKILL loses no acknowledged push and Prometheus sees no counter reset; a push that could not
be journalled is answered 503 and stays with its worker, which resends it. The sliding windows
are not saved: they refill within `window.seconds`.

The aggregator owns its recorder; runtime.become_aggregator() makes it the one the process
serves, with the self-metrics below rendered after the recorder's families.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

from aiohttp import web
from prometheus_client.core import Metric

from .. import names
from ..compat import timeout
from ..config.settings import Config, ConfigError
from ..expose import connection_guard
from ..expose.self_metrics import (PUSH_BATCHES, PUSH_FAILURES, PUSH_LOST, PUSH_REJECTED,
                                   PUSH_WORKERS, SNAPSHOT_FAILURES, family)
from ..record.recorder import Recorder
from . import validate, wire
from .access import Access
from .gauges import WorkerGauges
from .journal import GroupSync, StateFiles, unusable
from .settled import Applied, applied_map
from .wire import Delta, PushError

log = logging.getLogger("exporter.aggregator")

SNAPSHOT_WORKER = "snapshot"
#: /push bodies (of `max_body_bytes` each at most) held at once, being read or waiting for
#: the aggregator's thread: past it a push is answered 503 and retried by its worker.
HELD_BODIES = 4
#: Gauges of a worker that gave no interval expire after this long at least.
MIN_GAUGE_TTL = 10.0

def tune_gc() -> None:
    """For the dedicated `ttft-exporter serve` process: collect young objects less often.

    Each push allocates thousands of short-lived objects (the parsed JSON, the decoded deltas)
    while the merged state is large and long-lived; with CPython's default thresholds the cyclic
    collector then ran often enough to cost as much as the decoding itself (bench/push.py).
    The aggregator creates almost no reference cycles, so collecting 70x less often costs
    nothing in memory. The state restored at start is frozen out of the collector's scans.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class Pending:
    """A push journalled and not yet applied: its delta and its body as journalled."""

    __slots__ = ("delta", "body")

    def __init__(self, delta: Delta, body: bytes):
        self.delta, self.body = delta, body


class Aggregator:
    """Receives worker pushes into its recorder (new, or the one given)."""

    def __init__(self, config: Config, recorder: Recorder | None = None,
                 clock: Callable[[], float] = time.monotonic):
        agg = config.aggregator
        self.config = config
        self.recorder = recorder = recorder if recorder is not None else Recorder(config)
        self.clock = clock
        self.access = Access(config)  # reads the secrets: ConfigError when unusable
        #: One thread applies pushes, expires gauges and writes snapshots, one at a time, off
        #: the event loop.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttft-aggregator")
        #: Bytes of /push bodies held now (being read, or waiting for the aggregator's thread),
        #: at most HELD_BODIES bodies' worth: each connection slot could otherwise hold a body.
        self.held_bytes = 0
        self.rejected = {reason: 0 for reason in names.REJECT_REASONS}
        self.batches = {result: 0 for result in names.PUSH_RESULTS}
        self.lost_batches = 0
        self.push_failures = 0
        self.snapshot_failures = 0
        #: worker id -> the seqs applied, least recently pushed first (bounded: max_workers)
        self.applied: dict[str, Applied] = {}
        self.evicted_workers = 0  # entries evicted from `applied` since the state began
        #: The live workers' in-flight values (expiring on `clock`), and their sum served
        self.gauges = WorkerGauges(recorder)
        self.files = StateFiles(agg.snapshot_path) if agg.snapshot_path else None
        self.machine_durable = self.files is not None and agg.durability == "machine"
        #: Pushes journalled but not yet applied (waiting for their fsync): a snapshot keeps
        #: them in the journal it empties.
        self.unapplied: set[Pending] = set()
        self.group_sync = GroupSync(self.files) if self.machine_durable else None
        self._last_snapshot = clock()
        if self.files is not None:
            why = unusable(agg.snapshot_path)
            if why is not None:
                raise ConfigError("config", [("aggregator.snapshot_path", why)])
            folder = self.files.path.parent
            try:
                self.restore()
            except OSError as e:
                raise ConfigError("config", [("aggregator.snapshot_path",
                                              f"cannot use {e.filename or folder}: "
                                              f"{e.strerror or e}")]) from None

    # --- receiving ------------------------------------------------------------------------------

    def accept(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """Validate, journal (and fsync, with `durability: machine`) and apply one
        (authorized, size-checked) push body: (HTTP status, answer)."""
        status, answer, pending = self.journal(body)
        if pending is None:
            return status, answer
        if self.machine_durable:
            try:
                self.files.sync()  # type: ignore[union-attr]
            except OSError as e:
                return self.not_durable(pending, e)
        return self.commit(pending)

    def journal(self, body: bytes) -> tuple[int, dict[str, Any], Pending | None]:
        """Validate and journal one push: the answer, or the push to `commit` once durable."""
        try:
            delta = validate.decode(body, self.recorder.schema,
                                max_inflated=self.config.aggregator.max_decompressed_bytes)
        except PushError as e:
            return (*self.reject(e.reason, e.detail), None)
        if self.is_duplicate(delta):
            self.batches[names.PUSH_DUPLICATE] += 1
            return 200, {"applied": False, "seq": delta.seq}, None
        if delta.retry and self.evicted_workers and delta.worker not in self.applied:
            return (*self.reject(names.REJECT_EVICTED,
                                 f"batch {delta.seq} may have been applied, but this worker's "
                                 f"applied batches were evicted (aggregator.max_workers): give "
                                 f"it up rather than count it twice"), None)
        pending = Pending(delta, body)
        if self.files is not None:
            try:
                self.files.append(body)
            except OSError as e:
                self.snapshot_failures += 1
                log.warning("ttft-exporter aggregator: cannot journal a push (%s); answered "
                            "503, the worker keeps it", e.strerror or e)
                return 503, {"error": "unavailable", "applied": False,
                             "detail": "the push could not be made durable; retry later"}, None
            self.unapplied.add(pending)
        return 200, {}, pending

    def commit(self, pending: Pending) -> tuple[int, dict[str, Any]]:
        """Apply a journalled (and, if asked, fsync'd) push and answer it."""
        self.unapplied.discard(pending)
        applied = self.apply(pending.delta)
        return 200, {"applied": applied, "seq": pending.delta.seq}

    def not_durable(self, pending: Pending, error: OSError) -> tuple[int, dict[str, Any]]:
        """The fsync failed: not acknowledged (the record stays journalled, so a restart may
        apply it: the answer does not say it was not applied, and the resend is a retry)."""
        self.unapplied.discard(pending)
        self.snapshot_failures += 1
        log.warning("ttft-exporter aggregator: cannot fsync the journal (%s); answered 503, "
                    "the worker keeps the push", error.strerror or error)
        return 503, {"error": "unavailable", "detail": "the push could not be made durable"}

    def reject(self, reason: str, detail: str) -> tuple[int, dict[str, Any]]:
        """A refused push: nothing of it was applied, and the answer says so (a worker resends
        it unmarked, push.py; a proxy's error page cannot say it)."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        status = {names.REJECT_UNAUTHORIZED: 401, names.REJECT_TOO_LARGE: 413,
                  names.REJECT_INCOMPATIBLE: 409, names.REJECT_EVICTED: 409}.get(reason, 400)
        return status, {"error": reason, "detail": detail, "applied": False}

    def is_duplicate(self, delta: Delta) -> bool:
        """True when this (worker, seq) was applied already (a retry)."""
        seqs = self.applied.get(delta.worker)
        return seqs is not None and delta.seq in seqs

    def apply(self, delta: Delta, window: bool = True) -> bool:
        """Merge a validated delta unless its (worker, seq) was applied; True when merged."""
        worker = delta.worker
        if self.is_duplicate(delta):
            self.batches[names.PUSH_DUPLICATE] += 1
            return False
        self.recorder.merge(delta.histograms, delta.exemplars, delta.rows, window=window)
        seqs = self.applied.pop(worker, None) or Applied()
        if not delta.retry:  # its worker settled every earlier batch before sending it
            seqs.settle_below(delta.seq)
        seqs.add(delta.seq)
        self.applied[worker] = seqs
        while len(self.applied) > self.config.aggregator.max_workers:
            del self.applied[next(iter(self.applied))]
            self.evicted_workers += 1
        if window:  # live pushes (not a replay at start) carry the worker's current gauges
            if delta.final:
                self.gauges.set(worker, None)
            else:
                ttl = self.config.aggregator.gauge_ttl_seconds or max(3 * delta.interval,
                                                                      MIN_GAUGE_TTL)
                self.gauges.set(worker, delta.rows.get(names.REQUESTS_IN_FLIGHT, {}),
                                self.clock() + ttl)
        self.lost_batches += delta.lost_batches
        self.push_failures += delta.push_failures
        self.batches[names.PUSH_APPLIED] += 1
        return True

    def expire(self) -> None:
        """Drop the gauges of workers that stopped pushing (and the in-flight keys that went
        with them once their labels expired)."""
        self.gauges.expire(self.clock())

    # --- HTTP: the exporter app's extension (expose/server.py) ----------------------------------

    def metrics_authorized(self, authorization: str) -> bool:
        return self.access.metrics_authorized(authorization)

    def metrics_challenge(self) -> str:
        return self.access.metrics_challenge()

    def install(self, app: web.Application) -> None:
        """The push route, and expiry and snapshots while serving."""
        app.router.add_post(wire.PUSH_PATH, self.handle_push)
        app.cleanup_ctx.append(self.background)

    async def handle_push(self, request: web.Request) -> web.Response:
        """POST /push."""
        try:
            if not self.access.push_authorized(request.headers.get("Authorization", "")):
                status, answer = self.reject(names.REJECT_UNAUTHORIZED,
                                             "missing or wrong bearer token")
                return web.json_response(answer, status=status, headers={
                    "WWW-Authenticate": 'Bearer realm="ttft-exporter"'})
            if request.headers.get("Content-Encoding", "identity").lower() != "identity":
                status, answer = self.reject(names.REJECT_MALFORMED, "the body is compressed "
                                             "by the format: no Content-Encoding")
                return web.json_response(answer, status=status)
            limit = self.config.aggregator.max_body_bytes
            if request.content_length is not None and request.content_length > limit:
                status, answer = self.reject(names.REJECT_TOO_LARGE,
                                             f"body over {limit} bytes")
                return web.json_response(answer, status=status)
            body = await self._read_body(request, limit)
            if isinstance(body, web.Response):
                return body
            try:
                return await self._accept_body(body)
            finally:
                self.held_bytes -= len(body)
        except (ConnectionError, asyncio.IncompleteReadError):
            raise
        except Exception:  # a bug must not take the aggregator down, nor half-apply silently
            log.exception("ttft-exporter aggregator: push failed")
            self.recorder.count_drop(names.DROP_INTERNAL)
            return web.json_response({"error": "internal"}, status=500)

    async def _read_body(self, request: web.Request, limit: int) -> bytes | web.Response:
        """The push's body, its bytes counted in `held_bytes` (the caller gives them back);
        or the refusal: too large, too slow, or too many bodies held at once (503, not applied:
        the worker retries after its backoff and counts the failed attempt)."""
        chunks, size = [], 0
        budget = HELD_BODIES * limit
        try:
            async with timeout(self.config.server.body_timeout_seconds):
                async for chunk in request.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    self.held_bytes += len(chunk)
                    if size > limit:
                        self.held_bytes -= size
                        status, answer = self.reject(names.REJECT_TOO_LARGE,
                                                     f"body over {limit} bytes")
                        return web.json_response(answer, status=status)
                    if self.held_bytes > budget:
                        self.held_bytes -= size
                        response = web.json_response(
                            {"error": "busy", "applied": False,
                             "detail": f"over {budget} bytes of push bodies held at once: "
                                       f"retry later"}, status=503, headers={"Retry-After": "1"})
                        response.force_close()  # the rest of its body is not read
                        return response
                    chunks.append(chunk)
        except TimeoutError:  # a client trickling its body: its connection goes
            self.held_bytes -= size
            connection_guard.CLOSED["slow"] += 1
            # definite like the other refusals: a body never read whole was not applied
            response = web.json_response({"error": "timeout", "detail": "body too slow",
                                          "applied": False}, status=408)
            response.force_close()
            return response
        except BaseException:
            self.held_bytes -= size
            raise
        return b"".join(chunks)

    async def _accept_body(self, body: bytes) -> web.Response:
        """Validate, journal and apply a read body; the answer."""
        # validation and merging run on the aggregator's own thread: the event loop keeps
        # answering (/healthz, scrapes) during the largest push
        loop = asyncio.get_running_loop()
        if self.group_sync is None:
            status, answer = await loop.run_in_executor(self.worker, self.accept, body)
            return web.json_response(answer, status=status)
        status, answer, pending = await loop.run_in_executor(self.worker, self.journal, body)
        if pending is not None:  # (shielded: a client gone meanwhile leaves none pending)
            status, answer = await asyncio.shield(self._commit_when_durable(pending))
        return web.json_response(answer, status=status)

    async def _commit_when_durable(self, pending: Pending) -> tuple[int, dict[str, Any]]:
        """`durability: machine`: wait for an fsync covering the push, then apply it."""
        assert self.group_sync is not None
        loop = asyncio.get_running_loop()
        try:
            await self.group_sync.wait()
        except OSError as e:
            return await loop.run_in_executor(self.worker, self.not_durable, pending, e)
        return await loop.run_in_executor(self.worker, self.commit, pending)

    async def background(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup context: expiry and snapshots while serving, a snapshot at the end."""
        task = asyncio.create_task(self._ticks())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.get_running_loop().run_in_executor(self.worker, self.close)
        self.worker.shutdown(wait=True)
        if self.group_sync is not None:
            self.group_sync.thread.shutdown(wait=True)

    async def _ticks(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            try:
                await loop.run_in_executor(self.worker, self._tick)
            except Exception:
                log.exception("ttft-exporter aggregator: background task failed")

    def _tick(self) -> None:
        self.expire()
        interval = self.config.aggregator.snapshot_interval_seconds
        if self.files is not None and self.clock() - self._last_snapshot >= interval:
            self.snapshot()

    def close(self) -> None:
        """Write the last snapshot and close the journal (idempotent)."""
        if self.files is not None and self.files.is_open:
            self.snapshot()
            self.files.close()

    # --- self-metrics ---------------------------------------------------------------------------

    def families(self) -> list[Metric]:
        return [family(PUSH_REJECTED, {(reason,): n for reason, n in self.rejected.items()}),
                family(PUSH_BATCHES, {(result,): n for result, n in self.batches.items()}),
                family(PUSH_WORKERS, len(self.gauges)),
                family(PUSH_LOST, self.lost_batches),
                family(PUSH_FAILURES, self.push_failures),
                family(SNAPSHOT_FAILURES, self.snapshot_failures)]

    # --- snapshot and journal -------------------------------------------------------------------

    def state_document(self) -> dict[str, Any]:
        """Everything that must survive a restart, as one delta-format document plus extras."""
        rec = self.recorder
        delta = Delta(worker=SNAPSHOT_WORKER, final=True)
        for state in rec.families.values():
            for series, hist, exemplars, _ in rec.snapshot(state):
                if hist.count:
                    key = (state.family.name, series.values)
                    delta.histograms[key] = hist
                    if exemplars:
                        delta.exemplars[key] = exemplars
        rows = rec.counts().rows
        delta.rows = {c.name: rows[c.name] for c in names.COUNTERS if not c.gauge}
        doc = wire.payload(delta, rec.schema.layouts())
        doc["applied"] = [[worker, seqs.floor, sorted(seqs.above)]
                          for worker, seqs in self.applied.items()]
        doc["self"] = {"rejected": self.rejected, "batches": self.batches,
                       "lost_batches": self.lost_batches, "push_failures": self.push_failures,
                       "snapshot_failures": self.snapshot_failures,
                       "evicted_workers": self.evicted_workers}
        doc["written"] = time.time()
        return doc

    def snapshot(self) -> bool:
        """Write the state atomically, then empty the journal; False (counted) on failure."""
        self._last_snapshot = self.clock()
        if self.files is None:
            return False
        try:
            self.files.write_snapshot(self.state_document(),
                                      keep=[p.body for p in self.unapplied],
                                      durable=self.machine_durable)
            return True
        except OSError as e:
            self.snapshot_failures += 1
            log.warning("ttft-exporter aggregator: cannot write snapshot %s: %s",
                        self.files.path, e.strerror or e)
            return False

    def restore(self) -> None:
        """Load the snapshot and replay the journal (at start, before serving)."""
        assert self.files is not None
        doc = self.files.read_snapshot()
        if doc is not None:
            try:
                delta = validate.from_payload(doc, self.recorder.schema)
                applied = applied_map(doc.get("applied"))
            except ValueError as e:
                self.files.set_aside(str(e))
            else:
                self.apply(delta, window=False)
                self.applied = applied
                self.batches[names.PUSH_APPLIED] -= 1  # the snapshot itself is no push
                extra = doc.get("self") if isinstance(doc.get("self"), dict) else {}
                for name, target in (("rejected", self.rejected), ("batches", self.batches)):
                    for key, n in (extra.get(name) or {}).items():
                        if key in target and type(n) is int and n >= 0:
                            target[key] += n
                for name in ("lost_batches", "push_failures", "snapshot_failures",
                             "evicted_workers"):
                    n = extra.get(name)
                    if type(n) is int and n >= 0:
                        setattr(self, name, getattr(self, name) + n)
        replayed = 0
        for body in self.files.replay():
            try:
                delta = validate.decode(body, self.recorder.schema, max_inflated=1 << 34)
            except PushError as e:
                log.warning("ttft-exporter aggregator: journal record skipped: %s", e)
                continue
            replayed += self.apply(delta, window=False)
        if replayed:
            log.warning("ttft-exporter aggregator: replayed %d pushes from %s", replayed,
                        self.files.journal_path)
        if self.files.skipped or self.files.old_format:
            # counted as failed journal writes; a snapshot now empties the journal of them
            self.snapshot_failures += self.files.skipped
            log.warning("ttft-exporter aggregator: %d journal records did not check and were "
                        "skipped%s", self.files.skipped,
                        " (a journal of the first format)" if self.files.old_format else "")
            self.snapshot()
