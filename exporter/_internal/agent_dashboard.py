"""The "agent tasks" dashboard: where a multi-step task's time goes, and what it leaves behind.

Built with the panel builders of dashboards.py (and linked with its four dashboards); the
questions are the task's, not one call's: how long tasks take and in how many steps, which
kind of time (queue, network, provider, tool, guardrail, the app's own code) fills them, how
much a waterfall costs (critical path vs summed time), whether deadlines hold and what work
outlives them, and whether max_tokens leaves headroom or truncates. Per-task figures are means
over the tasks that ended in the interval (a rate of sums over a rate of counts), so a panel
shows the same numbers whatever the scrape interval. The deadline and truncation thresholds
are the alerts' (alerts.py, `alerting.*_share`).
"""

from __future__ import annotations

from collections.abc import Sequence

from grafanalib import core

from . import names
from .config import Config
from .dashboards import (AGENTS, MR_LEGEND, RATE, Row, dashboard, layout, target, timeseries,
                         variables)
from .grafana import Dashboard, Variable, step
from .promql import MODEL_ROUTE, by, eq, indent, quantile, regex, selector

TASK = [names.TASK]
TASK_LEGEND = "{{task}}"


def _sum_rate(labels: Sequence[str], metric: str, matchers: Sequence[str]) -> str:
    return f"sum by ({by(labels)}) (rate({selector(metric, matchers)}[{RATE}]))"


def _per(numerator: str, denominator: str) -> str:
    """numerator / denominator, both multi-line safe."""
    return f"(\n{indent(numerator)}\n)\n/ (\n{indent(denominator)}\n)"


def _share(labels: Sequence[str], metric: str, part: Sequence[str], whole: Sequence[str]
           ) -> str:
    """Share of `whole`'s rate that `part` is, 0 (not empty) while `part` has no rows yet."""
    total = _sum_rate(labels, metric, whole)
    return _per(f"{_sum_rate(labels, metric, part)}\nor 0 * {total}", total)


