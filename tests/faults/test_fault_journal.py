"""Faults on the aggregator's disk: a journal record cut short by a crash, and a full disk.
The promise: an acknowledged push survives any crash and restart; a push that cannot be made
durable is not acknowledged (its worker keeps it and resends it)."""

from __future__ import annotations

import resource
import signal
import subprocess
import urllib.error
import urllib.request

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
