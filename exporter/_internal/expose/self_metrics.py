"""The exporter's own families (`ttft_exporter_*`, and the likely cause the watch serves beside
its own): each declared once here, with its type, help and labels, and built by one function.

They were spelled in five places (the exposition, the aggregator, the push worker with other
help for the same two names, the watch with its own text renderer, and the reference, which
built a store and an aggregator to list them). Now each server hands `family` a table entry
and its values; the reference reads `TABLE`, and tests/test_self_metrics.py checks that every
`ttft_exporter_` name in the code is declared here once and that each server serves its
families as declared. The three self-metrics kept as store rows (folds, drops) are declared
by their `names.Counter`, which the push wire and the aggregator also iterate; this table
takes them from there rather than spell them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import names

#: Who serves a family: every /metrics of a store (in-process, push worker, aggregator), the
#: aggregator (`ttft-exporter serve`) alone, a push worker alone, `ttft-exporter watch`.
STORE, AGGREGATOR, WORKER, WATCH = "store", "aggregator", "worker", "watch"
COUNTER, GAUGE = "counter", "gauge"

#: Values of a family: one number (no labels), or label values (in `labels` order) -> number.
Values = float | Mapping[tuple[str, ...], float]


@dataclass(frozen=True)
class SelfMetric:
    """A family the exporter serves about itself."""

    name: str  # with `_total` for a counter
    kind: str  # COUNTER or GAUGE
    help: str
    labels: tuple[str, ...]  # sorted (the order Prometheus text uses)
    served_by: tuple[str, ...]

    @classmethod
    def of_counter(cls, counter: names.Counter, served_by: tuple[str, ...] = (STORE,)
                   ) -> "SelfMetric":
        """A counter table entry (names.COUNTERS) as a family: how the store's rows render."""
        return cls(counter.name, GAUGE if counter.gauge else COUNTER, counter.help,
                   counter.labels, served_by)


def family(metric: SelfMetric, values: Values) -> Metric:
    """The prometheus_client family of `metric` holding `values`: what every server renders
    (text, OpenMetrics, protobuf) and `exporter.collector()` yields."""
    kind = CounterMetricFamily if metric.kind == COUNTER else GaugeMetricFamily
    if not metric.labels:
        assert not isinstance(values, Mapping), metric.name
        return kind(metric.name, metric.help, value=values)
    out = kind(metric.name, metric.help, labels=list(metric.labels))
    assert isinstance(values, Mapping), metric.name
    for row, value in values.items():
        out.add_metric(list(row), value)
    return out


SERIES = SelfMetric(names.SELF_SERIES, GAUGE, "Histogram series held by this exporter.", (),
                    (STORE,))
SCRAPE_DURATION = SelfMetric(
    names.SELF_SCRAPE_DURATION, GAUGE, "Time the previous scrape of this exporter took to render.",
    (), (STORE,))
HTTP_CLOSED = SelfMetric(
    names.SELF_HTTP_CLOSED, COUNTER, "Connections the exporter's HTTP servers closed: too slow "
    "to send a request (slow), request headers over 32 KiB (large), idle or unread and shed to "
    "make room (shed), a response not read within the write timeout (unread), or new while "
    "every slot was busy (limit).", (names.REASON,), (STORE,))
PUSH_REJECTED = SelfMetric(
    names.SELF_PUSH_REJECTED, COUNTER, "Pushes rejected by this aggregator, by reason.",
    (names.REASON,), (AGGREGATOR,))
PUSH_BATCHES = SelfMetric(
    names.SELF_PUSH_BATCHES, COUNTER,
    "Pushes accepted: applied, or duplicate (a retry already applied).", (names.RESULT,),
    (AGGREGATOR,))
PUSH_WORKERS = SelfMetric(
    names.SELF_PUSH_WORKERS, GAUGE, "Worker processes whose gauges are live (pushed recently).",
    (), (AGGREGATOR,))
PUSH_LOST = SelfMetric(
    names.SELF_PUSH_LOST, COUNTER, "Batches push workers gave up unacknowledged (queue bound, "
    "refused, or unacknowledged at exit): a worker serves its own, the aggregator the sum its "
    "workers reported.", (), (AGGREGATOR, WORKER))
PUSH_FAILURES = SelfMetric(
    names.SELF_PUSH_FAILURES, COUNTER, "Push attempts that failed (retried later): a worker "
    "serves its own, the aggregator the sum its workers reported.", (), (AGGREGATOR, WORKER))
SNAPSHOT_FAILURES = SelfMetric(
    names.SELF_SNAPSHOT_FAILURES, COUNTER, "State snapshots or journal writes that failed (or "
    "journal records found bad at a restart).", (), (AGGREGATOR,))
LIKELY_CAUSE = SelfMetric(
    names.LIKELY_CAUSE, GAUGE, "1 per degraded (model, route): the likely cause of its TTFT "
    "rise (one series per cold tenant for cold_cache).",
    ("cause", names.MODEL, names.ROUTE, names.TENANT), (WATCH,))
WATCH_EVALUATIONS = SelfMetric(
    names.WATCH_EVALUATIONS, COUNTER, "Decisions run, by outcome (error: Prometheus unreachable "
    "or a query failed; no findings are served then).", (names.OUTCOME,), (WATCH,))
WATCH_SECONDS = SelfMetric(names.WATCH_SECONDS, GAUGE,
                           "Seconds the last decision took (its queries).", (), (WATCH,))
WATCH_LAST_SUCCESS = SelfMetric(names.WATCH_LAST_SUCCESS, GAUGE,
                                "Unix time of the last decision that ran.", (), (WATCH,))

#: The store's self-metric rows (folds, drops), declared in names.COUNTERS.
STORE_COUNTERS: tuple[SelfMetric, ...] = tuple(
    SelfMetric.of_counter(c) for c in (names.TENANT_FOLDS, names.FOLDS_BY_LABEL, names.DROPPED))
#: Every family the exporter serves about itself, in the order each server serves them.
TABLE: tuple[SelfMetric, ...] = (
    *STORE_COUNTERS, SERIES, SCRAPE_DURATION, HTTP_CLOSED, PUSH_REJECTED, PUSH_BATCHES,
    PUSH_WORKERS, PUSH_LOST, PUSH_FAILURES, SNAPSHOT_FAILURES, LIKELY_CAUSE, WATCH_EVALUATIONS,
    WATCH_SECONDS, WATCH_LAST_SUCCESS)


def served_by(server: str) -> tuple[SelfMetric, ...]:
    return tuple(m for m in TABLE if server in m.served_by)
