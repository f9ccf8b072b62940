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
