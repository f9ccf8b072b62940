"""Faults on the aggregator's disk: a journal record cut short by a crash, and a full disk.
The promise: an acknowledged push survives any crash and restart; a push that cannot be made
durable is not acknowledged (its worker keeps it and resends it)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import urllib.error
import urllib.request

import pytest

from exporter._internal import names
from exporter._internal.config.settings import AggregatorConfig, Config
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline
from tests.test_push_processes import CLI, Serve, free_port


def body(seq: int, calls: int, worker: str = "w") -> bytes:
    rec = Recorder()
    for i in range(calls):
        t = CallTimeline(start=0, model="m", provider="p", route="r", tenant=f"t{i % 7}")
        t.token(1000 + 997 * i)
        t.end, t.outcome = 10_000_000, names.OK
        rec.record_call(t)
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = worker, seq, 5.0
    return wire.encode(delta, rec.schema.layouts())


def calls(agg: Aggregator) -> int:
    return sum(agg.recorder.counts().rows[names.REQUESTS_TOTAL].values())


def test_a_record_cut_by_a_crash_is_cut_off_and_later_pushes_survive(tmp_path):
    config = Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state")))
    first = Aggregator(config)
    for seq in (1, 2, 3):
        assert first.accept(body(seq, 10))[0] == 200
    # a crash in the middle of the fourth record: its length is written, its body cut short
    with open(tmp_path / "state.journal", "ab") as f:
        f.write(b"\x00\x00\x40\x00garbage")
    second = Aggregator(config)  # restart: replays 1-3, cuts the partial record off
    assert calls(second) == 30
    for seq in (4, 5):
        assert second.accept(body(seq, 10))[0] == 200
    third = Aggregator(config)  # another crash (no snapshot): every acknowledged push is back
    assert calls(third) == 50
    assert [third.accept(body(seq, 10))[1]["applied"] for seq in (1, 2, 3, 4, 5)] == [False] * 5


def _limited_file_size(limit: int):
    def preexec() -> None:  # the child writes at most `limit` bytes per file, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    return preexec


def _post(base: str, data: bytes) -> int:
    request = urllib.request.Request(base + wire.PUSH_PATH, data=data,
                                     headers={"Content-Type": wire.CONTENT_TYPE})
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_full_disk_is_never_acknowledged_and_acknowledged_pushes_survive(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"aggregator:\n  snapshot_path: {tmp_path / 'state'}\n"
                      f"  snapshot_interval_seconds: 3600\n")
    port = free_port()
    serve = subprocess.Popen([*CLI, "serve", "--config", str(config), "--port", str(port)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_limited_file_size(24_000))
    base = f"http://127.0.0.1:{port}"
    try:
        line = serve.stdout.readline()
        assert "serving" in line, line + serve.stderr.read()
        acknowledged, refused, smallest_refused = 0, 0, None
        for seq in range(1, 60):
            data = body(seq, 20)
            status = _post(base, data)
            assert status in (200, 503), status
            if status == 200:
                acknowledged += 20
                # after the disk filled up, only a push smaller than every refused one can fit
                # the room left (compressed bodies differ by a few bytes)
                assert smallest_refused is None or len(data) < smallest_refused, \
                    "a push acknowledged after the disk filled up"
            else:
                refused += 1
                smallest_refused = min(smallest_refused or len(data), len(data))
        assert acknowledged and refused  # the disk filled up part way
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert f"{names.SELF_SNAPSHOT_FAILURES} {float(refused)}" in metrics
    finally:
        serve.send_signal(signal.SIGKILL)  # a crash: no final snapshot
        serve.wait(20)
        serve.stdout.close()
        serve.stderr.close()
    restarted = Serve(config, port)  # with room on the disk again
    try:
        served = restarted.metrics()
        total = sum(v for (name, _), v in served.items() if name == names.REQUESTS_TOTAL)
        assert total == acknowledged  # every acknowledged call, and only those
    finally:
        restarted.stop()


# --- checksummed records: one bad record loses itself, not the records after it ---------------

def _journal(tmp_path, pushes: int) -> tuple[Config, list[tuple[int, int]]]:
    """A journal of `pushes` acknowledged pushes of 10 calls each (no snapshot written yet),
    and the (start, end) offset of each record."""
    config = Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state")))
    agg = Aggregator(config)
    spans = []
    for seq in range(1, pushes + 1):
        start = (tmp_path / "state.journal").stat().st_size
        assert agg.accept(body(seq, 10))[0] == 200
        spans.append((start, (tmp_path / "state.journal").stat().st_size))
    agg.files.close()  # a crash: no snapshot
    return config, spans


def _damage(path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


@pytest.mark.parametrize("damage", ["zeroed length", "flipped body byte", "zeroed magic",
                                    "zeroed header", "zeroed record"])
def test_one_bad_record_is_skipped_and_counted_and_every_other_is_replayed(tmp_path, damage):
    config, spans = _journal(tmp_path, 5)
    start, end = spans[2]  # the third of five
    journal = tmp_path / "state.journal"
    if damage == "zeroed length":
        _damage(journal, start + 4, b"\0" * 4)
    elif damage == "flipped body byte":
        _damage(journal, start + 12 + (end - start - 12) // 2,
                bytes([journal.read_bytes()[start + 12 + (end - start - 12) // 2] ^ 0x10]))
    elif damage == "zeroed magic":
        _damage(journal, start, b"\0" * 4)
    elif damage == "zeroed header":
        _damage(journal, start, b"\0" * 12)
    else:  # a block the file system left zeroed after a power loss
        _damage(journal, start, b"\0" * (end - start))
    restarted = Aggregator(config)
    assert calls(restarted) == 40  # every record but the bad one
    assert restarted.snapshot_failures == 1  # counted (TTFTExporterSnapshotFailing)
    assert journal.stat().st_size == 0  # the snapshot written at once emptied the journal
    # its worker had it acknowledged and sent batch 4 after it: a copy of any is a duplicate
    assert [restarted.accept(body(seq, 10))[1]["applied"] for seq in range(1, 6)] == [False] * 5
    assert restarted.accept(body(6, 10))[0] == 200
    restarted.close()
    again = Aggregator(config)  # the bad record is not found (nor counted) again
    assert calls(again) == 50 and again.snapshot_failures == 1


def test_a_record_cut_at_any_byte_loses_only_itself(tmp_path):
    """A crash while the last record was being written, at every byte of it: every earlier
    record is replayed, the cut one is cut off the file (it was never acknowledged), nothing
    is counted as lost, and the next record appended after it replays too."""
    from exporter._internal.fleet.journal import StateFiles

    config, spans = _journal(tmp_path, 3)
    journal = tmp_path / "state.journal"
    whole = journal.read_bytes()
    bodies = [whole[s + 12:e] for s, e in spans]
    start, end = spans[-1]
    for cut in range(start, end):
        journal.write_bytes(whole[:cut])
        files = StateFiles(str(tmp_path / "state"))
        assert list(files.replay()) == bodies[:2], cut
        assert files.skipped == 0 and journal.stat().st_size == start
        files.append(b"next")
        files.close()
        again = StateFiles(str(tmp_path / "state"))
        assert list(again.replay()) == [*bodies[:2], b"next"]
        again.close()
    journal.write_bytes(whole[:start + 7])  # and through the aggregator
    assert calls(Aggregator(config)) == 20


def test_a_journal_of_the_first_format_is_replayed_then_replaced(tmp_path):
    """Records of a length and a body (no magic, no CRC), as the previous release wrote them:
    replayed, then a snapshot empties the journal and new records use the new format."""
    import struct

    journal = tmp_path / "state.journal"
    journal.write_bytes(b"".join(struct.pack(">I", len(b)) + b
                                 for b in (body(1, 10), body(2, 10))) + b"\0\0\x40")
    config = Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state")))
    first = Aggregator(config)
    assert calls(first) == 20 and journal.stat().st_size == 0
    assert first.accept(body(3, 10))[0] == 200
    first.files.close()  # a crash
    assert calls(Aggregator(config)) == 30


def test_a_snapshot_keeps_the_records_not_yet_applied(tmp_path):
    """With `durability: machine` a push is journalled, fsync'd, then applied: a snapshot
    taken in between does not include it, so the journal it empties keeps its record."""
    config = Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state"),
                                                durability="machine"))
    agg = Aggregator(config)
    assert agg.accept(body(1, 10))[0] == 200
    status, _, pending = agg.journal(body(2, 10))
    assert status == 200 and pending is not None
    assert agg.snapshot()
    agg.files.close()  # a crash before the push was applied
    assert calls(Aggregator(config)) == 20


def test_every_push_is_acknowledged_after_an_fsync_that_covers_it(tmp_path):
    """`durability: machine` on a real server: 12 workers pushing at once. Each 200 comes
    after an fsync of the journal that began with the push's record already written; the
    pushes waiting meanwhile shared fsyncs (fewer fsyncs than pushes)."""
    import threading

    from exporter._internal.expose.server import ExporterServer, create_app
    from exporter._internal.expose.text import Renderer

    config = Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state"),
                                                durability="machine"))
    agg = Aggregator(config)
    files = agg.files
    durable = [0]  # the journal's size when the last completed fsync began
    real_sync = files.sync

    def sync() -> None:
        size = os.fstat(files._journal).st_size
        real_sync()
        durable[0] = size

    files.sync = sync  # the real fsync, observed
    server = ExporterServer(create_app(lambda: Renderer(agg.recorder, agg.families), agg),
                            "127.0.0.1", 0).start()
    ends: dict[bytes, int] = {}
    real_append = files.append

    def append(data: bytes) -> None:
        real_append(data)
        ends[data] = os.lseek(files._journal, 0, os.SEEK_CUR)

    files.append = append
    failures: list[str] = []

    def worker(w: int) -> None:
        for seq in range(1, 6):
            data = body(seq, 3, worker=f"w{w}")
            status = _post(server.base_url, data)
            if status != 200 or durable[0] < ends[data]:
                failures.append(f"w{w} seq {seq}: {status}, durable {durable[0]} < "
                                f"{ends.get(data)}")

    try:
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        assert calls(agg) == 12 * 5 * 3
        assert 0 < agg.group_sync.syncs < 60
    finally:
        server.stop()


def test_machine_durability_survives_sigkill_like_process_durability(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"aggregator:\n  snapshot_path: {tmp_path / 'state'}\n"
                      f"  snapshot_interval_seconds: 3600\n  durability: machine\n")
    serve = Serve(config)
    try:
        for seq in range(1, 11):
            assert _post(serve.base, body(seq, 10)) == 200
    finally:
        serve.stop(signal.SIGKILL)
    restarted = Serve(config)
    try:
        served = restarted.metrics()
        assert sum(v for (name, _), v in served.items() if name == names.REQUESTS_TOTAL) == 100
    finally:
        restarted.stop()
