"""A recorder's metrics as prometheus_client metric families.

Three users: `exporter.collector()` (apps that serve /metrics with prometheus_client render
these themselves), the counters and self-metrics of every scrape (small families, rendered by
`render_family` the way prometheus_client does), and the tests, which prove the cached renderer
(exposition.py) serves the same bytes prometheus_client makes of these.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import (CounterMetricFamily, Exemplar as PromExemplar,
                                    GaugeMetricFamily, HistogramMetricFamily, Metric)

from .. import names
from ..record.exemplar import LABEL as EXEMPLAR_LABEL
from ..record.histogram import part_count, quantiles_of
from ..record.recorder import FamilyState, Recorder, Series
from . import connection_guard, textformat

_SELF_HELP = {
    names.SELF_SERIES: "Histogram series held by this exporter.",
    names.SELF_TENANT_FOLDS: "Calls whose tenant was folded into __other__ by the label guard.",
    names.SELF_LABEL_FOLDS: "Calls whose model, route or provider, tasks whose name (or, "
                            "when a family reached max_series rows, whole label set) was "
                            "folded into __other__.",
    names.SELF_DROPS: "Values or series not recorded, by reason.",
    names.SELF_SCRAPE_DURATION: "Time the previous scrape of this exporter took to render.",
    names.SELF_HTTP_CLOSED: "Connections the exporter's HTTP servers closed: past "
                            "server.max_connections (limit), or too slow to send a request "
                            "(slow).",
}
REQUESTS_HELP = "LLM calls by outcome (ok, error, cancelled, timeout, abandoned)."
USAGE_HELP = {
    names.USAGE_INPUT_TOKENS: "Input tokens of the calls, from the provider's usage.",
    names.USAGE_CACHED_INPUT_TOKENS: "Input tokens the provider served from its prompt cache.",
}
UPSTREAM_HELP = ("LLM calls by the upstream that answered: resolved address, region header, "
                 "system fingerprint (unknown where not seen).")
IN_FLIGHT_HELP = "LLM calls started and not yet ended."


def window_help(rec: Recorder, fam: names.Family) -> str:
    return (f"Quantiles of {fam.name} over the last "
            f"{textformat.number(rec.config.window.seconds)} s, exact to HDR precision; count "
            f"and sum are cumulative.")


def window_quantiles(rec: Recorder, state: FamilyState, series: Series, current_slice: int
                     ) -> list[float] | None:
    """Exact HDR quantiles over the live window slices, or None when the window is empty."""
    slices = rec.window_slices(series, current_slice)
    if not any(part_count(p) for p in slices):
        return None
    return [state.family.to_unit(v) for v in
            quantiles_of(slices, rec.config.window.quantiles, state.layout)]


def counter_families(rec: Recorder, scrape_seconds: float) -> list[Metric]:
    """Requests, in-flight calls, usage per tenant, upstreams, the counters of names.COUNTERS
    and the exporter's self-metrics."""
    counters = rec.counters()
    requests, in_flight, drops, folds = (counters.requests, counters.in_flight, counters.drops,
                                         counters.folds)
    req = CounterMetricFamily(names.REQUESTS_TOTAL, REQUESTS_HELP,
                              labels=[names.MODEL, names.OUTCOME, names.PROVIDER, names.ROUTE,
                                      names.TENANT])
    for key, value in requests.items():
        req.add_metric(list(key), value)
    flight = GaugeMetricFamily(names.REQUESTS_IN_FLIGHT, IN_FLIGHT_HELP,
                               labels=[names.MODEL, names.PROVIDER, names.ROUTE])
    for key, value in in_flight.items():
        flight.add_metric(list(key), value)
    usage = []
    for name, rows in ((names.USAGE_INPUT_TOKENS, counters.input_tokens),
                       (names.USAGE_CACHED_INPUT_TOKENS, counters.cached_tokens)):
        family = CounterMetricFamily(name, USAGE_HELP[name], labels=list(names.USAGE_LABELS))
        for key, value in rows.items():
            family.add_metric(list(key), value)
        usage.append(family)
    upstream = CounterMetricFamily(names.UPSTREAM_REQUESTS, UPSTREAM_HELP,
                                   labels=list(names.UPSTREAM_LABELS))
    for key, value in counters.upstreams.items():
        upstream.add_metric(list(key), value)
    series = GaugeMetricFamily(names.SELF_SERIES, _SELF_HELP[names.SELF_SERIES],
                               value=counters.series)
    fold = CounterMetricFamily(names.SELF_TENANT_FOLDS, _SELF_HELP[names.SELF_TENANT_FOLDS],
                               labels=[names.MODEL, names.ROUTE])
    for key, value in folds.items():
        fold.add_metric(list(key), value)
    label_fold = CounterMetricFamily(names.SELF_LABEL_FOLDS, _SELF_HELP[names.SELF_LABEL_FOLDS],
                                     labels=[names.LABEL])
    for label in names.LABEL_FOLDS:
        label_fold.add_metric([label], counters.label_folds.get(label, 0))
    drop = CounterMetricFamily(names.SELF_DROPS, _SELF_HELP[names.SELF_DROPS],
                               labels=[names.REASON])
    for reason, value in drops.items():
        drop.add_metric([reason], value)
    scrape = GaugeMetricFamily(names.SELF_SCRAPE_DURATION, _SELF_HELP[names.SELF_SCRAPE_DURATION],
                               value=scrape_seconds)
    closed = CounterMetricFamily(names.SELF_HTTP_CLOSED, _SELF_HELP[names.SELF_HTTP_CLOSED],
                                 labels=[names.REASON])
    for reason in connection_guard.REASONS:
        closed.add_metric([reason], connection_guard.CLOSED[reason])
    out = [req, flight, *usage, upstream]
    for counter in names.COUNTERS:
        family = CounterMetricFamily(counter.name, counter.help, labels=list(counter.labels))
        for key, value in counters.counts[counter.name].items():
            family.add_metric(list(key), value)
        out.append(family)
    return out + [series, fold, label_fold, drop, scrape, closed]


