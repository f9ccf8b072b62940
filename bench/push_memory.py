"""Issue 31's figures: how large the largest legitimate push is, and what parsing a push costs
the aggregator, beside the bound `aggregator.max_decompressed_bytes` puts on a hostile one.

A worker's push carries what its store gathered since the previous one (fleet/take.py): at most
`labels.max_series` histogram series, and each counter table at most `max_series` rows plus its
overflow rows. The largest legitimate push is a store filled to every cap, taken and encoded as
the flusher does: demo-shaped calls (bench/push.py) on distinct (model, route, tenant) sets
until the series and the counter tables are full; then the same store with every label value
at `labels.max_label_length`, and with every series' histogram spanning its whole range (one
value in each of its HDR buckets: a store that has seen every latency). Parsing is measured
with tracemalloc (json and the validation, `validate.decode`, whatever the inflate limit), the
densest valid push the limit lets in, and a hostile body of numbers up to the limit (its parse
cost estimate passes; the validation refuses it only after the parse).
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
import zlib

from exporter._internal import names
from exporter._internal.config.loader import load
from exporter._internal.config.settings import Config
from exporter._internal.fleet import validate, wire
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.schema import Schema

from .push import demo_call

MiB = 2**20


def full_store(config: Config, label_length: int) -> Recorder:
    """A worker's store with every series and counter table at its cap."""
    lab = config.labels
    rec = Recorder(config)
    rng = random.Random(7)
    pad = "x" * max(label_length - 12, 0)
    weights = [1.0] * 20
    i = 0
    while True:
        t = demo_call(rng, weights)
        t.model = f"{pad}model-{i % lab.max_models}"[-label_length:]
        t.route = f"{pad}/route/{(i // lab.max_models) % lab.max_routes}"[-label_length:]
        t.tenant = f"{pad}tenant-{i}"[-label_length:]
        t.provider = f"{pad}prov-{i % lab.max_providers}"[-label_length:]
        t.upstream_address = f"{pad}10.0.{i % 250}.{i % 16}"[-label_length:]
        t.fingerprint = f"{pad}fp_{i % lab.max_upstreams}"[-label_length:]
        rec.record_call(t)
        i += 1
        if i % 500 == 0:
            counts = rec.counts()
            if counts.series >= lab.max_series and \
                    len(counts.rows[names.REQUESTS_TOTAL]) >= lab.max_series:
                break
    return rec


def parse_peak(body: bytes, schema: Schema, limit: int) -> tuple[int, str]:
    """Peak bytes tracemalloc sees while `validate.decode` takes `body` (past `limit` too),
    and what the aggregator answers it."""
    gc.collect()
    tracemalloc.start()
    try:
        validate.decode(body, schema, max_inflated=1 << 34)
        outcome = "accepted" if len(zlib.decompress(body)) <= limit else "refused: too_large"
    except wire.PushError as e:
        outcome = f"refused after the parse: {e.reason}"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, outcome


def dense_push(config: Config, series: int = 0) -> bytes:
    """A valid push of `series` TTFT histograms with one value in every bucket (the most
    buckets a byte of the format can carry); when 0, as many as `max_decompressed_bytes` (and
    `labels.max_series`) allow."""
    if not series:
        one = len(zlib.decompress(dense_push(config, 1)))
        return dense_push(config, min(config.aggregator.max_decompressed_bytes // one,
                                      config.labels.max_series))
    rec = Recorder(config)
    state = rec.families[names.TTFT.name]
    values = [state.layout.lowest_equivalent(k) for k in range(state.layout.counts_len)]
    with rec.held:
        for i in range(series):
            rec.series(state, ("m", "p", "r", f"t{i}")).hist.record_many(values)
    delta = take(rec)
    delta.worker, delta.seq, delta.interval = "dense", 1, 5.0
    return wire.encode(delta, rec.schema.layouts())


def _line(name: str, body: bytes, schema: Schema, limit: int) -> str:
    raw = zlib.decompress(body)
    peak, outcome = parse_peak(body, schema, limit)
    return (f"| {name} | {len(body) / MiB:.2f} MiB | {len(raw) / MiB:.2f} MiB | "
            f"{validate.parse_cost(raw)[0] / MiB:.0f} MiB | {peak / MiB:.0f} MiB | {outcome} |")


def run(quick: bool) -> list[str]:
    overrides = {"labels": {"max_series": 500, "max_models": 10, "max_routes": 20}} \
        if quick else {}
    config = load(overrides)
    lab, limit = config.labels, config.aggregator.max_decompressed_bytes
    lines = ["| push | compressed | inflated | parse cost estimate | parse peak (tracemalloc) "
             f"| at the default limit ({limit / MiB:.0f} MiB inflated) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, length in (("demo calls, short labels", 12),
                         (f"every label value {lab.max_label_length} characters",
                          lab.max_label_length)):
        rec = full_store(config, length)
        delta = take(rec)
        delta.worker, delta.seq, delta.interval = "largest", 1, 5.0
        body = wire.encode(delta, rec.schema.layouts())
        lines.append(_line(f"a worker's store full ({len(delta.histograms):,} series, "
                           f"{len(delta.rows[names.REQUESTS_TOTAL]):,} request rows, every "
                           f"counter table full), {name}", body, rec.schema, limit))
    one, two = (len(zlib.decompress(dense_push(config, n))) for n in (1, 2))
    dense = one + (two - one) * (lab.max_series - 1)
    lines.append(f"| a worker's store full, every histogram bucket populated (two such series "
                 f"measured, {two - one:,} B each, × {lab.max_series:,}) | | "
                 f"{dense / MiB:.0f} MiB | | | "
                 f"{'accepted' if dense <= limit else 'refused: too_large'} |")
    body = dense_push(config)
    series = min(limit // one, lab.max_series)
    lines.append(_line(f"the densest valid push the limit allows (every bucket of {series:,} "
                       f"series)", body, Schema(config), limit))
    hostile = b"[" + b",".join([b"-9"] * (limit // 3)) + b"]"
    lines.append(_line("hostile: `[-9,-9,...]` up to the inflate limit (a new int per 3 bytes)",
                       zlib.compress(hostile, 9), Schema(config), limit))
    return lines


if __name__ == "__main__":
    import sys

    print("\n".join(run("--quick" in sys.argv)))
