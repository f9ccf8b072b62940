"""Label guard: keeps the number of series bounded whatever label values callers pass.

Tenant values come from request headers, i.e. from outside: they are kept raw, hashed or
allow-listed, and each (model, route) holds at most `max_tenants` of them; the rest fold into
`__other__`. Every label is sanitised (type, length) instead of raising. Folds are counted per
(model, route) so the dashboards can show them. Not thread-safe: the recorder's lock covers it.
"""

from __future__ import annotations

import hashlib

from . import names
from .config import LabelConfig


class LabelGuard:
    def __init__(self, config: LabelConfig):
        self.config = config
        self._allow = frozenset(config.tenant_allowlist)
        self._tenants: dict[tuple[str, str], set[str]] = {}
        self._hashed: dict[str, str] = {}
        #: Values already found clean (a set lookup instead of the checks, every call).
        self._clean: set[str] = set()
        #: (model, route) -> number of tenant values folded into __other__.
        self.folds: dict[tuple[str, str], int] = {}
        #: Label values that had to be replaced or truncated.
        self.bad_labels = 0

    def clean(self, value: object) -> str:
        """A label value that is safe to expose: a non-empty, bounded string."""
        if value.__class__ is str and value in self._clean:
            return value  # type: ignore[return-value]
        if isinstance(value, str) and 0 < len(value) <= self.config.max_label_length \
                and value.isprintable():
            if len(self._clean) < 100_000:  # bounded: past it, values are checked every time
                self._clean.add(value)
            return value
        self.bad_labels += 1
        if value is None or value == "":
            return names.UNKNOWN
        text = value if isinstance(value, str) else str(value)
        text = "".join(ch if ch.isprintable() else "_" for ch in text)
        return text[: self.config.max_label_length] or names.UNKNOWN

    def tenant(self, model: str, route: str, raw: object) -> str:
        """The tenant label value to record under (model, route), after policy and cap."""
        if raw is None or raw == "":
            return names.UNKNOWN
        value = self.clean(raw)
        policy = self.config.tenant_policy
        if policy == "hash":
            value = self._hash(value)
        elif policy == "allowlist" and value not in self._allow:
            return self._fold(model, route)
        seen = self._tenants.setdefault((model, route), set())
        if value in seen:
            return value
        if len(seen) >= self.config.max_tenants:
            return self._fold(model, route)
        seen.add(value)
        return value

    def _fold(self, model: str, route: str) -> str:
        key = (model, route)
        self.folds[key] = self.folds.get(key, 0) + 1
        return names.OTHER_TENANT

    def _hash(self, value: str) -> str:
        hashed = self._hashed.get(value)
        if hashed is None:
            digest = hashlib.sha256((self.config.hash_salt + value).encode()).hexdigest()
            hashed = "t-" + digest[:12]
            if len(self._hashed) < 100_000:  # a cache, bounded: hashing again is only slower
                self._hashed[value] = hashed
        return hashed
