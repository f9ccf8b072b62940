"""Exposition: the bytes `/metrics` serves, identical to what prometheus_client renders.

prometheus_client's `generate_latest` costs 14–21 µs per line; at 10,000 series × 30 buckets
that is seconds per scrape. Here each series' lines are rendered once and cached on the series;
a scrape re-renders only the series that changed since the previous scrape (and the window
quantiles when the window slid) and joins cached strings. `families()` builds the same data as
prometheus_client metric families for `exporter.collector()`; tests/test_exposition.py proves
both paths give the same bytes, in the text format and in OpenMetrics.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

from prometheus_client.core import (CounterMetricFamily, Exemplar as PromExemplar,
                                    GaugeMetricFamily, HistogramMetricFamily, Metric)
from prometheus_client.utils import floatToGoString

from . import names
from .histogram import Histogram, part_count, quantiles_of
from .recorder import US_PER_SECOND, Exemplar, FamilyState, Recorder, Series

#: Exemplar label holding the trace id (Grafana's default for Prometheus exemplars).
EXEMPLAR_LABEL = "trace_id"

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_SELF_HELP = {
    names.SELF_SERIES: "Histogram series held by this exporter.",
    names.SELF_TENANT_FOLDS: "Calls whose tenant was folded into __other__ by the label guard.",
    names.SELF_DROPS: "Values or series not recorded, by reason.",
    names.SELF_SCRAPE_DURATION: "Time the previous scrape of this exporter took to render.",
}
REQUESTS_HELP = "LLM calls by outcome (ok, error, cancelled, timeout, abandoned)."
IN_FLIGHT_HELP = "LLM calls started and not yet ended."


def _count(n: int) -> str:
    """floatToGoString(float(n)) for a count, without the float round trip in the common case."""
    return f"{n}.0" if n < 1_000_000 else floatToGoString(n)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _labels(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs))


def _seconds_or_tokens(state: FamilyState, value: int) -> float:
    return value / US_PER_SECOND if state.family.unit == "seconds" else float(value)


class Renderer:
    """Caches rendered series text between scrapes; one per recorder."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        config = recorder.config
        self._quantiles = config.window.quantiles
        self._quantile_labels = [floatToGoString(q) for q in self._quantiles]
        self._le: dict[str, list[str]] = {
            name: [floatToGoString(_seconds_or_tokens(state, b)) for b in
                   state.layout.boundaries] + ["+Inf"]
            for name, state in recorder.families.items()}
        self._lock = threading.Lock()  # one render at a time: the caches are not shared-safe

    def render(self, openmetrics: bool = False) -> bytes:
        with self._lock:
            started = time.perf_counter()
            body = self._render(openmetrics)
            self.recorder.last_scrape_seconds = time.perf_counter() - started
            return body

    def _render(self, openmetrics: bool) -> bytes:
        rec = self.recorder
        dirty, current_slice = rec.swap_dirty()
        for series, hist, exemplars in dirty:
            series.text, series.openmetrics_text = self._histogram_text(series, hist, exemplars)
            series.window_key = -1  # its window changed too
        out: list[str] = []
        for state in rec.families.values():
            fam = state.family
            out.append(_header(fam.name, fam.help, "histogram", openmetrics))
            if openmetrics:
                out.extend(s.openmetrics_text or s.text for s in list(state.series.values()))
            else:
                out.extend(s.text for s in list(state.series.values()))
            if state.windowed:
                out.append(_header(fam.window_name, _window_help(rec, fam), "summary",
                                   openmetrics))
                for series in list(state.series.values()):
                    if series.window_key != current_slice:
                        series.window_text = self._window_text(state, series, current_slice)
                        series.window_key = current_slice
                    out.append(series.window_text)
        for family in _counter_families(rec):
            out.append(_render_family(family, openmetrics))
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")

    def _histogram_text(self, series: Series, hist: Histogram,
                        exemplars: dict[int, Exemplar] | None) -> tuple[str, str]:
        """The series' lines in the text format, and in OpenMetrics when they differ ("" if not).

        They differ only by the exemplars, which OpenMetrics carries after a bucket's value.
        """
        state = series.state
        name = state.family.name
        labels = series.label_text
        if not labels:
            labels = series.label_text = _labels(list(zip(state.label_names, series.values)))
        cumulative = hist.cumulative_at()
        cumulative.append(hist.count)
        lines = [f'{name}_bucket{{le="{le}",{labels}}} {_count(c)}'
                 for le, c in zip(self._le[name], cumulative)]
        tail = (f"\n{name}_count{{{labels}}} {_count(hist.count)}\n{name}_sum{{{labels}}} "
                f"{floatToGoString(_seconds_or_tokens(state, hist.total))}\n")
        text = "\n".join(lines) + tail
        if not exemplars:
            return text, ""
        for position, (trace_id, value, timestamp) in exemplars.items():
            lines[position] += (f' # {{{EXEMPLAR_LABEL}="{_escape(trace_id)}"}} '
                                f"{floatToGoString(value)} {timestamp}")
        return text, "\n".join(lines) + tail

    def _window_text(self, state: FamilyState, series: Series, current_slice: int) -> str:
        values = window_quantiles(self.recorder, state, series, current_slice) or ()
        name = state.family.window_name
        pairs = list(zip(state.label_names, series.values))
        labels = series.label_text or _labels(pairs)
        # `quantile` sorts between the other labels: render the two sides once
        before = "".join(f'{k}="{_escape(v)}",' for k, v in pairs if k < names.QUANTILE)
        after = "".join(f',{k}="{_escape(v)}"' for k, v in pairs if k > names.QUANTILE)
        lines = [f'{name}{{{before}{names.QUANTILE}="{q}"{after}}} {floatToGoString(v)}\n'
                 for q, v in zip(self._quantile_labels, values)]
        hist = series.hist
        lines.append(f"{name}_count{{{labels}}} {_count(hist.count)}\n")
        lines.append(f"{name}_sum{{{labels}}} "
                     f"{floatToGoString(_seconds_or_tokens(state, hist.total))}\n")
        return "".join(lines)


