"""The benchmarks run (tiny sizes, no timing assertions), so they never rot.

In a process of their own: the SDK-overhead benchmark installs OpenTelemetry's global SDK
providers when its peer (OpenLLMetry, the bench extra) is installed, and a global provider can
never be unset, so in this process it would leak into every later test."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_benchmarks_run_quick():
    run = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", "-"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "| figure |" in out and "bytes per series" in out and "scrape" in out
    assert "| `exporter.instrument()` | +" in out and "stream with usage, cold" in out
    assert "--quick: every case ran" in out  # bench.call_instructions' cases, natively


def test_cause_cost_at_a_tiny_size():
    """bench.cause_cost end to end at ~2,000 head series with second-long windows: the
    decision ran against a real Prometheus and read the served series (no timing asserted)."""
    import math

    from bench.cause_cost import Plan, fit, measure
    from exporter._internal.evidence.signals import SIGNALS
    from exporter._internal.diagnose.run import LOGGED
    from tests.support.prometheus import require_prometheus

    require_prometheus()
    [row] = measure([2_000], Plan(interval=1, window=4, offset=8, evaluations=2, models=1,
                                  routes=2))
    assert 1_000 <= row.head_series <= 4_000, row
    # + the histogram-mode check and the baseline's choice (a steady load: the first candidate)
    assert row.queries == 2 * (len(SIGNALS) + len(LOGGED)) + 4
    assert 0 < row.series_read < row.head_series and row.samples_read > row.series_read
    assert row.rows_returned > 0
    assert len(row.wall) == 2 and all(0 < w < 60 for w in row.wall)
    assert all(math.isfinite(x) and x >= 0 for x in (row.engine, *row.cpu)) and row.engine > 0
    assert len(row.floor) == 2 and all(math.isfinite(x) and x >= 0 for x in row.floor)
    assert fit([1, 2, 3], [3, 5, 7]) == (1.0, 2.0)


def test_the_days_score_counts_right_wrong_and_calm_findings():
    """bench.diagnose_day's scoring (the day itself is tests/test_incident_day.py's): a cause
    on its live incident's target is right, off target or in the calm wrong, `unknown` is no
    named cause, and the report gives precision and recall from the counts."""
    from bench.diagnose_day import Score, report

    s = Score()
    on = {"model": "llama-3-8b", "route": "chat", "cause": "noisy_neighbour", "tenants": []}
    off = {**on, "model": "gpt-4.1"}
    s.finding(on, ["noisy_neighbour"], 100)
    s.finding(off, ["noisy_neighbour"], 101)
    s.finding({**on, "cause": "unknown"}, ["noisy_neighbour"], 102)
    s.finding(on, [], "calm")
    assert (s.right["noisy_neighbour"], s.named["noisy_neighbour"]) == (1, 3)
    assert [where for where, _ in s.wrong] == [101, "calm"]
    s.found["noisy_neighbour"], s.units["noisy_neighbour"] = 2, 3
    text = "\n".join(report({"diagnose": s}, 1))
    assert "| diagnose | `noisy_neighbour` | 33.3 % (1 of 3) | 66.7 % (2 of 3) |" in text
