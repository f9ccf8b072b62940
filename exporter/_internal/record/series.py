"""One histogram series: cumulative HDR counts, the sliding window's slices, the latest exemplars.

Values reach a series as a pending batch (appended by the recorder under its lock, one lock per
call) and are folded into the histogram and the window slice in one go (`fold`); a histogram
from elsewhere (a worker's delta, at the aggregator) is added whole (`add`). A window slice holds
its raw values until it has RAW_SLICE_MAX, then becomes an HDR histogram: a quiet series' slice
costs bytes per value, a busy one HDR's fixed size. Not thread-safe: the recorder's lock covers
every method.
"""

from __future__ import annotations

from array import array
from typing import Iterable, Protocol

from .exemplar import Exemplar
from .histogram import RAW_SLICE_MAX, Batch, Histogram, WindowPart
from .native_counts import NativeCounts
from .schema import FamilySchema


class Addable(Protocol):
    """A histogram to add to a series: a local one, or one received from a worker."""

    count: int

    def add_to(self, hist: Histogram) -> None: ...

    def nonzero(self) -> Iterable[tuple[int, int]]: ...


class Series:
    """One histogram series: its cumulative counts, window slices and latest exemplars."""

    __slots__ = ("state", "values", "hist", "slices", "pending", "pending_slice", "exemplars",
                 "native")

    def __init__(self, state: "FamilyState", values: tuple[str, ...]):
        self.state = state
        self.values = values
        self.hist = Histogram(state.layout)
        #: (slice id, raw values or histogram) of the sliding window, oldest first.
        self.slices: list[tuple[int, WindowPart]] | None = None
        #: Values recorded but not yet folded into `hist` (and the window slice pending_slice).
        self.pending: list[int] = []
        self.pending_slice = 0
        #: `le` bucket position (len(boundaries) = +Inf) -> latest exemplar; None until traced.
        self.exemplars: dict[int, Exemplar] | None = None
        #: `hist` in native buckets, kept by the readers once a protobuf scrape asked for them
        #: (native_counts.py); None while there are none, or they fell behind.
        self.native: NativeCounts | None = None

    def fold(self, keep_slices: int) -> Batch | None:
        """Move the pending values into the histogram and their window slice (under the lock);
        the batch folded, if any."""
        pending = self.pending
        if not pending:
            return None
        self.pending = []
        batch = self.state.layout.bucketize(pending)
        self.hist.record_batch(batch)
        if self.state.windowed:
            self._add_to_window(self.pending_slice, keep_slices, pending, batch)
        return batch

    def read_fold(self, keep_slices: int) -> None:
        """A reader's fold (under the lock): the pending values, into the native counts too,
        which are dropped if they fell behind (a fold in the caller's thread, a take)."""
        batch = self.fold(keep_slices)
        native = self.native
        if native is not None and not native.follow_batch(self.hist, batch):
            self.native = None

    def add(self, hist: Addable, slice_id: int | None, keep_slices: int) -> None:
        """Add a histogram's counts (the native counts follow); with a `slice_id`, to that
        window slice too."""
        self.read_fold(keep_slices)
        hist.add_to(self.hist)
        native = self.native
        if native is not None and not native.follow(self.hist, hist.nonzero(), hist.count):
            self.native = None
        if slice_id is not None and self.state.windowed:
            self._add_to_window(slice_id, keep_slices, None, hist)

    def _add_to_window(self, slice_id: int, keep: int, raw: list[int] | None,
                       counted: Batch | Addable) -> None:
        """Add values to window slice `slice_id` (opened if it is new, the oldest dropped).

        A slice holds raw values until it has RAW_SLICE_MAX, then an HDR histogram: `raw` are
        the values themselves when known (a local batch), `counted` their counts.
        """
        slices = self.slices
        if slices is None:
            slices = self.slices = []
        if not slices or slices[-1][0] < slice_id:
            slices.append((slice_id, array("q")))
            del slices[:-keep]
        sid, part = slices[-1]
        if not isinstance(part, Histogram):
            if raw is not None and len(part) + len(raw) <= RAW_SLICE_MAX:
                part.extend(raw)
                return
            values, part = part, Histogram(self.state.layout)
            part.record_many(values)
            slices[-1] = (sid, part)
        if isinstance(counted, Batch):
            part.record_batch(counted)
        else:
            counted.add_to(part)


class FamilyState:
    """One family's schema and its series, keyed by label values in `label_names` order."""

    __slots__ = ("schema", "family", "layout", "label_names", "has_tenant", "windowed", "series",
                 "native_table")

    def __init__(self, schema: FamilySchema):
        self.schema = schema
        self.family = schema.family
        self.layout = schema.layout
        self.label_names = schema.label_names
        self.has_tenant = schema.has_tenant
        self.windowed = schema.windowed
        self.series: dict[tuple[str, ...], Series] = {}
        #: HDR index -> native index at the configured schema (native_counts.native_table),
        #: built when a protobuf reader first asks for native counts.
        self.native_table: list[int] | None = None
