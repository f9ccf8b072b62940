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
from typing import Protocol

from .exemplar import Exemplar
from .histogram import RAW_SLICE_MAX, Batch, Histogram, WindowPart
from .schema import FamilySchema


class Addable(Protocol):
    """A histogram to add to a series: a local one, or one received from a worker."""

    def add_to(self, hist: Histogram) -> None: ...


class Series:
    """One histogram series: its cumulative counts, window slices and latest exemplars."""

    __slots__ = ("state", "values", "hist", "slices", "pending", "pending_slice", "exemplars")

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

    def fold(self, keep_slices: int) -> None:
        """Move the pending values into the histogram and their window slice (under the lock)."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        batch = self.state.layout.bucketize(pending)
        self.hist.record_batch(batch)
        if self.state.windowed:
            self._add_to_window(self.pending_slice, keep_slices, pending, batch)

    def add(self, hist: Addable, slice_id: int | None, keep_slices: int) -> None:
        """Add a histogram's counts; with a `slice_id`, to that window slice too."""
        if self.pending:
            self.fold(keep_slices)
        hist.add_to(self.hist)
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

    __slots__ = ("schema", "family", "layout", "label_names", "has_tenant", "windowed", "series")

    def __init__(self, schema: FamilySchema):
        self.schema = schema
        self.family = schema.family
        self.layout = schema.layout
        self.label_names = schema.label_names
        self.has_tenant = schema.has_tenant
        self.windowed = schema.windowed
        self.series: dict[tuple[str, ...], Series] = {}
