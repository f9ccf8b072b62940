"""exporter.track() and exporter.labels(): values, nesting, async, threads, never raising."""

import asyncio
import contextvars
import threading
import time

import pytest

import exporter
from exporter._internal import names, runtime


def series(family, **labels):
    """The series' histogram with every pending value folded in, or None."""
    rec = runtime.state().recorder
    state = rec.families[family.name]
    want = tuple(labels[n] for n in state.label_names)
    return next((h for s, h in rec.folded_copies(state) if s.values == want), None)


def total_count(family):
    rec = runtime.state().recorder
    return sum(h.count for _, h in rec.folded_copies(rec.families[family.name]))


def test_track_records_every_family():
    with exporter.labels(route="search", tenant="acme"):
        with exporter.track(model="llama", provider="vllm") as call:
            call.sent()
            call.headers()
            time.sleep(0.01)
            call.token("reasoning")
            time.sleep(0.01)
            call.token()
            call.token("tool")
            call.usage(input=100, output=3, cached=64)
    s = series(names.TTFT, model="llama", provider="vllm", route="search", tenant="acme")
    assert s.count == 1 and 10_000 <= s.total < 100_000
    assert series(names.ITL, model="llama", provider="vllm", route="search").count == 2
    assert series(names.CACHED_INPUT_TOKENS, model="llama", provider="vllm",
                  route="search").total == 64
    for phase in ("server", "prefill", "reasoning", "decode"):
        assert series(names.PHASE_FAMILY, model="llama", provider="vllm", route="search",
                      phase=phase) is not None, phase
    for phase in ("queue", "connect", "send"):  # their stamps were never marked: not recorded
        assert series(names.PHASE_FAMILY, model="llama", provider="vllm", route="search",
                      phase=phase) is None, phase
    rec = runtime.state().recorder
    assert rec.rows[names.REQUESTS_TOTAL][("llama", "ok", "vllm", "search", "acme")] == 1
    assert rec.rows[names.REQUESTS_IN_FLIGHT][("llama", "vllm", "search")] == 0


def test_labels_nest_and_restore():
    with exporter.labels(route="outer", tenant="t1"):
        with exporter.labels(tenant="t2"):
            with exporter.track(model="m") as call:
                pass
            assert (call.timeline.route, call.timeline.tenant) == ("outer", "t2")
        with exporter.track(model="m") as call:
            pass
        assert call.timeline.tenant == "t1"
    with exporter.track(model="m") as call:
        pass
    assert (call.timeline.route, call.timeline.tenant) == (names.UNKNOWN, "")


def test_exceptions_pass_through_and_set_outcome():
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with exporter.track(model="m", route="r") as call:
            call.token()
            raise Boom()
    assert call.timeline.outcome == names.ERROR
    with exporter.track(model="m", route="r") as call:
        call.abandon()
    assert call.timeline.outcome == names.ABANDONED


async def test_async_track_cancel_and_task_context():
    async def one(tenant):
        async with exporter.labels(tenant=tenant):
            await asyncio.sleep(0)
            async with exporter.track(model="m", route="r") as call:
                await asyncio.sleep(0.001)
                call.token()
            return call.timeline.tenant

    with exporter.labels(route="r"):
        tenants = await asyncio.gather(*(one(f"t{i}") for i in range(20)))
    assert tenants == [f"t{i}" for i in range(20)]

    inside = asyncio.Event()

    async def cancelled():
        async with exporter.track(model="m", route="r") as call:
            cancelled.call = call
            inside.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(cancelled())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.call.timeline.outcome == names.CANCELLED


def test_labels_follow_a_handed_context_into_a_thread():
    seen = []

    def work():
        with exporter.track(model="m") as call:
            pass
        seen.append(call.timeline.tenant)

    with exporter.labels(tenant="acme"):
        ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(work,))
    thread.start()
    thread.join()
    assert seen == ["acme"]


def test_bad_input_is_counted_not_raised():
    with exporter.track(model=None, provider=12345) as call:  # type: ignore[arg-type]
        call.token(kind="weird")  # unknown kinds count as answer tokens
        call.usage(input=-5, output="x", cached=None)  # type: ignore[arg-type]
    rec = runtime.state().recorder
    row = (names.UNKNOWN, "ok", "12345", names.UNKNOWN, names.UNKNOWN)
    assert rec.rows[names.REQUESTS_TOTAL][row] == 1
    assert rec.counts().value(names.DROPPED, names.DROP_BAD_LABEL) >= 2
    assert call.timeline.input_tokens is None


def test_internal_failure_is_a_counted_drop(monkeypatch):
    rec = runtime.state().recorder
    monkeypatch.setattr(rec, "_record_locked", lambda *a: 1 / 0)
    with exporter.track(model="m") as call:
        call.token()
    assert rec.counts().value(names.DROPPED, names.DROP_INTERNAL) == 1


def test_series_ceiling_drops_and_counts():
    runtime.configure({"labels": {"max_series": 3}})
    for i in range(10):
        with exporter.track(model=f"m{i}", route="r") as call:
            call.token()
    rec = runtime.state().recorder
    assert rec.series_count == 3
    assert rec.counts().value(names.DROPPED, names.DROP_SERIES_LIMIT) > 0


def test_no_count_lost_under_threads_and_tasks():
    threads, per_thread, tasks = 8, 250, 200

    def worker(i):
        with exporter.labels(route="r", tenant=f"t{i}"):
            for _ in range(per_thread):
                with exporter.track(model="m") as call:
                    call.token()
                    call.token()

    async def async_calls():
        async def one(i):
            async with exporter.track(model="m", route="r", tenant=f"a{i % 7}") as call:
                await asyncio.sleep(0)
                call.token()
                await asyncio.sleep(0)
                call.token()
        await asyncio.gather(*(one(i) for i in range(tasks)))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    asyncio.run(async_calls())
    for t in pool:
        t.join()
    rec = runtime.state().recorder
    assert total_count(names.TTFT) == threads * per_thread + tasks
    assert total_count(names.ITL) == threads * per_thread + tasks
    assert sum(rec.rows[names.REQUESTS_TOTAL].values()) == threads * per_thread + tasks
    assert all(v == 0 for v in rec.rows[names.REQUESTS_IN_FLIGHT].values())


def test_a_forked_child_records_even_if_a_thread_held_the_lock_at_fork():
    import os
    import signal

    rec = runtime.state().recorder
    held, release = threading.Event(), threading.Event()

    def holder():
        with rec._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: the holder thread does not exist here
        signal.alarm(5)  # a deadlock would end the child with SIGALRM
        ok = False
        try:
            with exporter.track(model="m", route="r") as call:
                call.token()
            ok = runtime.state().recorder.rows[names.REQUESTS_TOTAL][("m", "ok", names.UNKNOWN, "r",
                                                    names.UNKNOWN)] == 1
        finally:
            os._exit(0 if ok else 1)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
