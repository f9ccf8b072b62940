"""Label guard: keeps the number of series bounded whatever label values callers pass.

Every label value is sanitised (type, length, printable) instead of raising; a value whose
`str()` fails becomes `invalid`, and the call is still counted. Model, route, provider and agent
task values are capped (`labels.max_models`, `max_routes`, `max_providers`, `max_tasks` distinct
values; a provider controls `model` through its response, a service's routes and tasks are its
own), the rest fold into `__other__`. Tenant values come from request headers, i.e. from
outside: they are kept raw, hashed or allow-listed, each (model, route) holds at most
`max_tenants` of them and all tenant sets together at most `max_series` values; the rest fold
into `__other__`. Each model keeps at most `max_upstreams` upstream identities (address, region,
fingerprint; the rest fold into `__other__`), so a provider rotating addresses or fingerprints
cannot grow the exporter either. Every fold is counted, in the store's counter rows
(`ttft_exporter_tenant_folds_total` per (model, route) for tenants,
`ttft_exporter_label_folds_total` per label otherwise; a replaced value in
`ttft_exporter_dropped_total{reason="bad_label"}`), so dashboards and alerts can show how much
traffic lost a label. Not thread-safe: the store's lock covers it.

Caps do not fill for good (a client that controls a tenant header could otherwise push every
later tenant into `__other__`): each kept value remembers the epoch it was last seen in, and a
value unseen for `labels.expire_seconds` frees its slot (`expire`, at the store's epoch ticks,
EPOCHS per `expire_seconds`); the store then drops its series and rows. A value in use is never
evicted to make room: an attacker can take only free slots, and holds them only while it keeps
sending.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .. import names
from ..config.settings import LabelConfig

#: What a label value becomes when its `str()` raises.
INVALID = "invalid"
#: Labels whose distinct values are capped globally (tenants are capped per (model, route)).
CAPPED = (names.MODEL, names.ROUTE, names.PROVIDER, names.TASK)
#: Epochs per `labels.expire_seconds`: a value is freed once unseen for that many epochs, i.e.
#: between 1 and 1 + 1/EPOCHS times `expire_seconds` after it was last seen (ticks on time).
EPOCHS = 4

#: An upstream identity of a model: (model, address, region, fingerprint).
Upstream = tuple[str, str, str, str]


@dataclass
class Expired:
    """The values an epoch tick freed: their series and rows go too."""

    values: dict[str, set[str]] = field(default_factory=lambda: {label: set()
                                                                  for label in CAPPED})
    tenants: set[tuple[str, str, str]] = field(default_factory=set)  # (model, route, tenant)
    upstreams: set[Upstream] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.tenants or self.upstreams or any(self.values.values()))

    def covers(self, labels: Sequence[str], values: Sequence[str]) -> bool:
        """True when a series or row with these label values carries a freed value."""
        return self.matcher(labels)(values)

    def matcher(self, labels: Sequence[str]) -> Callable[[Sequence[str]], bool]:
        """`covers` for many series or rows of one label layout: the positions found once."""
        at = {label: i for i, label in enumerate(labels)}
        capped = [(at[label], self.values[label]) for label in CAPPED
                  if label in at and self.values[label]]
        tenant = (at[names.MODEL], at[names.ROUTE], at[names.TENANT]) if self.tenants and \
            {names.MODEL, names.ROUTE, names.TENANT} <= at.keys() else None
        upstream = (at[names.MODEL], at[names.ADDRESS], at[names.REGION],
                    at[names.FINGERPRINT]) if self.upstreams and names.ADDRESS in at else None
        tenants, upstreams = self.tenants, self.upstreams

        def covered(values: Sequence[str]) -> bool:
            for i, freed in capped:
                if values[i] in freed:
                    return True
            if tenant is not None and tuple(values[i] for i in tenant) in tenants:
                return True
            return upstream is not None and tuple(values[i] for i in upstream) in upstreams
        return covered


class LabelGuard:
    def __init__(self, config: LabelConfig, rows: dict[str, dict[tuple[str, ...], int]]):
        """`rows`: the store's counter rows by counter name, where the folds are counted."""
        self.config = config
        self.rows = rows
        self._allow = frozenset(config.tenant_allowlist)
        self._caps = {names.MODEL: config.max_models, names.ROUTE: config.max_routes,
                      names.PROVIDER: config.max_providers, names.TASK: config.max_tasks}
        #: Each kept value with the epoch it was last seen in (`expire` frees the stale ones).
        self.epoch = 0
        self._seen: dict[str, dict[str, int]] = {label: {} for label in CAPPED}
        self._tenants: dict[tuple[str, str], dict[str, int]] = {}
        self._upstreams: dict[str, dict[tuple[str, str, str], int]] = {}
        self._tenant_values = 0  # in all of _tenants' sets
        self._hashed: dict[str, str] = {}
        #: Values already found clean (a set lookup instead of the checks, every call).
        self._clean: set[str] = set()
        #: Both caches hold at most as many values as the guard can ever keep (past it a value
        #: is checked or hashed again: slower, never more memory).
        self._cache_max = (config.max_series + config.max_models + config.max_routes
                           + config.max_providers + config.max_tasks)

    def clean(self, value: object, count: bool = True) -> str:
        """A label value that is safe to expose: a non-empty, bounded, printable string (a
        replaced value is counted as a `bad_label` drop unless `count` is false)."""
        if value.__class__ is str and value in self._clean:
            return value  # type: ignore[return-value]
        if isinstance(value, str) and 0 < len(value) <= self.config.max_label_length \
                and value.isprintable():
            if len(self._clean) < self._cache_max:
                self._clean.add(value)
            return value
        if count:
            self._count(names.SELF_DROPS, (names.DROP_BAD_LABEL,), 1)
        if value is None or value == "":
            return names.UNKNOWN
        try:
            text = value if isinstance(value, str) else str(value)
            text = "".join(ch if ch.isprintable() else "_" for ch in text)
        except Exception:  # a value whose str() raises: the call is still counted
            return INVALID
        return text[: self.config.max_label_length] or names.UNKNOWN

    def value(self, label: str, raw: object, count: int = 1) -> str:
        """The clean value of a capped label (model, route, provider, task), `__other__` past its
        cap; a fold adds `count` calls to the label's folds (and a replaced value is counted once
        when `count` is not 0)."""
        value = self.clean(raw, count > 0)
        seen = self._seen[label]
        if value in seen:
            seen[value] = self.epoch
            return value
        if value == names.OTHER_TENANT:
            return value
        if len(seen) < self._caps[label]:
            seen[value] = self.epoch
            return value
        self.fold(label, count)
        return names.OTHER_TENANT

    def known(self, label: str, raw: object) -> str:
        """`value()` without counting a fold (a second look at the same call's label)."""
        return self.value(label, raw, count=0)

    def tenant(self, model: str, route: str, raw: object, policy: bool = True,
               count: int = 1) -> str:
        """The tenant label value to record under (model, route), after policy and caps.

        `policy=False` for values a worker's guard already made (the aggregator): they are not
        hashed or allow-listed again, only capped over the union of the workers.
        """
        if raw is None or raw == "":
            return names.UNKNOWN
        value = self.clean(raw)
        if value == names.OTHER_TENANT:
            return value
        if policy:
            mode = self.config.tenant_policy
            if mode == "hash":
                value = self._hash(value)
            elif mode == "allowlist" and value not in self._allow:
                return self._fold(model, route, count)
        seen = self._tenants.get((model, route))
        if seen is None:
            seen = self._tenants[(model, route)] = {}
        if value in seen:
            seen[value] = self.epoch
            return value
        if len(seen) >= self.config.max_tenants or \
                self._tenant_values >= self.config.max_series:
            return self._fold(model, route, count)
        seen[value] = self.epoch
        self._tenant_values += 1
        return value

    def upstream(self, model: str, address: object, region: object, fingerprint: object,
                 count: int = 1) -> tuple[str, str, str]:
        """The clean (address, region, fingerprint) of an upstream `model` reached, or all three
        `__other__` past `max_upstreams` identities of that model (a fold adds `count` calls to
        the folds of label `upstream`)."""
        identity = (self.clean(address, count > 0), self.clean(region, count > 0),
                    self.clean(fingerprint, count > 0))
        if identity == (names.OTHER_TENANT,) * 3:  # folded already (by a worker's guard)
            return identity
        seen = self._upstreams.get(model)
        if seen is None:
            seen = self._upstreams[model] = {}
        if identity in seen:
            seen[identity] = self.epoch
            return identity
        if len(seen) < self.config.max_upstreams:
            seen[identity] = self.epoch
            return identity
        self.fold(names.FOLD_UPSTREAM, count)
        return (names.OTHER_TENANT,) * 3  # type: ignore[return-value]

    def relabel(self, labels: Sequence[str], values: tuple[str, ...], count: int = 0,
                counted: Sequence[str] = ()) -> tuple[str, ...]:
        """A worker's label values (of a series or a counter row) through this guard: capped
        labels, tenants (no policy: the worker applied it) and upstream identities (`address`
        standing for the identity); a fold of a label in `counted` is counted `count` times."""
        out = dict(zip(labels, values))
        for label in CAPPED:
            if label in out:
                out[label] = self.value(label, out[label], count if label in counted else 0)
        if names.TENANT in out:
            out[names.TENANT] = self.tenant(
                out[names.MODEL], out[names.ROUTE], out[names.TENANT], policy=False,
                count=count if names.TENANT in counted else 0)
        if names.ADDRESS in out:
            out[names.ADDRESS], out[names.REGION], out[names.FINGERPRINT] = self.upstream(
                out[names.MODEL], out[names.ADDRESS], out[names.REGION],
                out[names.FINGERPRINT], count if names.ADDRESS in counted else 0)
        return tuple(out[label] for label in labels)

    def keeps(self, labels: Sequence[str], values: Sequence[str]) -> bool:
        """True when every capped value among these (model, route, provider, task) is kept:
        none was folded, nor freed by an expiry since."""
        return all(value in self._seen[label] for label, value in zip(labels, values)
                   if label in self._seen)

    def expire(self) -> Expired:
        """A new epoch: free every value last seen EPOCHS epochs ago or earlier (a model's or a
        route's tenants and a model's upstreams go with it) and return them."""
        self.epoch += 1
        oldest = self.epoch - EPOCHS  # seen in this epoch or later: kept
        out = Expired()
        for label, seen in self._seen.items():
            stale = [value for value, epoch in seen.items() if epoch < oldest]
            for value in stale:
                del seen[value]
            out.values[label].update(stale)
        models, routes = out.values[names.MODEL], out.values[names.ROUTE]
        for (model, route), seen in list(self._tenants.items()):
            gone = model in models or route in routes
            stale = list(seen) if gone else [t for t, epoch in seen.items() if epoch < oldest]
            for tenant in stale:
                del seen[tenant]
            self._tenant_values -= len(stale)
            if not gone:
                out.tenants.update((model, route, tenant) for tenant in stale)
            if not seen:
                del self._tenants[(model, route)]
        for model, identities in list(self._upstreams.items()):
            stale = list(identities) if model in models else [
                identity for identity, epoch in identities.items() if epoch < oldest]
            for identity in stale:
                del identities[identity]
            if model not in models:
                out.upstreams.update((model, *identity) for identity in stale)
            if not identities:
                del self._upstreams[model]
        if out:  # the caches may be full of freed values: let the new ones in
            if len(self._clean) >= self._cache_max:
                self._clean.clear()
            if len(self._hashed) >= self._cache_max:
                self._hashed.clear()
        return out

    def fold(self, label: str, count: int) -> None:
        """Count `count` calls (or tasks) whose `label` folded (the whole label set: "series")."""
        if count:
            self._count(names.SELF_LABEL_FOLDS, (label,), count)

    def _fold(self, model: str, route: str, count: int) -> str:
        if count:
            self._count(names.SELF_TENANT_FOLDS, (model, route), count)
        return names.OTHER_TENANT

    def _count(self, counter: str, row: tuple[str, ...], n: int) -> None:
        rows = self.rows[counter]
        rows[row] = rows.get(row, 0) + n

    def _hash(self, value: str) -> str:
        hashed = self._hashed.get(value)
        if hashed is None:
            digest = hashlib.sha256((self.config.hash_salt + value).encode()).hexdigest()
            hashed = "t-" + digest[:12]
            if len(self._hashed) < self._cache_max:
                self._hashed[value] = hashed
        return hashed
