"""The benchmarks run (tiny sizes, no timing assertions), so they never rot."""

from bench.__main__ import main


def test_benchmarks_run_quick(capsys):
    assert main(["--quick", "--out", "-"]) == 0
    out = capsys.readouterr().out
    assert "| figure |" in out and "bytes per series" in out and "scrape" in out
