"""The "agent tasks" dashboard: where a multi-step task's time goes, and what it leaves behind.

Built with the panel builders and query habits of panels.py (and linked with the four
dashboards of dashboards.py); the questions are the task's, not one call's: how long tasks take
and in how many steps, which kind of time (queue, network, provider, tool, guardrail, the app's
own code) fills them, how much a waterfall costs (critical path vs summed time), whether
deadlines hold and what work outlives them, and whether max_tokens leaves headroom or
truncates. Per-task figures are means over the tasks that ended in the interval (a rate of sums
over a rate of counts, `histogram_sum` / `histogram_count` in the native mode), so a panel
shows the same numbers whatever the scrape interval. Panels over the selection aggregate the
selected tasks; panels comparing tasks (or models and routes) show the top 10. The deadline
and truncation thresholds are the alerts' (alerts.py, `alerting.*_share`).
"""

from __future__ import annotations

from collections.abc import Sequence

from grafanalib import core

from .. import names
from ..config.settings import Config
from ..promql import MODEL_ROUTE, block, eq, indent, regex, selector
from .dashboards import AGENTS, MR_LEGEND, dashboard
from .grafana import Dashboard, Row, Variable
from .panels import Queries, layout, rate, share_panel, sum_by, target, timeseries, top

TASK = [names.TASK]
TASK_LEGEND = "{{task}}"
#: Runbook sections (docs/runbooks.md headings) the panels link to.
OVERRUNS, TRUNCATION = "LLMTaskDeadlineOverruns", "LLMTruncationRateHigh"


def _per(numerator: str, denominator: str) -> str:
    """numerator / denominator, no value (never NaN) where the denominator is 0."""
    return f"{block(numerator)}\n/ (\n{indent(denominator)}\n  > 0\n)"


