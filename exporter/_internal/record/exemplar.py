"""Exemplars: the trace id of the latest traced call in each classic `le` bucket of a series.

One per bucket keeps a series' exemplars bounded (OpenMetrics allows one per bucket line);
"latest wins" everywhere exemplars meet: recording, merging a worker's deltas, aggregating.
"""

from __future__ import annotations

#: (trace id, value in the family's unit, Unix time).
Exemplar = tuple[str, float, float]

#: Exemplar label holding the trace id (Grafana's default for Prometheus exemplars).
LABEL = "trace_id"


def keep_latest(into: dict[int, Exemplar], position: int, exemplar: Exemplar) -> None:
    """Put `exemplar` at bucket `position` unless the one there is more recent."""
    held = into.get(position)
    if held is None or held[2] <= exemplar[2]:
        into[position] = exemplar


def merge(into: dict[int, Exemplar], other: dict[int, Exemplar]) -> None:
    """Merge the exemplars of another copy of the same series, bucket by bucket."""
    for position, exemplar in other.items():
        keep_latest(into, position, exemplar)
