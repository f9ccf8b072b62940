"""docs/metrics.md and exporter/_internal/names.py name the same metrics."""

import re
from pathlib import Path

from exporter._internal import names

DOC = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text()


def defined_names() -> set[str]:
    out = {f.name for f in names.HISTOGRAMS}
    out |= {f.window_name for f in names.HISTOGRAMS if f.name in {
        names.TTFT.name, names.FIRST_ANSWER.name, names.STALL.name, names.DURATION.name}}
    out |= {names.REQUESTS_TOTAL, names.REQUESTS_IN_FLIGHT, names.SELF_SERIES,
            names.SELF_TENANT_FOLDS, names.SELF_LABEL_FOLDS, names.SELF_DROPS,
            names.SELF_SCRAPE_DURATION, names.SELF_HTTP_CLOSED}
    out |= {names.USAGE_INPUT_TOKENS, names.USAGE_CACHED_INPUT_TOKENS, names.UPSTREAM_REQUESTS}
    out |= set(names.AGGREGATOR_SELF_METRICS)
    out |= {counter.name for counter in names.COUNTERS}
    out |= {names.slo_calls_name(f) for f in names.SLO_FAMILIES.values()}
    return out


def test_every_metric_is_documented_and_every_documented_metric_exists():
    documented = set(re.findall(r"`((?:llm_client|ttft_exporter)_[a-z_]+)`", DOC))
    assert documented == defined_names()


def test_phases_outcomes_and_drop_reasons_are_documented():
    for word in (*names.PHASES, *names.OUTCOMES, *names.DROP_REASONS, *names.LABEL_FOLDS,
                 *names.TASK_KINDS, *names.DEADLINE_OUTCOMES, *names.FINISH_REASONS):
        assert f"`{word}`" in DOC or f" {word}" in DOC, word


def test_windowed_families_match_the_recorder():

    documented = set(re.findall(r"`(llm_client_[a-z_]+)_window_seconds`", DOC))
    assert {n.removesuffix("_seconds") for n in (f.name for f in names.WINDOWED)} == documented
