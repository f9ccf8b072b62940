"""One series' histogram as every exposition serves it: the one model the text format,
OpenMetrics, the protobuf format and the prometheus_client families are all rendered from.

What a format shows of a histogram is the same in all of them: a cumulative count at each `le`
boundary and at +Inf (the count), the sum in the family's unit, the latest exemplar of each
`le` bucket; the protobuf format adds the native buckets, read from the native counts the
store keeps for the series, or else from the HDR counts. Computing it once per changed series
keeps the formats from drifting (tests/test_exposition.py proves their
bytes against prometheus_client's and against each other).
"""

from __future__ import annotations

from typing import NamedTuple

from .. import names
from ..record.exemplar import Exemplar
from ..record.histogram import Histogram, Layout
from ..record.native_counts import Frozen, NativeCounts


class Sample(NamedTuple):
    #: The exact count of values at or under each `le` boundary, then +Inf (= `count`).
    cumulative: list[int]
    count: int
    #: The sum of the values in the family's unit.
    total: float
    #: `le` bucket position (len(boundaries) = +Inf) -> latest exemplar, or None.
    exemplars: dict[int, Exemplar] | None
    #: The HDR counts themselves (the native buckets of the protobuf format).
    hist: Histogram
    #: The series' native counts for the protobuf format (store.Snapshot.native: a copy, or
    #: counts to seed), or None.
    native: Frozen | NativeCounts | None = None


def sample(family: names.Family, hist: Histogram,
           exemplars: dict[int, Exemplar] | None = None,
           native: Frozen | NativeCounts | None = None) -> Sample:
    """The sample of one series' histogram snapshot (a private copy: nothing else holds it)."""
    cumulative = hist.cumulative_at()
    cumulative.append(hist.count)
    return Sample(cumulative, hist.count, family.to_unit(hist.total), exemplars, hist, native)


def zero(family: names.Family, layout: Layout,
         exemplars: dict[int, Exemplar] | None = None) -> Sample:
    """The sample of a series that recorded nothing yet, with the exemplars it has (a debut:
    debut.py; an exemplar recorded before the first scrape is served with it)."""
    return sample(family, Histogram(layout), exemplars)
