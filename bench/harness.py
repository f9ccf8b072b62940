"""Interleaved A/B timing: the only way this project quotes a speed."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        return cls(statistics.median(values), min(values), max(values))

    def fmt(self, unit: str = "ns", digits: int = 0) -> str:
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.median)} {unit} (min {f.format(self.low)}, max " \
               f"{f.format(self.high)})"


def per_op_ns(fn: Callable[[int], None], ops: int) -> float:
    """Run fn(ops) once and return ns per op."""
    start = time.perf_counter_ns()
    fn(ops)
    return (time.perf_counter_ns() - start) / ops


def interleaved(contenders: dict[str, Callable[[int], None]], ops: int, runs: int
                ) -> dict[str, list[float]]:
    """ns/op for each contender, `runs` rounds, each round running every contender once."""
    for fn in contenders.values():  # warm-up
        fn(max(ops // 10, 1))
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            out[name].append(per_op_ns(fn, ops))
    return out


def ratios(a: list[float], b: list[float]) -> Stat:
    """Pairwise a/b over the runs."""
    return Stat.of([x / y for x, y in zip(a, b)])
