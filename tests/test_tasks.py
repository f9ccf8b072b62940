"""Agent tasks: the accounting (hand-made stamps), the API (sync, async, threads, nesting,
never raising), deadlines across calls and services, the task span, and the task families
through the recorder, the exposition and the push to an aggregator."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import exporter
import exporter.integrations
from exporter._internal import names, runtime
from exporter._internal.config.loader import load
from exporter._internal.config.settings import Config
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import validate, wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record import tasks
from exporter._internal.record.recorder import Recorder
from exporter._internal.record.timeline import CallTimeline, derive
from exporter._internal.shim import deadline, manual, otel, task as task_module
from tests.support import require_module

MS = 1_000_000  # ns


def step(start_ms: int, end_ms: int, **phases_ms: int) -> tasks.Step:
    """A step from hand-made stamps: queue/connect/send/round trip as given (ms)."""
    t = CallTimeline(start=start_ms * MS, model="m", provider="p", route="r")
    at = t.start + phases_ms.get("queue", 0) * MS
    t.dispatched = at
    t.connected = at = at + phases_ms.get("connect", 0) * MS
    t.sent = at + phases_ms.get("send", 0) * MS
    if "round_trip" in phases_ms:
        t.round_trip = phases_ms["round_trip"] * MS
    t.end = end_ms * MS
    return tasks.step_of(t, derive(t))


def work(kind: str, start_ms: int, end_ms: int) -> tasks.Work:
    return tasks.Work(kind, start_ms * MS, end_ms * MS)


TOOL, GUARD = names.KIND_TOOL, names.KIND_GUARDRAIL

# --- accounting -------------------------------------------------------------------------------


def test_a_step_splits_into_queue_network_and_provider() -> None:
    s = step(0, 300, queue=5, connect=10, send=2, round_trip=100)
    assert (s.queue, s.network, s.provider) == (5_000, 112_000, 183_000)
    # Without the provider's processing time the round trip stays in provider time.
    s = step(0, 300, queue=5, connect=0, send=2)
    assert (s.queue, s.network, s.provider) == (5_000, 2_000, 293_000)


def test_time_by_kind_app_time_and_the_deadline() -> None:
    steps = [step(10, 110, queue=2, connect=0, send=0, round_trip=40), step(300, 400)]
    works = [work(GUARD, 0, 10), work(TOOL, 150, 250)]
    s = tasks.summarize("t", 0, 450 * MS, 200 * MS, names.OK, steps, works)
    assert s.kinds == {"queue": 2_000, "network": 40_000, "provider": 158_000, "tool": 100_000,
                       "guardrail": 10_000, "app": 140_000}  # 110-150, 250-300, 400-450
    assert (s.duration, s.steps, s.summed) == (450_000, 2, 310_000)
    assert s.critical_path == 310_000  # one tool per run: nothing to gain
    assert (s.deadline, s.late_calls, s.waterfall_calls) == (names.DEADLINE_EXCEEDED, 1, 0)


def test_sequential_tools_between_two_calls_are_a_waterfall() -> None:
    steps = [step(0, 100), step(400, 500)]
    works = [work(TOOL, 100, 200), work(TOOL, 200, 300), work(TOOL, 300, 350)]
    s = tasks.summarize("t", 0, 500 * MS, None, names.OK, steps, works)
    assert s.waterfall_calls == 2
    assert s.summed == 450_000
    assert s.critical_path == 450_000 - (250_000 - 100_000)  # the run could take its longest
    assert s.deadline == names.DEADLINE_NONE


def test_parallel_tools_are_no_waterfall_and_a_call_breaks_a_run() -> None:
    steps = [step(0, 100), step(220, 300), step(420, 500)]
    works = [work(TOOL, 100, 200), work(TOOL, 100, 210),  # gather: parallel
             work(TOOL, 300, 400), work(TOOL, 410, 415)]  # no call between these two
    s = tasks.summarize("t", 0, 500 * MS, None, names.OK, steps, works)
    assert s.waterfall_calls == 1  # only the 410 ms tool waited for the 300 ms one
    assert s.kinds["tool"] == 100_000 + 110_000 + 100_000 + 5_000
    assert s.kinds["app"] == 25_000  # 210-220, 400-410, 415-420
    assert s.critical_path == 475_000 - 5_000  # the second run: its shorter tool


def test_a_call_beside_sequential_tools_is_the_critical_path() -> None:
    """gather(a 1.0 s call, two sequential 0.4 s tools): the call is the critical path."""
    steps = [step(0, 1000)]
    works = [work(TOOL, 0, 400), work(TOOL, 400, 800)]
    s = tasks.summarize("t", 0, 1000 * MS, None, names.OK, steps, works)
    assert (s.duration, s.critical_path, s.waterfall_calls) == (1_000_000, 1_000_000, 1)
    # a guardrail covering the gap a collapsed run would leave: never more than the busy time
    works = [work(TOOL, 200, 210), work(TOOL, 500, 1000), work(GUARD, 600, 1000)]
    s = tasks.summarize("t", 0, 1000 * MS, None, names.OK, [step(0, 100)], works)
    assert s.critical_path == 100_000 + 10_000 + 500_000  # the busy time; collapsed: 700 ms


def reference_critical_path(steps: list[tuple[int, int]], works: list[tasks.Work]
                            ) -> tuple[int, int, int]:
    """(critical path, busy time, longest block) in µs by brute force: the set of covered
    microseconds, each run of tools (by the last call started at or before each tool) laid
    from its first start for its longest tool."""
    def cover(a: int, b: int) -> set[int]:
        return set(range(a // 1000, b // 1000))

    busy: set[int] = set()
    kept: set[int] = set()
    runs: dict[int, list[tasks.Work]] = {}
    for a, b in steps:
        busy |= cover(a, b)
        kept |= cover(a, b)
    for w in works:
        busy |= cover(w.start, w.end)
        if w.kind == GUARD:
            kept |= cover(w.start, w.end)
        else:
            runs.setdefault(sum(1 for a, _ in steps if a <= w.start), []).append(w)
    for run in runs.values():
        first = min(w.start for w in run)
        kept |= cover(first, first + max(w.end - w.start for w in run))
    longest = max([b - a for a, b in steps] + [w.end - w.start for w in works] + [0]) // 1000
    return min(len(busy), len(kept)), len(busy), longest


def test_the_critical_path_matches_a_brute_force_reference() -> None:
    """Random interval sets (µs stamps in one task): the critical path is the reference's,
    never shorter than the longest step or block, never longer than the busy time."""
    require_module("hypothesis")
    from hypothesis import given, settings, strategies as st

    interval = st.tuples(st.integers(0, 60), st.integers(1, 30)).map(
        lambda t: (t[0] * 1000, (t[0] + t[1]) * 1000))
    block = st.tuples(st.sampled_from([TOOL, TOOL, GUARD]), interval).map(
        lambda t: tasks.Work(t[0], *t[1]))

    @settings(max_examples=500, deadline=None, derandomize=True)
    @given(st.lists(interval, max_size=5), st.lists(block, max_size=8))
    def check(spans: list[tuple[int, int]], works: list[tasks.Work]) -> None:
        steps = [tasks.Step(a, b, 0, 0, (b - a) // 1000, [], None) for a, b in spans]
        s = tasks.summarize("t", 0, 100 * 1000, None, names.OK, steps, works)
        critical, busy, longest = reference_critical_path(spans, works)
        assert s.critical_path == critical
        assert longest <= s.critical_path <= busy == s.duration - s.kinds["app"]

    check()


def test_orphan_tokens_from_token_stamps_or_the_time_share() -> None:
    t = CallTimeline(start=0, model="m", provider="p", route="r")
    for ms in (10, 20, 30, 40):
        t.token(ms * MS)
    t.end, t.output_tokens = 50 * MS, 40
    s = tasks.step_of(t, derive(t))
    assert tasks.orphan_tokens(s, 25 * MS) == 20  # half the events, of 40 tokens
    assert tasks.orphan_tokens(s, 60 * MS) == 0
    t.output_tokens = None
    assert tasks.orphan_tokens(tasks.step_of(t, derive(t)), 25 * MS) == 2  # events only
    body = CallTimeline(start=0, model="m", provider="p", route="r", output_tokens=100)
    body.end = 100 * MS  # not streamed: no token stamps
    assert tasks.orphan_tokens(tasks.step_of(body, derive(body)), 75 * MS) == 25


# --- the API ----------------------------------------------------------------------------------


class Clock:
    """The shim's `perf_counter_ns()` (tasks, deadlines, calls), stopped: tests move it."""

    def __init__(self) -> None:
        self.now = 1_000_000 * MS

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    for module in (task_module, deadline, manual):
        monkeypatch.setattr(module, "perf_counter_ns", c)
    return c


