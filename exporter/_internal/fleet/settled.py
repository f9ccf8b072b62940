"""Which batches of each worker the aggregator has settled: applied, or never to apply.

The aggregator keeps one `Applied` per worker (aggregator.py, bounded by `max_workers`) and
saves them in its snapshot (`applied_map` reads them back).
"""

from __future__ import annotations

from typing import Any


class Applied:
    """The seqs of one worker settled so far: all up to `floor`, and those in `above`.

    A first attempt of seq n settles everything below n (`settle_below`); a resend (`retry`)
    only itself, so a set remains for resends placed out of order. A worker that gave up a batch
    leaves a gap for good, so `above` is bounded: past MAX_ABOVE seqs the floor moves up to the
    oldest of them.
    """

    __slots__ = ("floor", "above")
    MAX_ABOVE = 256

    def __init__(self, floor: int = 0, above: set[int] | None = None):
        self.floor = floor
        self.above = above or set()

    def __contains__(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above

    def settle_below(self, seq: int) -> None:
        """Every seq below `seq` was acknowledged or given up by its worker: none is new."""
        if seq - 1 > self.floor:
            self.floor = seq - 1
            self.above = {s for s in self.above if s > self.floor}

    def add(self, seq: int) -> None:
        self.above.add(seq)
        if len(self.above) > self.MAX_ABOVE:  # a gap that will never fill: step over it
            self.floor = min(self.above) - 1
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)


def applied_map(value: Any) -> dict[str, Applied]:
    """The snapshot's [worker, floor, [seqs above]] entries ([worker, seq] in older ones)."""
    if not isinstance(value, list):
        raise ValueError("applied map missing")
    out: dict[str, Applied] = {}
    for item in value:
        if not (isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], str)
                and type(item[1]) is int):
            raise ValueError("applied map entry is not [worker, floor, [seqs]]")
        above = item[2] if len(item) == 3 else []
        if not (isinstance(above, list) and all(type(seq) is int for seq in above)):
            raise ValueError("applied map entry has bad seqs")
        out[item[0]] = Applied(item[1], set(above))
    return out
