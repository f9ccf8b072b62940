"""A recorder's metrics as prometheus_client metric families.

Three users: `exporter.collector()` (apps that serve /metrics with prometheus_client render
these themselves), the counters and self-metrics of every scrape (small families, rendered by
`render_family` the way prometheus_client does), and the tests, which prove the cached renderer
(exposition.py) serves the same bytes prometheus_client makes of these.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import Exemplar as PromExemplar, HistogramMetricFamily, Metric

from .. import names
from ..record.exemplar import LABEL as EXEMPLAR_LABEL
from ..record.histogram import part_count, quantiles_of
from ..record.series import FamilyState, Series
from ..record.store import Counts, Store, no_rows
from . import self_metrics, textformat
from .closed_connections import CLOSED, REASONS
from .sample import sample


def window_help(window_seconds: float, fam: names.Family) -> str:
    return (f"Quantiles of {fam.name} over the last "
            f"{textformat.number(window_seconds)} s, exact to HDR precision; count "
            f"and sum are cumulative.")


def window_quantiles(rec: Store, state: FamilyState, series: Series, current_slice: int
                     ) -> list[float] | None:
    """Exact HDR quantiles over the live window slices, or None when the window is empty."""
    slices = rec.window_slices(series, current_slice)
    if not any(part_count(p) for p in slices):
        return None
    return [state.family.to_unit(v) for v in
            quantiles_of(slices, rec.config.window.quantiles, state.layout)]


def counter_families(rec: Store, scrape_seconds: float) -> list[Metric]:
    """Every counter and gauge of names.COUNTERS, then the exporter's own gauges and the HTTP
    servers' closed connections."""
    return _counter_families(rec.counts(), CLOSED, scrape_seconds)


def counter_families_at_birth() -> list[Metric]:
    """What `counter_families` read of a store when it was created (every store starts
    without a series or a row) in a process that had closed no connection yet."""
    return _counter_families(Counts(no_rows(), 0), dict.fromkeys(REASONS, 0), 0.0)


def _counter_families(counts: Counts, closed_connections: dict[str, int],
                      scrape_seconds: float) -> list[Metric]:
    out: list[Metric] = []
    for counter in names.COUNTERS:
        rows = counts.rows[counter.name]
        zeros = {(value,): rows.get((value,), 0) for value in counter.zero_rows}
        out.append(self_metrics.family(self_metrics.SelfMetric.of_counter(counter),
                                       {**zeros, **rows}))
    return out + [
        self_metrics.family(self_metrics.SERIES, counts.series),
        self_metrics.family(self_metrics.SCRAPE_DURATION, scrape_seconds),
        self_metrics.family(self_metrics.HTTP_CLOSED,
                            {(reason,): closed_connections[reason] for reason in REASONS})]


def render_family(family: Metric, openmetrics: bool) -> str:
    """A small family (counters, gauges) rendered each scrape, prometheus_client's way."""
    name = family.name + "_total" if family.type == "counter" else family.name
    out = [textformat.header(name, family.documentation, family.type, openmetrics)]
    labels: dict[str, str] | None = None
    label_text = ""
    for s in family.samples:
        if s.labels is not labels:  # (a `_created` sample shares its row's labels)
            labels = s.labels
            label_text = textformat.labels(list(labels.items()))
        out.append(f"{s.name}{{{label_text}}} {textformat.number(s.value)}\n" if label_text
                   else f"{s.name} {textformat.number(s.value)}\n")
    return "".join(out)


def families(rec: Store, scrape_seconds: float = 0.0) -> Iterator[Metric]:
    """Every family of the recorder (the reference, uncached path)."""
    current_slice = rec.current_slice()
    snapshot = [(state, rec.snapshot(state)) for state in rec.families.values()]
    for state, series_list in snapshot:
        fam = state.family
        les = [textformat.number(fam.to_unit(b)) for b in state.layout.boundaries]
        hist_family = HistogramMetricFamily(fam.name, fam.help, labels=state.label_names)
        samples = [(series, sample(fam, hist, exemplars))
                   for series, hist, exemplars, _ in series_list]
        for series, now in samples:
            buckets: list = list(zip(les + ["+Inf"], now.cumulative))
            for position, (trace_id, value, timestamp) in (now.exemplars or {}).items():
                buckets[position] += (PromExemplar({EXEMPLAR_LABEL: trace_id}, value,
                                                   timestamp),)
            hist_family.add_metric(list(series.values), buckets, now.total)
        yield hist_family
        if state.windowed:
            window = Metric(fam.window_name, window_help(rec.config.window.seconds, fam),
                            "summary")
            for series, now in samples:
                labels = dict(zip(state.label_names, series.values))
                values = window_quantiles(rec, state, series, current_slice)
                for q, v in zip(rec.config.window.quantiles, values or ()):
                    window.add_sample(fam.window_name, {**labels, names.QUANTILE:
                                                        textformat.number(q)}, v)
                window.add_sample(fam.window_name + "_count", labels, now.count)
                window.add_sample(fam.window_name + "_sum", labels, now.total)
            yield window
    yield from counter_families(rec, scrape_seconds)