def summaries(monkeypatch: pytest.MonkeyPatch) -> list[tasks.TaskSummary]:
    """Every summary the recorder receives (it still records them)."""
    rec = runtime.state().recorder
    seen: list[tasks.TaskSummary] = []
    original = rec.record_task
    monkeypatch.setattr(rec, "record_task", lambda s: (seen.append(s), original(s)))
    return seen


def manual_call() -> None:
    with exporter.track(model="m", provider="p") as call:
        call.sent()
        call.headers()
        call.token()
        call.usage(output=3, finish_reason="length")


def test_calls_tools_and_guardrails_of_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = summaries(monkeypatch)
    with exporter.task("answer") as t:
        with exporter.guardrail("moderation"):
            time.sleep(0.02)  # the guardrail's own time (pacing)
        manual_call()
        with exporter.tool("search"):
            time.sleep(0.03)
        manual_call()
    s = seen.pop()
    assert (s.name, s.steps, s.outcome, s.deadline) == ("answer", 2, names.OK, "none")
    assert s.kinds["guardrail"] >= 20_000 and s.kinds["tool"] >= 30_000
    assert s.kinds["tool"] < s.duration and t.deadline is None
    text = runtime.state().renderer.render().decode()
    assert 'llm_client_task_steps_sum{task="answer"} 2.0' in text
    assert 'llm_client_tasks_total{deadline="none",outcome="ok",task="answer"} 1.0' in text
    assert 'llm_client_task_waterfall_tool_calls_total{task="answer"} 0.0' in text
    assert "llm_client_task_late_calls_total{" not in text  # no deadline, no row
    assert ('llm_client_finish_reasons_total{finish_reason="length",model="m",provider="p",'
            'route="unknown"} 2.0') in text


