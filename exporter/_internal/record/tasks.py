"""Where an agent task's time went: the accounting of one task from its steps and spans.

While a task runs (shim/task.py) it only collects: one `Step` per LLM call made inside it, with
the call's time already split into queue, network and provider (`step_of`, when the call ends),
and one `Work` per tool or guardrail block (two stamps). At the task's end `summarize` turns
them into the task's figures once, outside any lock; the recorder then records the summary
under one lock acquisition. Times are integer microseconds, stamps `perf_counter_ns()` values.

Definitions (docs/metrics.md, "Agent tasks"):

* a step's time is the LLM call's duration, split into `queue` (client-side: SDK work and
  connection-pool wait), `network` (connect + send + the round trip inside the server phase,
  known when the provider reports its own processing time) and `provider` (the rest: the
  provider's part of the server phase, prefill, reasoning, decode, the stream's tail);
* `tool` and `guardrail` are the summed durations of those blocks; `app` is the task's time
  covered by no step, tool or guardrail (the app's own code);
* summed time = every step, tool and guardrail duration added up; busy time = the length of
  their union; critical path = the busy time the task would have with each run of tools
  between two LLM calls started together (the run as long as its longest tool), at most the
  busy time: never shorter than the longest step, tool or guardrail;
* a waterfall candidate is a tool call that started after another tool of the same run ended,
  with no LLM call started in between: nothing the client sees made it wait for the other.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

from .. import names
from .timeline import NS_PER_US, CallTimeline, Derived

TOOL, GUARDRAIL = names.KIND_TOOL, names.KIND_GUARDRAIL


class Step(NamedTuple):
    """One LLM call of a task: its stamps, its time split (µs) and what deadlines need."""

    start: int
    end: int
    queue: int
    network: int
    provider: int
    #: Token event stamps and output tokens, to count the tokens generated after a deadline.
    token_times: list[int]
    output_tokens: int | None


class Work(NamedTuple):
    """One tool or guardrail block of a task."""

    kind: str
    start: int
    end: int


class TaskSummary(NamedTuple):
    """Everything recorded about one finished task (times in µs)."""

    name: str
    end: int  # stamp: the window slice the task's values join
    outcome: str
    deadline: str  # names.DEADLINE_NONE / _MET / _EXCEEDED
    duration: int
    steps: int
    kinds: dict[str, int]  # names.TASK_KINDS -> µs
    summed: int
    critical_path: int
    waterfall_calls: int
    late_calls: int
    orphan_tokens: int


def step_of(t: CallTimeline, d: Derived) -> Step:
    """A finished call as a step: its duration split into queue, network and provider."""
    start = t.start
    end = t.end if t.end is not None else start
    duration = d.duration or 0
    phases = d.phases
    queue = min(phases.get("queue", 0), duration)
    network = phases.get("connect", 0) + phases.get("send", 0)
    if t.round_trip is not None:
        network += t.round_trip // NS_PER_US
    network = min(network, duration - queue)
    return Step(start, end, queue, network, duration - queue - network, t.token_times,
                t.output_tokens)


def orphan_tokens(step: Step, deadline: int) -> int:
    """Output tokens the provider generated after `deadline` (an estimate, docs/metrics.md).

    With token stamps: the output tokens in the share of token events after the deadline
    (every event when usage is missing). Without (a call that did not stream): the output
    tokens in the share of the call's time after the deadline.
    """
    if step.end <= deadline:
        return 0
    times = step.token_times
    output = step.output_tokens
    if times:
        after = len(times) - bisect_right(times, deadline)
        return after if not output else round(output * after / len(times))
    if not output or step.end <= step.start:
        return 0
    late = step.end - max(step.start, deadline)
    return round(output * late / (step.end - step.start))


def union_us(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) stamp intervals, in µs."""
    total = 0
    reach = None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total // NS_PER_US


def _clip(a: int, b: int, start: int, end: int) -> tuple[int, int]:
    """[a, b) within [start, end) (empty, not reversed, when outside)."""
    a = min(max(a, start), end)
    return a, max(a, min(b, end))


def tool_runs(steps: list[Step], tools: list[Work]) -> list[list[Work]]:
    """The task's runs of tools, each sorted: the tools that started after one LLM call
    started and before the next (tools before the first call are a run too)."""
    starts = sorted(s.start for s in steps)
    groups: dict[int, list[Work]] = {}
    for tool in tools:
        groups.setdefault(bisect_right(starts, tool.start), []).append(tool)
    return [sorted(group) for group in groups.values()]


def waterfall_calls(runs: list[list[Work]]) -> int:
    """Tools that started at or after the end of an earlier tool of their run: they waited for
    nothing the client can see."""
    calls = 0
    for run in runs:
        first_end = None
        for tool in run:
            if first_end is not None and tool.start >= first_end:
                calls += 1
            first_end = tool.end if first_end is None else min(first_end, tool.end)
    return calls


def critical_path(others: list[tuple[int, int]], runs: list[list[Work]], busy: int) -> int:
    """The busy time the task would have with each run of tools started together, in µs.

    Each run becomes one interval from its first start, as long as its longest tool; the steps
    and guardrails (`others`) stay as they ran. The union of those is never shorter than the
    longest step or block (each is in it, whole) and never longer than the busy time (a run's
    interval can cover a gap the run left: that is not time to save, so the busy time caps it).
    """
    collapsed = [(run[0].start, run[0].start + max(w.end - w.start for w in run))
                 for run in runs]
    return min(busy, union_us(others + collapsed))


def summarize(name: str, start: int, end: int, deadline: int | None, outcome: str,
              steps: list[Step], works: list[Work]) -> TaskSummary:
    """The task's figures from what it collected (spans clipped to the task's own time)."""
    kinds = dict.fromkeys(names.TASK_KINDS, 0)
    others = []  # the steps and guardrails, clipped to the task's time
    tools = []
    for s in steps:
        kinds[names.KIND_QUEUE] += s.queue
        kinds[names.KIND_NETWORK] += s.network
        kinds[names.KIND_PROVIDER] += s.provider
        others.append(_clip(s.start, s.end, start, end))
    for w in works:
        kinds[w.kind] += (w.end - w.start) // NS_PER_US
        if w.kind == TOOL:
            tools.append(Work(w.kind, *_clip(w.start, w.end, start, end)))
        else:
            others.append(_clip(w.start, w.end, start, end))
    runs = tool_runs(steps, tools)
    busy = union_us(others + [(w.start, w.end) for w in tools])
    duration = (end - start) // NS_PER_US
    kinds[names.KIND_APP] = max(0, duration - busy)
    late = orphans = 0
    verdict = names.DEADLINE_NONE
    if deadline is not None:
        verdict = names.DEADLINE_EXCEEDED if end > deadline else names.DEADLINE_MET
        late = sum(1 for s in steps if s.start > deadline)
        orphans = sum(orphan_tokens(s, deadline) for s in steps)
    return TaskSummary(
        name=name, end=end, outcome=outcome, deadline=verdict, duration=duration,
        steps=len(steps), kinds=kinds, summed=sum(kinds.values()) - kinds[names.KIND_APP],
        critical_path=critical_path(others, runs, busy),
        waterfall_calls=waterfall_calls(runs), late_calls=late,
        orphan_tokens=orphans)
