"""A push small on the wire that would build hundreds of MiB of Python objects: refused before
the parser builds them (validate.check_parse_cost), while the largest valid pushes still pass."""

from __future__ import annotations

import gc
import json
import tracemalloc
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

from bench.push_memory import dense_push
from exporter._internal import names
from exporter._internal.config.loader import load
from exporter._internal.config.settings import Config
from exporter._internal.fleet import validate, wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from tests.faults.test_fault_slow_clients import maximal_push
from tests.test_push_processes import Serve

MiB = 2**20


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def post(base: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(base + wire.PUSH_PATH, data=body,
                                     headers={"Content-Type": wire.CONTENT_TYPE})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def repeated(item: bytes, inflated: int) -> bytes:
    """A JSON list of `item` as long as `inflated` bytes allow."""
    n = (inflated - 2) // (len(item) + 1)
    return b"[" + b",".join([item] * n) + b"]"


def test_a_16_KB_push_of_millions_of_objects_costs_a_real_serve_under_64_MiB(tmp_path):
    """zlib of `[{},{},...]`: 16 KB on the wire, 16 MiB inflated (the default limit), 5.6
    million dicts (~390 MiB) if parsed. `ttft-exporter serve` refuses it (413) before parsing;
    its peak RSS grows by the inflated bytes, not by the objects."""
    config = tmp_path / "serve.yaml"
    config.write_text("{}\n")
    serve = Serve(config)
    try:
        assert post(serve.base, zlib.compress(b"[]", 9))[0] == 400  # warmed up
        before = peak_rss_kib(serve.proc.pid)
        for item in (b"{}", b"[]"):
            body = zlib.compress(repeated(item, Config().aggregator.max_decompressed_bytes), 9)
            assert len(body) < 20_000
            status, answer = post(serve.base, body)
            assert status == 413 and json.loads(answer)["error"] == names.REJECT_TOO_LARGE
        added = (peak_rss_kib(serve.proc.pid) - before) / 1024
        assert added < 64, f"the pushes added {added:.0f} MiB of peak RSS"
        rejected = serve.metrics()[(names.SELF_PUSH_REJECTED,
                                    (("reason", names.REJECT_TOO_LARGE),))]
        assert rejected == 2
    finally:
        serve.stop()


SHAPES = [b"[]", b"[0]", b"[0,0,0]", b'["ab"]', b'"ab"', b'"abc"', b"-9", b"300", b"1.5",
          b"1e5", b"true", b"null", b'"' + b"x" * 300 + b'"', b'"\\u0100\\u0100"',
          b'"\\ud83d\\ude00"', b'[12345,33,"ab",1.5,1.5]', b"[12345,3,0]",
          b'["ab","cd","ef","gh",7]', b"[[[[0]]]]"]


@pytest.mark.parametrize("item", SHAPES, ids=[s.decode()[:20] for s in SHAPES])
def test_the_parse_cost_estimate_bounds_what_json_allocates(item: bytes):
    """The estimate check_parse_cost compares with the budget is at least what CPython's json
    allocates, for the cheapest texts of every kind of value (1 MiB of each)."""
    raw = repeated(item, MiB)
    estimate = validate.parse_cost(raw)[0]
    text = raw.decode("ascii")
    gc.collect()
    tracemalloc.start()
    try:
        doc = json.loads(text)
        allocated = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del doc
    assert allocated <= estimate, (allocated, estimate)


def test_brackets_inside_strings_are_not_counted():
    """Label values may hold brackets and braces: only those outside strings build objects."""
    inner = b'"' + b"{[" * 60 + b'"'
    raw = repeated(inner, 4 * MiB)
    assert raw.count(b"{") > validate.MAX_OBJECTS
    validate.check_parse_cost(raw, 4 * MiB)  # no PushError
    with pytest.raises(wire.PushError) as refused:
        validate.check_parse_cost(repeated(b"{}", MiB), 4 * MiB)
    assert refused.value.reason == names.REJECT_TOO_LARGE


def test_a_body_that_is_not_ascii_is_malformed():
    """Workers escape every non-ASCII character (json.dumps' default); a body that does not
    would make the parser's text up to 4 bytes per character. The same push escaped passes."""
    from tests.test_push import call

    rec = Recorder()
    call(rec, 1000, tenant="caf\u00e9 \U0001F600")
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = "w", 1, 5.0
    doc = wire.payload(delta, rec.schema.layouts())
    agg = Aggregator(Config())
    raw = zlib.compress(json.dumps(doc, ensure_ascii=False).encode())
    status, answer = agg.accept(raw)
    assert (status, answer["error"]) == (400, names.REJECT_MALFORMED)
    assert agg.accept(zlib.compress(json.dumps(doc).encode()))[0] == 200


def test_the_largest_valid_push_is_far_under_the_budget():
    """max_series (the default 20,000) series of large, sparse histograms: 0.7 MB inflated,
    estimated well under 16 x max_decompressed_bytes; applied whole."""
    config = load({"labels": {"max_tenants": 100_000}})
    body = maximal_push(config)
    raw = zlib.decompress(body)
    cost, objects, members = validate.parse_cost(raw)
    budget = validate.PARSE_BUDGET_PER_BYTE * config.aggregator.max_decompressed_bytes
    assert cost < budget / 10 and objects < 16 and members < 100
    agg = Aggregator(config, Recorder(config))
    assert agg.accept(body)[0] == 200
    assert agg.recorder.counts().series >= config.labels.max_series * 3 // 4


def test_a_worker_whose_counters_are_full_pushes_them_whole():
    """A worker's counter tables hold `labels.max_series` rows and, past them, their overflow
    rows (`__other__` per outcome): its push is accepted (it was refused 413, and the worker
    dropped the batch, counted lost), and every call is counted; one row more is refused."""
    from tests.test_push import call

    config = load({"labels": {"max_series": 50, "max_tenants": 1000}})
    worker = Recorder(config)
    outcomes = (names.OK, names.ERROR, names.TIMEOUT)
    for i in range(200):
        call(worker, 1000, tenant=f"t{i}", outcome=outcomes[i % 3])
    delta = take(worker)
    delta.worker, delta.seq, delta.interval = "w", 1, 5.0
    assert len(delta.rows[names.REQUESTS_TOTAL]) == 50 + 3
    agg = Aggregator(config)
    status, answer = agg.accept(wire.encode(delta, worker.schema.layouts()))
    assert status == 200, answer
    assert sum(agg.recorder.counts().rows[names.REQUESTS_TOTAL].values()) == 200
    # one row past what a worker can hold (50 and one overflow row per outcome): refused
    doc = wire.payload(delta, worker.schema.layouts())
    doc["seq"] = 2
    doc["requests"] += [["m", names.OK, "p", "r", f"x{i}", 1]
                        for i in range(50 + len(names.OUTCOMES) + 1 - len(doc["requests"]))]
    status, answer = agg.accept(zlib.compress(json.dumps(doc).encode()))
    assert (status, answer["error"]) == (413, names.REJECT_TOO_LARGE), answer


def test_a_push_of_dense_histograms_costs_a_real_serve_under_its_parse_budget(tmp_path):
    """A valid push of histograms with every bucket populated, up to a 4 MiB inflate limit
    (64 KB compressed, 3.4 MiB inflated, 2.5 million buckets): `ttft-exporter serve` takes it
    within 16 x `max_decompressed_bytes` of peak RSS (+41 MiB measured; the decoded buckets
    as Python ints took +119 MiB, and at the default 16 MiB limit +552 MiB)."""
    limits = {"aggregator": {"max_decompressed_bytes": 4 * MiB}}
    body = dense_push(load(limits))
    assert 3 * MiB < len(zlib.decompress(body)) <= 4 * MiB and len(body) < 200_000
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps(limits))
    serve = Serve(config)
    try:
        assert post(serve.base, zlib.compress(b"[]", 9))[0] == 400  # warmed up
        before = peak_rss_kib(serve.proc.pid)
        status, answer = post(serve.base, body)
        added = (peak_rss_kib(serve.proc.pid) - before) / 1024
        print(f"a dense push of {len(body) / 1000:.0f} KB: serve's peak RSS +{added:.0f} MiB")
        assert status == 200, answer
        assert added < validate.PARSE_BUDGET_PER_BYTE * 4, f"+{added:.0f} MiB"
    finally:
        serve.stop()
