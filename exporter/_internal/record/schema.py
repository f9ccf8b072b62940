"""What a config records: each histogram family's label names and HDR bucket layout.

The recorder keys its series by it, the renderer labels and buckets them by it, and the push
wire format validates a worker's payload against it (a worker and its aggregator must agree on
the layout, which the payload states), so it lives below all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import names
from ..config.settings import COUNT_BUCKETS, Config
from .histogram import Layout


@dataclass(frozen=True)
class FamilySchema:
    family: names.Family
    layout: Layout
    #: Label names of the series key, sorted (the order Prometheus text uses).
    label_names: tuple[str, ...]
    has_tenant: bool

    @property
    def windowed(self) -> bool:
        return self.family.windowed


class Schema:
    """Every histogram family of one config, by name, in exposition order."""

    def __init__(self, config: Config):
        hist = config.histograms
        seconds = Layout(int(hist.max_seconds * names.US_PER_SECOND), hist.significant_digits,
                         [round(b * names.US_PER_SECOND) for b in config.seconds_buckets()])
        tokens = Layout(hist.max_tokens, hist.significant_digits,
                        [int(b) for b in hist.token_buckets])
        layouts = {"seconds": seconds, "tokens": tokens,
                   "count": Layout(hist.max_tokens, hist.significant_digits, COUNT_BUCKETS)}
        self.max_label_length = config.labels.max_label_length
        #: Series and rows one push may carry at most (each family's ceiling).
        self.max_series = config.labels.max_series
        self.families: dict[str, FamilySchema] = {}
        for fam in names.HISTOGRAMS:
            has_tenant = config.family_has_tenant(fam)
            label_names = list(fam.base)
            if has_tenant:
                label_names.append(names.TENANT)
            if fam.extra_label:
                label_names.append(fam.extra_label)
            self.families[fam.name] = FamilySchema(
                fam, layouts[fam.unit], tuple(sorted(label_names)), has_tenant)

    def layouts(self) -> dict[str, list[Any]]:
        """Per unit, [highest trackable value, significant digits, `le` boundaries]: the HDR
        layout as a push payload states it."""
        out: dict[str, list[Any]] = {}
        for spec in self.families.values():
            layout = spec.layout
            out.setdefault(spec.family.unit, [layout.highest, layout.digits,
                                              list(layout.boundaries)])
        return out
