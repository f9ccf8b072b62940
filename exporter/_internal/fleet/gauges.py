"""The workers' gauges at the aggregator: the calls in flight, which are not added like counters.

Each live worker's latest in-flight values are kept, and their sum is what the store serves. A
worker's values go when it stops pushing (their expiry, `aggregator.gauge_ttl_seconds`) or at
once when its last push says `final`. Their label values pass the aggregator's guard, and the
distinct keys over all workers are capped at `labels.max_series` (the rest fold into one
overflow row); a key no live worker has frees its slot once one of its labels expired, so the
keys follow the label expiry instead of filling the cap for good.
"""

from __future__ import annotations

from .. import names
from ..record.store import Row, Store


class WorkerGauges:
    """The in-flight values of the live workers, and their sum in `store`."""

    def __init__(self, store: Store):
        self.store = store
        #: worker id -> (expiry on the aggregator's clock, its latest in-flight values)
        self.by_worker: dict[str, tuple[float, dict[Row, int]]] = {}
        self.totals: dict[Row, int] = {}
        #: The in-flight keys of all workers (bounded: labels.max_series), and the guard's
        #: epoch when they were last pruned.
        self.keys: set[Row] = set()
        self._keys_epoch = 0

    def __len__(self) -> int:
        return len(self.by_worker)

    def __contains__(self, worker: object) -> bool:
        return worker in self.by_worker

    def set(self, worker: str, rows: dict[Row, int] | None, expires: float = 0.0) -> None:
        """A worker's latest in-flight rows as it pushed them (None: it is gone); the served
        totals follow incrementally."""
        values = self._relabelled(rows) if rows is not None else None
        old = self.by_worker.pop(worker, None)
        if values is not None:
            self.by_worker[worker] = (expires, values)
        old_values = old[1] if old is not None else {}
        if old_values == (values or {}):
            return
        totals = self.totals
        for key, n in old_values.items():
            left = totals.get(key, 0) - n
            if left:
                totals[key] = left
            else:
                totals.pop(key, None)
        for key, n in (values or {}).items():
            totals[key] = totals.get(key, 0) + n
        self.store.set_gauge_rows(names.IN_FLIGHT, totals)

    def expire(self, now: float) -> None:
        """Drop the values of workers that stopped pushing, then free the keys that went."""
        for worker in [w for w, (expires, _) in self.by_worker.items() if expires < now]:
            self.set(worker, None)
        self.free_keys()

    def free_keys(self) -> None:
        """Once per epoch of the label guard: a key no live worker has and one of whose labels
        expired (or folded) frees its slot."""
        store = self.store
        with store.held:  # (starts an epoch when one is due)
            guard = store.guard
            if guard.epoch == self._keys_epoch:
                return
            self._keys_epoch = guard.epoch
            labels, live = names.IN_FLIGHT.labels, self.totals
            self.keys = {key for key in self.keys if key in live or guard.keeps(labels, key)}

    def _relabelled(self, rows: dict[Row, int]) -> dict[Row, int]:
        """A worker's in-flight rows through the store's guard, past `labels.max_series` keys
        over all workers into one overflow row."""
        store, keys, out = self.store, self.keys, {}
        with store.held:
            guard = store.guard
            for values, n in rows.items():
                key = guard.relabel(names.IN_FLIGHT.labels, values)
                if key not in keys:
                    if len(keys) < store.config.labels.max_series:
                        keys.add(key)
                    else:
                        key = names.IN_FLIGHT.overflow(key)
                out[key] = out.get(key, 0) + n
        return out
