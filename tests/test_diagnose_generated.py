"""The generator's scenarios end to end (bench/diagnose_prometheus.py): the first held-out seeds'
calls recorded into the exporter, scraped by a real Prometheus every second (classic
histograms), named by the real `ttft-exporter diagnose --json`, and set beside
`causes.classify` on the generator's direct signals of the same calls.

Where the signals can differ, and why (each computed per scenario in `Case`):
- The exporter's prefill phase runs from the response headers to the first token, so it holds
  the first decode step, which `scenarios.calls` keeps apart from the prefill: `prefill_read`
  is the direct decision with the prefill read the exporter's way.
- Past `labels.max_tenants` (100) tenants on a (model, route) the exporter folds the rest into
  `__other__`: `recorded` is the direct decision with both.
A scenario whose direct decision neither changes (`direct == prefill_read`, no tenant folded)
has its signals survive the exporter unchanged: diagnose must name its direct cause. Every
scenario must get the cause of the signals as the exporter records them (`recorded`): the
windows end on scrape timestamps, so `rate()` × window is each counter's exact increase, and
means and the classic buckets' log values are the direct ones.
"""

from __future__ import annotations

import pytest

from bench.diagnose_prometheus import Case, Evaluation, evaluate, prepare
from tests.support.prometheus import require_prometheus

#: The first held-out seeds of bench/diagnose_eval.py, as many as run in under a minute.
SEEDS = range(100_000, 100_006)


@pytest.fixture(scope="module")
def run() -> tuple[list[Case], Evaluation]:
    require_prometheus()
    cases = [prepare(seed) for seed in SEEDS]
    return cases, evaluate(cases, ("classic",))


def test_the_subset_is_no_vacuous_check(run: tuple[list[Case], Evaluation]) -> None:
    cases, result = run
    assert not result.failed["classic"], "scrapes failed in every try: no exact reading"
    assert any(c.direct is not None for c in cases)
    assert any(c.tenants > len(c.kept) for c in cases)  # the fold's path is taken


def test_diagnose_through_prometheus_names_the_direct_cause(
        run: tuple[list[Case], Evaluation]) -> None:
    cases, result = run
    named = result.named["classic"]
    unchanged = {c.seed: c.direct for c in cases
                 if c.prefill_read == c.direct and c.tenants == len(c.kept)}
    assert {seed: named[seed] for seed in unchanged} == unchanged
    assert {c.seed: named[c.seed] for c in cases} == {c.seed: c.recorded for c in cases}


def test_the_named_cause_is_allowed_where_the_direct_one_is(
        run: tuple[list[Case], Evaluation]) -> None:
    cases, result = run
    named = result.named["classic"]
    wrong = {c.seed: (c.kind, named[c.seed]) for c in cases
             if c.direct in c.allowed and named[c.seed] not in c.allowed}
    assert not wrong