async def test_gathered_tools_are_parallel_and_async_blocks_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = summaries(monkeypatch)

    async def tool(name: str) -> None:
        async with exporter.tool(name):
            await asyncio.sleep(0.05)  # the tool's own time (pacing)

    async with exporter.task("gather"):
        await asyncio.gather(tool("a"), tool("b"), tool("c"))
        await tool("d")
        await tool("e")
    s = seen.pop()
    assert s.kinds["tool"] >= 5 * 50_000
    assert s.waterfall_calls == 2  # d after the three, e after d; a, b, c overlap
    # The parallel three count once in the busy time and the critical path: ~50 ms + 50 ms.
    assert s.critical_path < s.summed - 2 * 50_000 + 20_000


def test_threads_join_the_task_with_its_context_or_its_object(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = summaries(monkeypatch)

    def lookup() -> None:
        with exporter.tool("lookup"):
            pass

    with exporter.task("threads") as t, concurrent.futures.ThreadPoolExecutor(2) as pool:
        pool.submit(lookup).result()  # no context: not this task's
        pool.submit(contextvars.copy_context().run, lookup).result()
        pool.submit(lambda: t.tool("by-object").__enter__().__exit__(None, None, None)).result()
        asyncio.run(asyncio.to_thread(lookup))  # to_thread copies the context
    assert len(seen.pop().kinds) == 6
    assert [kind for kind, _, _ in t.works] == [TOOL] * 3


def test_a_nested_task_records_itself_and_counts_in_the_outer_one(
        monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    seen = summaries(monkeypatch)
    with exporter.task("outer", deadline=60) as outer:
        manual_call()
        with exporter.task("inner", deadline=30) as inner:
            manual_call()
            assert exporter.remaining() == 30
        assert exporter.remaining() == 60
    inner_s, outer_s = seen
    assert (inner_s.name, inner_s.steps, outer_s.name, outer_s.steps) == \
        ("inner", 1, "outer", 2)
    assert inner.deadline < outer.deadline
    with exporter.task("tight", deadline=1):
        with exporter.task("loose", deadline=100) as loose:  # cannot outlive the outer one
            assert loose.remaining() <= 1


async def test_one_task_object_is_re_entrant_concurrent_and_nested(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry of one `task()` object is a task of its own: concurrent asyncio blocks,
    threads and a nested entry each record their own summary with their own steps."""
    seen = summaries(monkeypatch)
    shared = exporter.task("shared")

    async def block(calls: int) -> None:
        async with shared:
            for _ in range(calls):
                manual_call()
                await asyncio.sleep(0.01)  # the other block runs meanwhile (pacing)

    await asyncio.gather(block(1), block(2))
    assert sorted(s.steps for s in seen) == [1, 2]
    seen.clear()
    both_inside = threading.Barrier(2)

    def in_thread(calls: int) -> None:
        with shared:
            both_inside.wait(5)
            for _ in range(calls):
                manual_call()
            both_inside.wait(5)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(in_thread, (3, 4)))
    assert sorted(s.steps for s in seen) == [3, 4]
    seen.clear()
    with shared as outer:
        manual_call()
        with shared as inner:
            manual_call()
        assert task_module.current() is outer and inner is not outer
    assert [s.steps for s in seen] == [1, 2]  # the inner task, then the outer one with it
    shared.__exit__(None, None, None)  # more exits than entries: nothing happens
    assert task_module.current() is None


def test_a_task_left_unfinished_in_a_thread_stays_bounded(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A pool thread enters a task and never leaves it: its context keeps the task current, so
    every later job's calls and tools join it; it keeps MAX_RECORDS of them, counted once."""
    rec = runtime.state().recorder
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        leaked = pool.submit(lambda: exporter.task("leaked").__enter__()).result()

        def job() -> None:
            manual_call()
            with exporter.tool("lookup"):
                pass

        for _ in range(task_module.MAX_RECORDS):
            pool.submit(job).result()
        assert pool.submit(task_module.current).result() is leaked
    assert len(leaked.steps) + len(leaked.works) == task_module.MAX_RECORDS
    assert rec.counts().value(names.DROPPED, names.DROP_TASK_OVERFLOW) == 1
    requests = sum(rec.counts().rows[names.REQUESTS_TOTAL].values())
    assert requests == task_module.MAX_RECORDS  # every call itself is still recorded


def test_tasks_and_labels_nest_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Labels set around or inside a task label its calls; the task counts them all."""
    seen = summaries(monkeypatch)
    with exporter.labels(route="outer-route", tenant="acme"):
        with exporter.task("labelled"):
            manual_call()
            with exporter.labels(route="inner-route"):
                manual_call()
                with exporter.task("inner"):
                    manual_call()
    inner, outer = seen
    assert (inner.name, inner.steps, outer.name, outer.steps) == ("inner", 1, "labelled", 3)
    text = runtime.state().renderer.render().decode()
    for route, n in (("outer-route", 1), ("inner-route", 2)):
        assert (f'llm_client_requests_total{{model="m",outcome="ok",provider="p",'
                f'route="{route}",tenant="acme"}} {n}.0') in text


def test_nothing_raises_into_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = runtime.state().recorder
    with exporter.task("bad deadline", deadline="soon") as t:  # type: ignore[arg-type]
        pass
    assert t.deadline is None and rec.counts().value(names.DROPPED, names.DROP_BAD_VALUE) == 1
    monkeypatch.setattr(tasks, "summarize", lambda *a: 1 / 0)
    with pytest.raises(KeyError):  # the block's own exception passes through, untouched
        with exporter.task(object()):  # type: ignore[arg-type]
            with exporter.tool(None):  # type: ignore[arg-type]
                raise KeyError("mine")
    assert rec.counts().value(names.DROPPED, names.DROP_INTERNAL) == 1
    with exporter.tool("outside a task"), exporter.guardrail("too"):
        pass
    assert exporter.remaining() is None


def test_failed_tasks_and_folded_task_names() -> None:
    runtime.configure({"labels": {"max_tasks": 2}})
    for name in ("a", "b", "c", "d"):
        with pytest.raises(ValueError), exporter.task(name, deadline=60):
            raise ValueError
    text = runtime.state().renderer.render().decode()
    assert 'llm_client_tasks_total{deadline="met",outcome="error",task="__other__"} 2.0' in text
    assert 'ttft_exporter_label_folds_total{label="task"} 2.0' in text
    assert 'llm_client_task_late_calls_total{task="a"} 0.0' in text


# --- deadlines across services ----------------------------------------------------------------


def test_remaining_falls_to_zero_and_late_calls_count(monkeypatch: pytest.MonkeyPatch,
                                                      clock: Clock) -> None:
    seen = summaries(monkeypatch)
    with exporter.task("late", deadline=0.02):
        manual_call()
        clock.advance(0.01)
        assert exporter.remaining() == pytest.approx(0.01)
        clock.advance(0.02)  # past the deadline
        assert exporter.remaining() == 0.0
        manual_call()
    s = seen.pop()
    assert (s.deadline, s.late_calls, s.orphan_tokens) == (names.DEADLINE_EXCEEDED, 1, 3)


def test_the_propagator_carries_the_deadline_to_the_next_service(clock: Clock) -> None:
    propagator = exporter.integrations.DeadlinePropagator()
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    assert carrier == {}  # no deadline in force
    with exporter.task("upstream", deadline=2.0):
        propagator.inject(carrier)
    assert carrier[names.DEADLINE_HEADER] == "2000"
    from opentelemetry import context

    token = context.attach(propagator.extract(carrier))  # the downstream service
    try:
        assert exporter.remaining() == 2.0
        clock.advance(0.5)
        with exporter.task("downstream", deadline=10) as t:
            assert t.remaining() == 1.5  # the inherited deadline, earlier than its own
    finally:
        context.detach(token)
    assert propagator.fields == {names.DEADLINE_HEADER}
    for bad in ("soon", "-5", str(deadline.MAX_MS + 1)):
        assert propagator.extract({names.DEADLINE_HEADER: bad}) is not None
        assert deadline.parse(bad) is None


async def test_middlewares_put_an_inbound_deadline_in_force(clock: Clock) -> None:
    seen: list[float | None] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(exporter.remaining())
        return web.Response(text="ok")

    app = web.Application(middlewares=[exporter.integrations.aiohttp_middleware()])
    app.router.add_get("/x", handler)
    async with TestClient(TestServer(app)) as client:
        await client.get("/x", headers={names.DEADLINE_HEADER: "1500"})
        await client.get("/x")
    assert seen[0] == 1.5 and seen[1] is None

    async def asgi_app(scope: dict, receive: object, send: object) -> None:
        seen.append(exporter.remaining())

    asgi = exporter.integrations.ASGIMiddleware(asgi_app)
    await asgi({"type": "http", "headers": [(b"ttft-deadline-ms", b"800")]}, None, None)
    assert seen[2] == 0.8 and exporter.remaining() is None


# --- the task span ----------------------------------------------------------------------------


def test_one_task_span_parents_its_calls_tools_and_guardrails(spans) -> None:
    with exporter.task("answer", deadline=30):
        with exporter.guardrail("pii"):
            pass
        manual_call()
        with exporter.tool("search"):
            manual_call()  # a call a tool makes is the tool's child
    finished = {s.name: s for s in spans.get_finished_spans()}
    task_span = finished["invoke_agent answer"]
    for name in ("guardrail pii", "execute_tool search"):
        assert finished[name].parent.span_id == task_span.context.span_id
    calls = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    assert calls[0].parent.span_id == task_span.context.span_id
    assert calls[1].parent.span_id == finished["execute_tool search"].context.span_id
    attrs = task_span.attributes
    assert attrs["gen_ai.agent.name"] == "answer" and attrs["ttft_exporter.task.steps"] == 2
    assert attrs["ttft_exporter.task.deadline"] == names.DEADLINE_MET
    assert attrs["ttft_exporter.task.orphan_tokens"] == 0
    for kind in names.TASK_KINDS:
        assert attrs[f"ttft_exporter.task.time.{kind}"] >= 0
    assert finished["execute_tool search"].attributes["gen_ai.tool.name"] == "search"


def test_outside_a_task_a_block_is_a_span_only_inside_a_recording_span(spans) -> None:
    """With no task, a tool block has nothing to count into; it is a span where the app
    traces a request (a recording span is current), not a root span of its own."""
    with exporter.tool("alone"):
        pass
    tracer = otel.trace.get_tracer_provider().get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        with exporter.tool("in a request"), exporter.guardrail("pii"):
            pass
    finished = {s.name: s for s in spans.get_finished_spans()}
    assert "execute_tool alone" not in finished
    tool = finished["execute_tool in a request"]
    assert tool.parent.span_id == request.get_span_context().span_id
    assert finished["guardrail pii"].parent.span_id == tool.context.span_id  # nested in it


# --- recorder, exposition, push ---------------------------------------------------------------


def summary(name: str = "t", **over: object) -> tasks.TaskSummary:
    fields = dict(name=name, end=1, outcome=names.OK, deadline=names.DEADLINE_EXCEEDED,
                  duration=3_000_000, steps=12, kinds=dict.fromkeys(names.TASK_KINDS, 1000),
                  summed=5000, critical_path=2_500_000, waterfall_calls=5, late_calls=2,
                  orphan_tokens=40)
    fields.update(over)
    return tasks.TaskSummary(**fields)  # type: ignore[arg-type]


def task_lines(rec: Recorder) -> list[str]:
    return sorted(line for line in Renderer(rec).render().decode().splitlines()
                  if line.startswith(("llm_client_task", "llm_client_finish")))


def test_task_families_reach_the_aggregator_exactly() -> None:
    single, workers = Recorder(), [Recorder(), Recorder()]
    for i in range(10):
        s = summary(f"t{i % 3}", steps=i, orphan_tokens=i * 7)
        single.record_task(s)
        workers[i % 2].record_task(s)
        t = CallTimeline(start=0, model="m", provider="p", route="r", end=MS,
                         finish_reason="max_tokens", max_tokens=64, output_tokens=64)
        single.record_call(t)
        workers[i % 2].record_call(t)
    target = Recorder()
    agg = Aggregator(Config(), target)
    for w, rec in enumerate(workers):
        delta = take(rec)
        delta.worker, delta.seq = f"w{w}", 1
        assert agg.accept(wire.encode(delta, rec.schema.layouts()))[0] == 200
    assert task_lines(target) == task_lines(single)
    assert 'llm_client_task_orphan_tokens_total{task="t0"} 126.0' in task_lines(target)


def drained(rec: Recorder) -> dict:
    delta = take(rec)
    delta.worker = "w"
    return wire.payload(delta, rec.schema.layouts())


def test_a_push_with_an_unknown_deadline_or_counter_is_malformed() -> None:
    rec = Recorder()
    rec.record_task(summary())
    doc = drained(rec)
    doc["counters"][names.TASKS_TOTAL.name][0][0] = "sometime"  # deadline
    with pytest.raises(wire.PushError, match="unknown label value"):
        validate.from_payload(doc, rec.schema)
    doc["counters"] = {"llm_client_nope_total": []}
    with pytest.raises(wire.PushError, match="unknown counter"):
        validate.from_payload(doc, rec.schema)
    older = drained(Recorder())
    del older["counters"], older["layouts"]["count"]  # a push from before agent tasks
    rows = validate.from_payload(older, rec.schema).rows
    assert not any(rows.get(c.name) for c in names.COUNTERS if not c.wire)


def test_counter_rows_are_bounded_by_max_series() -> None:
    rec = Recorder(load({"labels": {"max_series": 3, "max_tasks": 1000}}))
    for i in range(10):
        rec.record_task(summary(f"t{i}", deadline=names.DEADLINE_NONE))
    rows = rec.counts().rows[names.TASKS_TOTAL.name]
    assert len(rows) == 4 and rows[("none", "ok", names.OTHER_TENANT)] == 7


def test_a_task_ending_under_the_recorders_lock_is_recorded_when_it_is_released() -> None:
    """A task can end inside a garbage-collector finaliser on the thread holding the lock."""
    rec = Recorder()
    assert rec._acquire()
    try:
        rec.record_task(summary("deferred"))  # would deadlock if it waited for the lock
        assert not rec.rows[names.TASKS_TOTAL.name]
    finally:
        rec._release()
    assert rec.rows[names.TASKS_TOTAL.name] == {
        (names.DEADLINE_EXCEEDED, names.OK, "deferred"): 1}
