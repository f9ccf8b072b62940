"""Benchmarks: `make bench` (python -m bench) writes docs/benchmarks.md.

Every figure is measured side by side in one process: A and B interleaved, each run timing
both, the ratio taken pair by pair, and the median, min and max of the runs reported
(absolute times drift on shared machines; ratios carry).
"""