def agent_tasks(config: Config, q: Queries) -> list[core.Panel]:
    al = config.alerting
    extra = [al.selector] if al.selector else []
    t = [regex("job", "$job"), *extra, regex(names.TASK, "$task")]
    mr = q.mr()
    tasks_total = names.TASKS_TOTAL.name
    with_deadline = [*t, f'{names.DEADLINE}!="{names.DEADLINE_NONE}"']

    def hsum(labels: Sequence[str], family: names.Family, part: str,
             matchers: Sequence[str]) -> str:
        return sum_by(labels, q.hrate(family, part, matchers))

    def mean(family: names.Family, labels: Sequence[str] = (),
             matchers: Sequence[str] = t) -> str:
        """Per task (or call): the family's rate of sums over its rate of counts."""
        return _per(hsum(labels, family, "sum", matchers),
                    hsum(labels, family, "count", matchers))

    def tasks(labels: Sequence[str], matchers: Sequence[str]) -> str:
        return sum_by(labels, rate(tasks_total, matchers))

    def per_task(counter: str, labels: Sequence[str], matchers: Sequence[str]) -> str:
        """A counter's increase per task ended, 0 (not empty) while it never moved."""
        whole = tasks(labels, matchers)
        return _per(f"{sum_by(labels, rate(counter, t))}\nor 0 * {whole}", whole)

    def share(labels: Sequence[str], metric: str, part: Sequence[str],
              whole: Sequence[str]) -> str:
        """Share of `whole`'s rate that `part` is, 0 (not empty) while `part` has no rows."""
        total = sum_by(labels, rate(metric, whole))
        return _per(f"{sum_by(labels, rate(metric, part))}\nor 0 * {total}", total)

    def quantile(p: float, family: names.Family, labels: Sequence[str] = ()) -> str:
        return q.quantile(p, family, labels, t)

    time = names.TASK_TIME
    summed = _per(hsum((), time, "sum", [*t, f'{names.KIND}!="{names.KIND_APP}"']),
                  hsum((), time, "count", [*t, eq(names.KIND, names.KIND_APP)]))
    overrun_share = share(TASK, tasks_total,
                          [*with_deadline, eq(names.DEADLINE, names.DEADLINE_EXCEEDED)],
                          with_deadline)
    finish = names.FINISH_REASONS_TOTAL.name
    truncated = share(MODEL_ROUTE, finish,
                      [*mr, eq(names.FINISH_REASON, names.FINISH_LENGTH)], mr)
    waterfalls = per_task(names.TASK_WATERFALL_CALLS.name, TASK, t)
    mean_requested = mean(names.REQUESTED_MAX_TOKENS, MODEL_ROUTE, mr)
    mean_headroom = mean(names.MAX_TOKENS_HEADROOM, MODEL_ROUTE, mr)
    return layout([
        (Row(title="Tasks"), 24),
        (timeseries("Task duration p50 / p99",
                    "Time from the start of a task to its end, every step, tool and guardrail "
                    "and the app's own code included; the selected tasks together.",
                    [target(quantile(p, names.TASK_DURATION), f"p{round(p * 100)}")
                     for p in (0.5, 0.99)], "s", q.runbook(OVERRUNS)), 8),
        (timeseries("Task duration p99 by task (top 10)",
                    "The slowest tasks: compare a task with itself an hour ago, or with the "
                    "others.",
                    [target(top(quantile(0.99, names.TASK_DURATION, TASK)),
                            TASK_LEGEND)], "s", q.runbook(OVERRUNS)), 8),
        (timeseries("Steps per task",
                    "LLM calls per task: the mean and the p99. Production tasks grow steps "
                    "their design did not draw (rewrites, retries, validation).",
                    [target(mean(names.TASK_STEPS), "mean"),
                     target(quantile(0.99, names.TASK_STEPS), "p99")], "short",
                    q.runbook(OVERRUNS)), 8),
        (Row(title="Where a task's time goes"), 24),
        (timeseries("Time per task by kind",
                    "Mean per task, stacked: queue (client side of the LLM calls), network "
                    "(connect, send and the round trip the provider's processing time leaves), "
                    "provider (the rest of the calls), tool, guardrail, and app (covered by "
                    "none of them). Parallel blocks each count, so the stack can exceed the "
                    "task's duration.",
                    [target(mean(time, [names.KIND]), "{{kind}}")], "s", q.runbook(OVERRUNS),
                    stacked=True), 12),
        (timeseries("Critical path vs summed time",
                    "Mean per task. Summed: every call, tool and guardrail added up. Critical "
                    "path: the time they covered, less what running each run of sequential "
                    "tools in parallel would save. A waterfall is the gap between the task's "
                    "busy time and its critical path.",
                    [target(summed, "summed"),
                     target(mean(names.TASK_CRITICAL_PATH), "critical path"),
                     target(mean(names.TASK_DURATION), "duration")], "s",
                    q.runbook(OVERRUNS)), 12),
        (timeseries("Waterfall candidates per task (top 10)",
                    "Tool calls per task that started after another tool ended with no LLM "
                    "call in between: nothing the client saw made them wait.",
                    [target(top(waterfalls), TASK_LEGEND)], "short",
                    q.runbook(OVERRUNS)), 12),
        (timeseries("Orphan tokens and late calls per task",
                    "Per task with a deadline: output tokens generated after it and LLM calls "
                    "started after it, work nobody waits for.",
                    [target(per_task(names.TASK_ORPHAN_TOKENS.name, (), with_deadline),
                            "orphan tokens"),
                     target(per_task(names.TASK_LATE_CALLS.name, (), with_deadline),
                            "late calls")], "short", q.runbook(OVERRUNS)), 12),
        (Row(title="Deadlines"), 24),
        (share_panel("Tasks over their deadline (top 10)",
                     f"Share of the tasks with a deadline that ended past it (alert above "
                     f"{round(al.task_deadline_overrun_share * 100, 2):g} %).",
                     overrun_share, TASK_LEGEND, q.runbook(OVERRUNS),
                     al.task_deadline_overrun_share), 24),
        (Row(title="max_tokens headroom (LLM calls, by model and route)"), 24),
        (timeseries("max_tokens requested vs output tokens (top 5)",
                    "Calls that set max_tokens: the mean requested, and the mean output "
                    "(requested less the headroom the call left). Decode is sequential: unused "
                    "headroom is latency and money at risk.",
                    [target(top(mean_requested, 5), "max_tokens " + MR_LEGEND),
                     target(top(f"{block(mean_requested)}\n- on ({', '.join(MODEL_ROUTE)}) "
                                f"{block(mean_headroom)}", 5), "output " + MR_LEGEND)],
                    "short", q.runbook(TRUNCATION)), 12),
        (share_panel("Truncation rate (top 10)",
                     f"Share of the calls the provider stopped at max_tokens (finish_reason "
                     f"length, max_tokens or max_output_tokens; alert above "
                     f"{round(al.truncation_share * 100, 2):g} %).",
                     truncated, MR_LEGEND, q.runbook(TRUNCATION), al.truncation_share), 12),
    ])


def agent_dashboard(config: Config) -> Dashboard:
    """The dashboard, with a `task` variable after job, model and route (no tenant: task
    families carry none)."""
    tasks = selector(names.TASKS_TOTAL.name, [regex("job", "$job")])
    task = Variable(name=names.TASK, label="Task",
                    query=f"label_values({tasks}, {names.TASK})")
    return dashboard(AGENTS, config, agent_tasks, [task])
