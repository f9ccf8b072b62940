"""Exposition: the bytes `/metrics` serves, identical to what prometheus_client renders.

prometheus_client's `generate_latest` costs 14–21 µs per line; at 10,000 series × 30 buckets
that is seconds per scrape. The renderer keeps each series' lines between scrapes, re-renders
only the series that changed since the previous scrape (and the window quantiles when the window
slid) and joins cached strings. Its caches are its own: the recorder hands out snapshots and
knows nothing of text. tests/test_exposition.py proves the bytes equal prometheus_client's (from
families.py), in the text format and in OpenMetrics, and pins a few by hand from the formats'
specifications. The protobuf exposition (native histograms) shares the cache: a series changed
since the last scrape is rendered in the format asked for, its other formats are marked stale
and rendered from a fresh snapshot when asked for (protobuf_exposition.py builds the bytes).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, NamedTuple

from prometheus_client.core import Metric

from .. import names
from ..record.exemplar import LABEL as EXEMPLAR_LABEL, Exemplar
from ..record.series import FamilyState, Series
from ..record.store import Snapshot, Store
from . import textformat
from .textformat import OPENMETRICS, PROTOBUF, TEXT
from .created import CreatedTimes
from .debut import SEEN_ALL, Debuts, Delivery
from .native_fields import NativeFields
from .families import (counter_families, counter_families_at_birth, render_family, window_help,
                       window_quantiles)
from .sample import Sample, sample, zero

if TYPE_CHECKING:
    from .protobuf import Encoder

#: Families rendered after the recorder's (the aggregator's self-metrics).
ExtraFamilies = Callable[[], list[Metric]]


#: A series' histogram and SLO-count metrics, serialized (protobuf_exposition.Encoder).
_Protobuf = tuple[bytes, bytes]


class Scrape(NamedTuple):
    """A body, and for a scraper what it shows (`Renderer.delivered` once it reached it)."""

    body: bytes
    delivery: Delivery | None


class _Cached:
    """A series' rendered lines: the histogram (OpenMetrics differs only by exemplars), and the
    window quantiles with the slice they were computed for; the same in protobuf. `text` or
    `protobuf` is None while stale (the series changed during a scrape of the other format).
    `born` is its birth number and `exemplars` its latest ones, for its debut (debut.py);
    `created` its created timestamp (created.py) and `created_line` its OpenMetrics line."""

    __slots__ = ("labels", "pairs", "born", "created", "created_line", "count", "total",
                 "exemplars", "text", "openmetrics", "window", "window_slice", "protobuf",
                 "protobuf_window", "protobuf_window_slice", "native")

    def __init__(self, name: str, labels: str, pairs: list[tuple[str, str]], born: int,
                 created: float | None):
        self.labels = labels
        self.pairs = pairs
        self.born = born
        self.created = created
        self.created_line = ("" if created is None else
                             f"{name}_created{{{labels}}} {textformat.number(created)}\n")
        self.exemplars: dict[int, Exemplar] | None = None
        self.count = 0  # of the histogram sample the text shows (the window lines repeat it)
        self.total = 0.0
        self.text: str | None = ""
        self.openmetrics = ""
        self.window = ""
        self.window_slice = -1
        self.protobuf: _Protobuf | None = None
        self.protobuf_window = b""
        self.protobuf_window_slice = -1
        #: The native fields of its latest protobuf message (native_fields.py), once rendered.
        self.native: NativeFields | None = None


class Renderer:
    """Renders one recorder, caching each series' text between scrapes.

    Its debuts and created timestamps start from its build: what the recorder holds then
    continues where it was. Built `at_birth`, it starts as if built when the recorder was
    created (`Store.born`, empty, in a process that had closed no connection yet): a process
    builds its renderer at its first scrape (runtime.py), and what it recorded before must
    debut and be dated as if the renderer had seen it born. The `extra` families are then
    dated from their first render, as families given to a built renderer are."""

    def __init__(self, recorder: Store, extra: ExtraFamilies | None = None,
                 at_birth: bool = False):
        self.recorder = recorder
        self.extra = extra
        self.last_scrape_seconds = 0.0
        config = recorder.config
        self._quantile_labels = [textformat.number(q) for q in config.window.quantiles]
        self._le: dict[str, list[str]] = {
            name: [textformat.number(state.family.to_unit(b)) for b in state.layout.boundaries]
            + ["+Inf"] for name, state in recorder.families.items()}
        self._cache: dict[Series, _Cached] = {}
        if at_birth:
            counters = counter_families_at_birth()
            self._debuts = Debuts([], counters)
            self._created = CreatedTimes(counters, recorder.born)
        else:
            counters = counter_families(recorder, 0.0)
            self._debuts = Debuts(recorder.all_series(), counters)
            self._created = CreatedTimes(counters + (extra() if extra is not None else []),
                                         recorder.clock.time())
        self._encoder: Encoder | None = None  # built at the first protobuf scrape
        #: The recorder's removals seen (label expiry): past them, caches of gone series go.
        self._removals = recorder.removals
        self._lock = threading.Lock()  # one render at a time: the caches are not shared-safe

    def reset_lock_after_fork(self) -> None:
        self._lock = threading.Lock()

    def render(self, openmetrics: bool = False, scraper: str | None = None) -> bytes:
        """The text (or OpenMetrics) exposition, as `scraper` sees it (see `scrape`)."""
        return self.scrape(OPENMETRICS if openmetrics else TEXT, scraper).body

    def render_protobuf(self, scraper: str | None = None) -> bytes:
        """The delimited protobuf exposition, with native histograms."""
        return self.scrape(PROTOBUF, scraper).body

    def scrape(self, kind: str, scraper: str | None) -> Scrape:
        """The exposition in format `kind` (textformat.PROTOBUF, OPENMETRICS, TEXT). A
        `scraper` sees at zero the series and rows born since the last body delivered to it
        (debut.py) until `delivered` says this one reached it."""
        with self._lock:
            started = time.perf_counter()
            self._created.reading(self.recorder.clock.time())
            watermark = SEEN_ALL if scraper is None else self._debuts.watermark(scraper)
            body = (self._render_protobuf(watermark) if kind == PROTOBUF else
                    self._render(kind == OPENMETRICS, watermark))
            self.last_scrape_seconds = time.perf_counter() - started
            return Scrape(body, None if scraper is None else
                          Delivery(scraper, self._debuts.births))

    def _forget_removed(self) -> None:
        """Series and counter rows the recorder removed (their labels expired) leave the caches;
        one that comes back is new: it debuts again, with a new created timestamp."""
        removals = self.recorder.removals
        if removals == self._removals:
            return
        self._removals = removals
        current = set(self.recorder.all_series())
        self._cache = {s: cached for s, cached in self._cache.items() if s in current}
        rows = counter_families(self.recorder, 0.0) + (self.extra() if self.extra else [])
        self._debuts.forget(current, rows)
        self._created.forget(rows)

    def delivered(self, delivery: Delivery | None) -> None:
        """The body of this delivery reached its scraper: its debuts are used up there."""
        if delivery is not None:
            with self._lock:
                self._debuts.delivered(delivery)

    def _current(self, series_list: list[Series], protobuf: bool) -> list[_Cached]:
        """The cache entries of these series, rendered afresh where unseen or stale."""
        cache = self._cache
        stale = [series for series in series_list if series not in cache or (
            cache[series].protobuf is None if protobuf else cache[series].text is None)]
        if stale:  # changed before this renderer existed, while it rendered, or in another format
            self._update(self.recorder.snapshot_of(stale, native=protobuf), protobuf,
                         changed=False)
        return [cache[series] for series in series_list]

    def _debut(self, series_list: list[Series], cache: list[_Cached], watermark: int
               ) -> set[Series] | None:
        """Those of `series_list` born after `watermark`: this body shows them at zero."""
        if watermark >= self._debuts.births:
            return None
        return {series for series, cached in zip(series_list, cache) if cached.born > watermark}

    def _render(self, openmetrics: bool, watermark: int) -> bytes:
        rec = self.recorder
        changed, current_slice = rec.take_changed()  # (the store's first lock of a scrape:
        self._forget_removed()  # where label expiry runs, if due)
        self._update(changed)
        out: list[str] = []
        for state in rec.families.values():
            fam = state.family
            out.append(textformat.header(fam.name, fam.help, "histogram", openmetrics))
            series_list = rec.series_of(state)
            cache = self._current(series_list, protobuf=False)
            debut = self._debut(series_list, cache, watermark)
            if openmetrics:
                for series, cached in zip(series_list, cache):
                    out.append(self._zero_text(series, cached, True) if debut and series in debut
                               else cached.openmetrics or cached.text or "")
                    out.append(cached.created_line)
            elif debut:
                out.extend(self._zero_text(series, cached, False) if series in debut else
                           (cached.text or "") for series, cached in zip(series_list, cache))
            else:
                out.extend(c.text or "" for c in cache)
            if state.windowed:
                out.append(textformat.header(fam.window_name, window_help(
                    rec.config.window.seconds, fam), "summary", openmetrics))
                for series, cached in zip(series_list, cache):
                    if debut and series in debut:
                        out.append(self._window_text(state, series, cached, current_slice,
                                                     debut=True))
                        continue
                    if cached.window_slice != current_slice:
                        cached.window = self._window_text(state, series, cached,
                                                          current_slice)
                        cached.window_slice = current_slice
                    out.append(cached.window)
        families = self._counter_families(watermark, created=openmetrics)
        out.extend(render_family(family, openmetrics) for family in families)
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")

    def _render_protobuf(self, watermark: int) -> bytes:
        from .protobuf import delimited, header, small_family

        rec = self.recorder
        changed, current_slice = rec.take_changed(native=True)
        self._forget_removed()
        self._update(changed, protobuf=True)
        out: list[bytes] = []
        slo_parts: dict[str, list[bytes]] = {}
        quantiles = rec.config.window.quantiles
        for state in rec.families.values():
            fam = state.family
            series_list = rec.series_of(state)
            cache = self._current(series_list, protobuf=True)
            debut = self._debut(series_list, cache, watermark)
            parts = [c.protobuf for c in cache]
            if debut:
                parts = [self.encoder.histogram(fam, cached.pairs,
                                                zero(fam, state.layout, cached.exemplars),
                                                cached.created)
                         if series in debut else part
                         for series, cached, part in zip(series_list, cache, parts)]
            out.append(delimited(header(fam.name, fam.help, "histogram"),
                                 [part[0] for part in parts if part]))
            slo_parts[fam.name] = [part[1] for part in parts if part]
            if state.windowed:
                windows = []
                for series, cached in zip(series_list, cache):
                    if debut and series in debut:
                        values = window_quantiles(rec, state, series, current_slice)
                        windows.append(self.encoder.window(cached.pairs, quantiles, values, 0,
                                                           0.0))
                        continue
                    if cached.protobuf_window_slice != current_slice:
                        values = window_quantiles(rec, state, series, current_slice)
                        cached.protobuf_window = self.encoder.window(
                            cached.pairs, quantiles, values, cached.count, cached.total)
                        cached.protobuf_window_slice = current_slice
                    windows.append(cached.protobuf_window)
                out.append(delimited(header(fam.window_name, window_help(
                    rec.config.window.seconds, fam), "summary"), windows))
        for name, fam in self.encoder.slo_families():
            out.append(delimited(header(name, slo_help(fam), "counter"), slo_parts[fam.name]))
        families = self._counter_families(watermark, created=True)
        out.extend(small_family(family) for family in families)
        return b"".join(out)

    def _counter_families(self, watermark: int, created: bool) -> list[Metric]:
        """The recorder's counters and gauges (rows born after `watermark` at zero), then the
        extra families; with the counters' `_created` samples if `created`."""
        families = counter_families(self.recorder, self.last_scrape_seconds)
        if watermark != SEEN_ALL:
            self._debuts.zero_new_rows(families, watermark)
        if self.extra is not None:
            families += self.extra()
        self._created.note_rows(families)
        if created:
            self._created.with_created(families)
        return families

    def _zero_text(self, series: Series, cached: _Cached, openmetrics: bool) -> str:
        """The series' lines at zero, with its exemplars, for its debut (debut.py); not cached.
        """
        family = series.state.family
        text, with_exemplars = self._histogram_text(
            family, cached.labels, zero(family, series.state.layout, cached.exemplars))
        return (with_exemplars or text) if openmetrics else text

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            from .protobuf import Encoder

            self._encoder = Encoder(self.recorder.config, self.recorder.schema.families)
        return self._encoder

    def _update(self, snapshot: list[Snapshot], protobuf: bool = False, changed: bool = True
                ) -> None:
        """Render these series afresh in one format (their window lines follow); when they
        `changed`, the other format is stale."""
        for series, hist, exemplars, native in snapshot:
            cached = self._cache.get(series)
            if cached is None:
                pairs = list(zip(series.state.label_names, series.values))
                born = self._debuts.born(series)
                cached = self._cache[series] = _Cached(
                    series.state.family.name, textformat.labels(pairs), pairs, born,
                    None if born == 0 else self._created.previous_read)
            family = series.state.family
            now = sample(family, hist, exemplars, native)
            cached.exemplars = exemplars
            if protobuf:
                if cached.native is None:
                    cached.native = NativeFields()
                cached.protobuf = self.encoder.histogram(family, cached.pairs, now,
                                                         cached.created, cached.native)
                if changed:
                    cached.text = None
            else:
                cached.text, cached.openmetrics = self._histogram_text(family, cached.labels, now)
                if changed:
                    cached.protobuf = None
            cached.count, cached.total = now.count, now.total
            cached.window_slice = cached.protobuf_window_slice = -1  # its window changed too

    def _histogram_text(self, fam: names.Family, labels: str, now: Sample) -> tuple[str, str]:
        """The series' lines in the text format, and in OpenMetrics when they differ ("" if not).

        They differ only by the exemplars, which OpenMetrics carries after a bucket's value.
        """
        name = fam.name
        count = textformat.count
        lines = [f'{name}_bucket{{le="{le}",{labels}}} {count(c)}'
                 for le, c in zip(self._le[name], now.cumulative)]
        tail = (f"\n{name}_count{{{labels}}} {count(now.count)}\n{name}_sum{{{labels}}} "
                f"{textformat.number(now.total)}\n")
        text = "\n".join(lines) + tail
        exemplars = now.exemplars
        if not exemplars:
            return text, ""
        for position, (trace_id, value, timestamp) in exemplars.items():
            lines[position] += (f' # {{{EXEMPLAR_LABEL}="{textformat.escape(trace_id)}"}} '
                                f"{textformat.number(value)} {timestamp}")
        return text, "\n".join(lines) + tail

    def _window_text(self, state: FamilyState, series: Series, cached: _Cached,
                     current_slice: int, debut: bool = False) -> str:
        """The window summary's lines (`debut`: its count and sum at zero, as the histogram's).
        """
        values = window_quantiles(self.recorder, state, series, current_slice) or ()
        fam = state.family
        name = fam.window_name
        pairs = list(zip(state.label_names, series.values))
        escape = textformat.escape
        # `quantile` sorts between the other labels: render the two sides once
        before = "".join(f'{k}="{escape(v)}",' for k, v in pairs if k < names.QUANTILE)
        after = "".join(f',{k}="{escape(v)}"' for k, v in pairs if k > names.QUANTILE)
        lines = [f'{name}{{{before}{names.QUANTILE}="{q}"{after}}} {textformat.number(v)}\n'
                 for q, v in zip(self._quantile_labels, values)]
        labels = cached.labels
        count, total = (0, 0.0) if debut else (cached.count, cached.total)
        lines.append(f"{name}_count{{{labels}}} {textformat.count(count)}\n")
        lines.append(f"{name}_sum{{{labels}}} {textformat.number(total)}\n")
        return "".join(lines)


def slo_help(fam: names.Family) -> str:
    return (f"Calls whose {fam.name} value was at or under le seconds, at each SLO threshold "
            f"(le=\"+Inf\": every call); served with the native histogram.")
