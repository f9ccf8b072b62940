"""The noise gate: did a mean move by more than a window's own noise? Read on log values.

TTFT is heavy-tailed (near lognormal) and often a mix of cached and uncached calls, over few
calls per window. A gate that reads a window's spread as (p90 - p10) / 2.563 assumes a normal
distribution: it passed 1.6 % of pairs of identical 30-call lognormal (sigma 1) windows at 3.5
standard errors, 8 % at sigma 1.5 (bench/diagnose_eval.py measures it). On the logarithm of
each call's value the same distributions are near normal, and a mix of two modes has a finite,
well-estimated variance: the gate compares the two windows' mean log values by Welch's
standard error, each window's mean and variance read from its histogram buckets (both
histogram modes serve them; a bucket's calls sit at its geometric middle, and its width adds
Sheppard's correction, so coarse buckets make the gate stricter, never looser).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LogMoments:
    """Calls, mean and variance of the natural log of each call's value over one window."""

    calls: float
    mean: float
    variance: float


def log_moments(buckets: Iterable[tuple[float, float, float]]) -> LogMoments | None:
    """The moments of log values from (lower bound, upper bound, calls) buckets, bounds in the
    family's unit; None without calls. A bucket from 0 counts its calls at half its upper bound
    (a 0 value has no logarithm), the open top bucket at twice its lower bound."""
    total = first = second = 0.0
    for low, high, calls in buckets:
        if calls <= 0:
            continue
        if math.isinf(high):
            middle, width = math.log(2 * low) if low > 0 else 0.0, math.log(2.0)
        elif low <= 0:
            middle, width = math.log(high / 2) if high > 0 else 0.0, math.log(2.0)
        else:
            middle, width = (math.log(low) + math.log(high)) / 2, math.log(high / low)
        total += calls
        first += calls * middle
        second += calls * (middle * middle + width * width / 12)
    if total <= 0:
        return None
    mean = first / total
    return LogMoments(total, mean, max(second / total - mean * mean, 0.0))


def opened(buckets: Iterable[tuple[float, float, float]], floor: float = 0.005
           ) -> list[tuple[float, float, float]]:
    """The buckets of calls that opened a connection: above `floor` seconds (a pooled
    connection's connect phase is a few microseconds, the first classic bucket's)."""
    return [(low, high, calls) for low, high, calls in buckets if low >= floor]


def from_cumulative(bounds_and_counts: Iterable[tuple[float, float]]) -> list[
        tuple[float, float, float]]:
    """Classic `le` buckets (upper bound, cumulative calls) as (lower, upper, calls)."""
    out, low, below = [], 0.0, 0.0
    for le, cumulative in sorted(bounds_and_counts):
        out.append((low, le, max(cumulative - below, 0.0)))
        low, below = le, max(cumulative, below)
    return out


def rise_in_standard_errors(now: LogMoments | None, base: LogMoments | None) -> float | None:
    """How many standard errors the mean log value rose from `base` to `now` (Welch); None
    where a window has fewer than two calls (no variance to read)."""
    if now is None or base is None or now.calls < 2 or base.calls < 2:
        return None
    error = math.sqrt(now.variance / now.calls + base.variance / base.calls)
    difference = now.mean - base.mean
    if error == 0:
        return math.inf if difference > 0 else 0.0
    return difference / error


def rise_over_one_call(now: LogMoments | None, base: LogMoments | None) -> float | None:
    """`rise_in_standard_errors` where the baseline holds one call (between one and two, as
    a rate over a window reads it): its variance is read as `now`'s, the one window that has
    one. None where `now` has fewer than two calls or the baseline under one."""
    if now is None or base is None or now.calls < 2 or base.calls < 1:
        return None
    if base.calls >= 2:
        return rise_in_standard_errors(now, base)
    error = math.sqrt(now.variance / now.calls + now.variance / base.calls)
    difference = now.mean - base.mean
    if error == 0:
        return math.inf if difference > 0 else 0.0
    return difference / error
