"""Which earlier window a (model, route) is compared with: one an ongoing incident does not
cover, chosen the same way by `diagnose` and `watch`, without state.

A fixed baseline (the same window an hour earlier) is compared with itself once an incident
lasts longer than the offset: the watch's finding resolves while the incident goes on, and a
post-mortem over a long incident sees nothing. So each run looks at several candidate windows
of the baseline's length, each `step` further back (the offset, 2× the offset, ...), and per
(model, route) takes the most recent one whose TTFT mean is not degraded against the lowest
of them (past the decision's `degraded_factor` and `degraded_min_seconds`), among those with
`min_calls` calls. Where none is covered by an incident that is the first, as before; an
incident that covers the first makes it degraded against an older calm one, which is taken
instead. Taking the lowest mean outright would bias every calm comparison low (the least of
three noisy means): the most recent undegraded one does not. One instant query reads every
candidate's mean, each labelled by its index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import names
from ..promql import MODEL_ROUTE, HistogramMode, duration
from ..evidence.signals import SIGNALS_BY_KEY
from ..evidence.thresholds import Thresholds

#: The label each candidate's row carries in the choosing query.
CANDIDATE = "baseline_candidate"


@dataclass(frozen=True)
class Candidates:
    """`count` windows of `length` seconds, the first ending at `first_end`, each next one
    `step` seconds before the last."""

    first_end: float
    length: float
    step: float
    count: int

    def end(self, index: int) -> float:
        return self.first_end - index * self.step


def query(c: Candidates, matchers: Sequence[str], mode: HistogramMode, min_calls: int) -> str:
    """The TTFT mean of every candidate with `min_calls` calls, per (model, route), labelled
    with its index, as one PromQL expression evaluated at `c.first_end`."""
    window = duration(c.length)
    parts = []
    for i in range(c.count):
        offset = duration(i * c.step) if i else ""
        mean = SIGNALS_BY_KEY["ttft"].expr(window, matchers, MODEL_ROUTE, offset, mode=mode)
        calls = SIGNALS_BY_KEY["calls"].expr(window, matchers, MODEL_ROUTE, offset, mode=mode)
        parts.append(f'label_replace(({mean}) and ({calls} >= {min_calls}), "{CANDIDATE}", '
                     f'"{i}", "", "")')
    return "\nor ".join(parts)


def choose(run: Callable[[str, float], list[dict[str, Any]]], c: Candidates,
           matchers: Sequence[str], mode: HistogramMode, t: Thresholds
           ) -> dict[tuple[str, str], int]:
    """The candidate index per (model, route) that has one with calls enough (absent: the
    first); `run(expr, at)` is an instant query."""
    if c.count <= 1:
        return {}
    means: dict[tuple[str, str], dict[int, float]] = {}
    for row in run(query(c, matchers, mode, t.min_calls), c.first_end):
        labels = row["metric"]
        key = (labels.get(names.MODEL, ""), labels.get(names.ROUTE, ""))
        means.setdefault(key, {})[int(labels[CANDIDATE])] = float(row["value"][1])
    return {key: pick(found, t) for key, found in means.items()}


def pick(means: dict[int, float], t: Thresholds) -> int:
    """The most recent candidate (lowest index) whose mean is not degraded against the lowest
    mean among them."""
    low = min(means.values())
    return min(i for i, mean in means.items()
               if not (mean >= t.degraded_factor * low and mean - low >= t.degraded_min_seconds))
