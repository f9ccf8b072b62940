"""The incident day: the four failure modes of README.md ("Why"), played on a schedule.

Each incident turns knobs (`Knobs`) that the demo provider and the load generator read on every
call, so an incident starts and ends at once, and each one moves its own signals only:

* `prefill_surge`: prompts on one route grow several times (input tokens and the prefill phase
  of that route; prefill per 1k uncached tokens stays flat);
* `cold_cache`: one busy tenant idles, then returns (busier, catching up) while the provider
  keeps evicting its cached prefix (that tenant's cached share and prefill; its TTFT only);
* `noisy_neighbour`: another customer's huge prompts freeze every stream of one model for
  seconds at a time (stalls, inter-token gaps and TTFT of every tenant of that model);
* `route_change`: one model's calls silently go to a farther region behind TLS that closes its
  connections (the connect and server phases of that model; no model time changes).

`IncidentDay` plays them in that order between calm phases and prints each change;
`playing(knobs, name)` plays one named incident for as long as a `with` block lasts (tests and
the `diagnose` work reuse it with compressed timings).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Knobs:
    """What the incidents change, read by the provider (latency.py) and the load (loadgen.py).

    Plain attributes, each replaced at once: the provider's thread and the load's loop read
    them without a lock (an incident starting one call late does not matter).
    """

    #: prefill_surge: prompts of this route are `surge_factor` times longer.
    surge_route: str | None = None
    surge_factor: float = 4.0
    #: cold_cache: the provider keeps no cached prefix for these tenants...
    cold_tenants: frozenset[str] = frozenset()
    #: ...and the load sends nothing for these (the tenant is idle).
    idle_tenants: frozenset[str] = frozenset()
    #: noisy_neighbour: every stream of this model freezes `freeze_seconds` every
    #: `freeze_every_seconds` (a neighbour's huge prefill holds the batch).
    freeze_model: str | None = None
    freeze_seconds: float = 5.5
    freeze_every_seconds: float = 7.0
    #: route_change: calls of these models go to the far region.
    far_models: frozenset[str] = frozenset()

    def frozen_until(self, model: str, now: float) -> float:
        """End of the freeze `model` is in at clock time `now`, or 0.0 when not frozen."""
        if model != self.freeze_model:
            return 0.0
        start = now - now % self.freeze_every_seconds
        end = start + self.freeze_seconds
        return end if now < end else 0.0


@dataclass(frozen=True)
class Incident:
    """One failure mode on one target, and the panels it moves (docs/runbooks.md)."""

    name: str
    title: str
    target: str
    apply: Callable[[Knobs], None] = field(repr=False)
    moves: tuple[str, ...] = ()


def _surge(knobs: Knobs) -> None:
    knobs.surge_route = "search"


def _cold(knobs: Knobs) -> None:
    knobs.cold_tenants = frozenset({"tenant-01"})


def _noisy(knobs: Knobs) -> None:
    knobs.freeze_model = "llama-3-8b"


def _route(knobs: Knobs) -> None:
    knobs.far_models = frozenset({"deepseek-r1"})


#: The four incidents, in the order the incident day plays them.
INCIDENTS: dict[str, Incident] = {i.name: i for i in (
    Incident("prefill_surge", "long-prompt prefill surge", "route search", _surge,
             ("input tokens p99", "prefill p99", "TTFT")),
    Incident("cold_cache", "prompt cache gone cold after idling", "tenant tenant-01", _cold,
             ("cached share", "prefill", "TTFT p99 of the tenant")),
    Incident("noisy_neighbour", "noisy neighbour freezing every stream",
             "model llama-3-8b", _noisy,
             ("stall p99", "inter-token latency p99", "TTFT of every tenant")),
    Incident("route_change", "silent route change to a farther region", "model deepseek-r1",
             _route, ("connect p99", "server p99", "TTFT")),
)}


def clear(knobs: Knobs) -> None:
    """Back to calm: every knob at its default (the timings of the freeze and surge stay)."""
    knobs.surge_route = knobs.freeze_model = None
    knobs.cold_tenants = knobs.idle_tenants = knobs.far_models = frozenset()


@contextlib.contextmanager
def playing(knobs: Knobs, name: str, out: Callable[[str], None] | None = None
            ) -> Iterator[Incident]:
    """Play the named incident while the block runs; back to calm after it."""
    incident = INCIDENTS[name]
    incident.apply(knobs)
    if out is not None:
        out(f"incident: {incident.title} on {incident.target} "
            f"(moves: {', '.join(incident.moves)})")
    try:
        yield incident
    finally:
        clear(knobs)
        if out is not None:
            out(f"recovered: {incident.title} on {incident.target}")


@dataclass(frozen=True)
class Phase:
    """One step of the day: `incident` None is calm; times in seconds from the start."""

    start: float
    seconds: float
    incident: str | None


class IncidentDay:
    """Calm, then each incident in turn, then calm again (`recover_seconds`, default as long as
    the first calm); prints every change as it happens.

    A cold-cache tenant idles for the first `idle_share` of its phase (longer than the
    provider keeps a cache), then returns cold.
    """

    def __init__(self, knobs: Knobs, calm_seconds: float = 120.0,
                 incident_seconds: float = 180.0, order: tuple[str, ...] = tuple(INCIDENTS),
                 out: Callable[[str], None] = print, idle_share: float = 0.3,
                 recover_seconds: float | None = None):
        unknown = set(order) - set(INCIDENTS)
        if unknown:
            raise ValueError(f"unknown incidents: {sorted(unknown)}")
        self.knobs = knobs
        self.out = out
        self.idle_share = idle_share
        self.phases: list[Phase] = [Phase(0.0, calm_seconds, None)]
        at = calm_seconds
        for name in order:
            self.phases.append(Phase(at, incident_seconds, name))
            at += incident_seconds
        self.phases.append(Phase(at, calm_seconds if recover_seconds is None
                                 else recover_seconds, None))
        self.played: list[str] = []

    @property
    def seconds(self) -> float:
        """Length of the whole day."""
        last = self.phases[-1]
        return last.start + last.seconds

    def schedule(self) -> str:
        """The schedule as text, one line per phase."""
        lines = []
        for phase in self.phases:
            what = "calm" if phase.incident is None else (
                f"{INCIDENTS[phase.incident].title} on {INCIDENTS[phase.incident].target}")
            lines.append(f"  {_clock(phase.start)}  {what} ({phase.seconds:g} s)")
        return "incident day:\n" + "\n".join(lines)

    async def run(self) -> None:
        """Play the day on the running loop (cancel it to stop: the knobs go back to calm)."""
        start = time.monotonic()
        self.out(self.schedule())
        try:
            for phase in self.phases:
                if phase.incident is None:
                    await _until(start + phase.start + phase.seconds)
                    continue
                self.out(f"[{_clock(phase.start)}]")
                with playing(self.knobs, phase.incident, self.out):
                    if self.knobs.cold_tenants:  # they idle first, then come back cold
                        self.knobs.idle_tenants = self.knobs.cold_tenants
                        await _until(start + phase.start + self.idle_share * phase.seconds)
                        self.knobs.idle_tenants = frozenset()
                    await _until(start + phase.start + phase.seconds)
                self.played.append(phase.incident)
            self.out(f"[{_clock(self.seconds)}] incident day over: calm from here on")
        finally:
            clear(self.knobs)


async def _until(deadline: float) -> None:
    """Sleep until a monotonic deadline: this paces the scripted schedule, it synchronises
    nothing."""
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:{secs:02d}"