def agent_tasks(config: Config) -> list[core.Panel]:
    al = config.alerting
    t = [regex(names.TASK, "$task")]
    mr = [regex(names.MODEL, "$model"), regex(names.ROUTE, "$route")]
    time_sum, time_count = names.TASK_TIME.name + "_sum", names.TASK_TIME.name + "_count"
    tasks_total = names.TASKS_TOTAL.name
    with_deadline = [*t, f'{names.DEADLINE}!="{names.DEADLINE_NONE}"']
    app = [*t, eq(names.KIND, names.KIND_APP)]

    def mean(metric: str, labels: Sequence[str] = TASK) -> str:
        return _per(_sum_rate(labels, metric + "_sum", t), _sum_rate(labels, metric + "_count", t))

    def per_task(counter: str, tasks: Sequence[str]) -> str:
        return _per(_sum_rate(TASK, counter, t), _sum_rate(TASK, tasks_total, tasks))

    requested, headroom = names.REQUESTED_MAX_TOKENS.name, names.MAX_TOKENS_HEADROOM.name
    mean_requested = _per(_sum_rate(MODEL_ROUTE, requested + "_sum", mr),
                          _sum_rate(MODEL_ROUTE, requested + "_count", mr))
    mean_headroom = _per(_sum_rate(MODEL_ROUTE, headroom + "_sum", mr),
                         _sum_rate(MODEL_ROUTE, headroom + "_count", mr))
    finish = names.FINISH_REASONS_TOTAL.name
    return layout([
        (Row(title="Tasks"), 24),
        (timeseries("Task duration p50 / p99",
                    "Time from the start of a task to its end, every step, tool and guardrail "
                    "and the app's own code included.",
                    [target(quantile(q, names.TASK_DURATION, TASK, RATE, t),
                            f"p{round(q * 100)} {TASK_LEGEND}") for q in (0.5, 0.99)], "s"), 12),
        (timeseries("Steps per task",
                    "LLM calls per task: the mean, and the p99. Production tasks grow steps "
                    "their design did not draw (rewrites, retries, validation).",
                    [target(mean(names.TASK_STEPS.name), "mean " + TASK_LEGEND),
                     target(quantile(0.99, names.TASK_STEPS, TASK, RATE, t),
                            "p99 " + TASK_LEGEND)], "short"), 12),
        (Row(title="Where a task's time goes"), 24),
        (timeseries("Time per task by kind",
                    "Mean per task, stacked: queue (client side of the LLM calls), network "
                    "(connect, send and the round trip the provider's processing time leaves), "
                    "provider (the rest of the calls), tool, guardrail, and app (covered by "
                    "none of them). Parallel blocks each count, so the stack can exceed the "
                    "task's duration.",
                    [target(mean(names.TASK_TIME.name, [names.KIND]), "{{kind}}")], "s",
                    stacked=True), 12),
        (timeseries("Critical path vs summed time",
                    "Mean per task. Summed: every call, tool and guardrail added up. Critical "
                    "path: the time they covered, less what running each run of sequential "
                    "tools in parallel would save. A waterfall is the gap between the task's "
                    "duration and its critical path.",
                    [target(_per(_sum_rate(TASK, time_sum,
                                           [*t, f'{names.KIND}!="{names.KIND_APP}"']),
                                 _sum_rate(TASK, time_count, app)), "summed " + TASK_LEGEND),
                     target(mean(names.TASK_CRITICAL_PATH.name), "critical path " + TASK_LEGEND),
                     target(mean(names.TASK_DURATION.name), "duration " + TASK_LEGEND)],
                    "s"), 12),
        (timeseries("Waterfall candidates per task",
                    "Tool calls per task that started after another tool ended with no LLM "
                    "call in between: nothing the client saw made them wait.",
                    [target(per_task(names.TASK_WATERFALL_CALLS.name, t), TASK_LEGEND)],
                    "short"), 12),
        (timeseries("Orphan tokens and late calls per task",
                    "Per task with a deadline: output tokens generated after it and LLM calls "
                    "started after it, work nobody waits for.",
                    [target(per_task(names.TASK_ORPHAN_TOKENS.name, with_deadline),
                            "orphan tokens " + TASK_LEGEND),
                     target(per_task(names.TASK_LATE_CALLS.name, with_deadline),
                            "late calls " + TASK_LEGEND)], "short"), 12),
        (Row(title="Deadlines"), 24),
        (timeseries("Tasks over their deadline",
                    f"Share of the tasks with a deadline that ended past it (alert above "
                    f"{round(al.task_deadline_overrun_share * 100, 2):g} %).",
                    [target(_share(TASK, tasks_total,
                                   [*t, eq(names.DEADLINE, names.DEADLINE_EXCEEDED)],
                                   with_deadline), TASK_LEGEND)], "percentunit",
                    thresholds=[step("green"), step("red", al.task_deadline_overrun_share)]), 24),
        (Row(title="max_tokens headroom (LLM calls, by model and route)"), 24),
        (timeseries("max_tokens requested vs output tokens",
                    "Calls that set max_tokens: the mean requested, and the mean output "
                    "(requested less the headroom the call left). Decode is sequential: unused "
                    "headroom is latency and money at risk.",
                    [target(mean_requested, "max_tokens " + MR_LEGEND),
                     target(f"(\n{indent(mean_requested)}\n)\n- (\n{indent(mean_headroom)}\n)",
                            "output " + MR_LEGEND)], "short"), 12),
        (timeseries("Truncation rate",
                    f"Share of the calls the provider stopped at max_tokens (finish_reason "
                    f"length, max_tokens or max_output_tokens; alert above "
                    f"{round(al.truncation_share * 100, 2):g} %).",
                    [target(_share(MODEL_ROUTE, finish,
                                   [*mr, eq(names.FINISH_REASON, names.FINISH_LENGTH)], mr),
                            MR_LEGEND)], "percentunit",
                    thresholds=[step("green"), step("red", al.truncation_share)]), 12),
    ])


def agent_dashboard(config: Config) -> Dashboard:
    """The dashboard, with a `task` variable before model and route (no tenant: task
    families carry none)."""
    task = Variable(name=names.TASK, label="Task",
                    query=f"label_values({names.TASKS_TOTAL.name}, {names.TASK})")
    templating = [v for v in variables(task) if v.name != names.TENANT]
    return dashboard(AGENTS, config, agent_tasks(config), templating)
