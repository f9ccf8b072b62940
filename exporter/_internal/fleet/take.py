"""The push worker's take as the wire format's delta: the store's own `take` (record/store.py,
which holds the store's invariants) with nothing added but the type that travels."""

from __future__ import annotations

from ..record.store import Store
from .wire import Delta


def take(store: Store) -> Delta:
    """Everything `store` holds since the previous take, as a delta (zeros left behind)."""
    histograms, exemplars, rows = store.take()
    return Delta(histograms=dict(histograms), exemplars=exemplars, rows=rows)