def render_family(family: Metric, openmetrics: bool) -> str:
    """A small family (counters, gauges) rendered each scrape, prometheus_client's way."""
    name = family.name + "_total" if family.type == "counter" else family.name
    out = [textformat.header(name, family.documentation, family.type, openmetrics)]
    for s in family.samples:
        label_text = textformat.labels(list(s.labels.items()))
        out.append(f"{s.name}{{{label_text}}} {textformat.number(s.value)}\n" if label_text
                   else f"{s.name} {textformat.number(s.value)}\n")
    return "".join(out)


def families(rec: Recorder, scrape_seconds: float = 0.0) -> Iterator[Metric]:
    """Every family of the recorder (the reference, uncached path)."""
    current_slice = rec.current_slice()
    snapshot = [(state, rec.snapshot(state)) for state in rec.families.values()]
    for state, series_list in snapshot:
        fam = state.family
        les = [textformat.number(fam.to_unit(b)) for b in state.layout.boundaries]
        hist_family = HistogramMetricFamily(fam.name, fam.help, labels=state.label_names)
        for series, hist, exemplars in series_list:
            buckets: list = list(zip(les + ["+Inf"], hist.cumulative_at() + [hist.count]))
            for position, (trace_id, value, timestamp) in (exemplars or {}).items():
                buckets[position] += (PromExemplar({EXEMPLAR_LABEL: trace_id}, value,
                                                   timestamp),)
            hist_family.add_metric(list(series.values), buckets, fam.to_unit(hist.total))
        yield hist_family
        if state.windowed:
            window = Metric(fam.window_name, window_help(rec, fam), "summary")
            for series, hist, _ in series_list:
                labels = dict(zip(state.label_names, series.values))
                values = window_quantiles(rec, state, series, current_slice)
                for q, v in zip(rec.config.window.quantiles, values or ()):
                    window.add_sample(fam.window_name, {**labels, names.QUANTILE:
                                                        textformat.number(q)}, v)
                window.add_sample(fam.window_name + "_count", labels, hist.count)
                window.add_sample(fam.window_name + "_sum", labels, fam.to_unit(hist.total))
            yield window
    yield from counter_families(rec, scrape_seconds)