def window_quantiles(rec: Recorder, state: FamilyState, series: Series, current_slice: int
                     ) -> list[float] | None:
    """Exact HDR quantiles over the live window slices, or None when the window is empty."""
    slices = rec.window_slices(series, current_slice)
    if not any(part_count(p) for p in slices):
        return None
    return [_seconds_or_tokens(state, v) for v in
            quantiles_of(slices, rec.config.window.quantiles, state.layout)]


def _window_help(rec: Recorder, fam: names.Family) -> str:
    return (f"Quantiles of {fam.name} over the last {floatToGoString(rec.config.window.seconds)} "
            f"s, exact to HDR precision; count and sum are cumulative.")


def _header(name: str, help_text: str, kind: str, openmetrics: bool) -> str:
    if openmetrics:
        help_text = _escape(help_text)
        if kind == "counter":
            name = name.removesuffix("_total")
    else:
        help_text = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def _render_family(family: Metric, openmetrics: bool) -> str:
    """Small families (counters, gauges) rendered each scrape, prometheus_client's way."""
    name = family.name + "_total" if family.type == "counter" else family.name
    out = [_header(name, family.documentation, family.type, openmetrics)]
    for s in family.samples:
        labels = _labels(list(s.labels.items()))
        label_text = f"{{{labels}}}" if labels else ""
        out.append(f"{s.name}{label_text} {floatToGoString(s.value)}\n")
    return "".join(out)


def _counter_families(rec: Recorder) -> list[Metric]:
    requests, in_flight, drops, folds, series_count = rec.counters()
    req = CounterMetricFamily(names.REQUESTS_TOTAL, REQUESTS_HELP,
                              labels=[names.MODEL, names.OUTCOME, names.PROVIDER, names.ROUTE,
                                      names.TENANT])
    for key, value in requests.items():
        req.add_metric(list(key), value)
    flight = GaugeMetricFamily(names.REQUESTS_IN_FLIGHT, IN_FLIGHT_HELP,
                               labels=[names.MODEL, names.PROVIDER, names.ROUTE])
    for key, value in in_flight.items():
        flight.add_metric(list(key), value)
    series = GaugeMetricFamily(names.SELF_SERIES, _SELF_HELP[names.SELF_SERIES],
                               value=series_count)
    fold = CounterMetricFamily(names.SELF_TENANT_FOLDS, _SELF_HELP[names.SELF_TENANT_FOLDS],
                               labels=[names.MODEL, names.ROUTE])
    for key, value in folds.items():
        fold.add_metric(list(key), value)
    drop = CounterMetricFamily(names.SELF_DROPS, _SELF_HELP[names.SELF_DROPS],
                               labels=[names.REASON])
    for reason, value in drops.items():
        drop.add_metric([reason], value)
    scrape = GaugeMetricFamily(names.SELF_SCRAPE_DURATION, _SELF_HELP[names.SELF_SCRAPE_DURATION],
                               value=rec.last_scrape_seconds)
    return [req, flight, series, fold, drop, scrape]


def families(rec: Recorder) -> Iterator[Metric]:
    """The same data as prometheus_client metric families (the reference, uncached path)."""
    current_slice = time.perf_counter_ns() // rec.slice_ns
    snapshot = [(state, rec.snapshot(state)) for state in rec.families.values()]
    for state, series_list in snapshot:
        fam = state.family
        les = [floatToGoString(_seconds_or_tokens(state, b)) for b in state.layout.boundaries]
        hist_family = HistogramMetricFamily(fam.name, fam.help, labels=state.label_names)
        for series, hist, exemplars in series_list:
            buckets: list = list(zip(les + ["+Inf"], hist.cumulative_at() + [hist.count]))
            for position, (trace_id, value, timestamp) in (exemplars or {}).items():
                buckets[position] += (PromExemplar({EXEMPLAR_LABEL: trace_id}, value,
                                                   timestamp),)
            hist_family.add_metric(list(series.values), buckets,
                                   _seconds_or_tokens(state, hist.total))
        yield hist_family
        if state.windowed:
            window = Metric(fam.window_name, _window_help(rec, fam), "summary")
            for series, hist, _ in series_list:
                labels = dict(zip(state.label_names, series.values))
                values = window_quantiles(rec, state, series, current_slice)
                for q, v in zip(rec.config.window.quantiles, values or ()):
                    window.add_sample(fam.window_name, {**labels, names.QUANTILE:
                                                        floatToGoString(q)}, v)
                window.add_sample(fam.window_name + "_count", labels, hist.count)
                window.add_sample(fam.window_name + "_sum", labels,
                                  _seconds_or_tokens(state, hist.total))
            yield window
    yield from _counter_families(rec)
