"""A call that ends while the recorder's lock is held is recorded: by its own thread once the
holder releases, or (held by the ending thread itself: a garbage-collector finaliser) when that
thread releases it. Never lost until another call comes, never a deadlock."""

from __future__ import annotations

import threading

import exporter
from exporter._internal import names, runtime
from exporter._internal.record.timeline import CallTimeline


def test_a_call_ending_while_another_thread_holds_the_lock_waits_and_is_recorded():
    recorder = runtime.state().recorder
    held, release, ended = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with recorder.held:  # a scrape, say, holding the lock
            held.set()
            release.wait(10)

    def caller():
        with exporter.track(model="m", route="r") as call:
            call.token()
        ended.set()

    threads = [threading.Thread(target=holder), threading.Thread(target=caller)]
    threads[0].start()
    assert held.wait(10)
    threads[1].start()
    assert not ended.wait(0.2)  # it waits for the lock (it is not queued and forgotten)
    release.set()
    for thread in threads:
        thread.join(10)
    assert ended.is_set()
    body = runtime.state().renderer.render().decode()
    assert ('llm_client_requests_total{model="m",outcome="ok",provider="unknown",route="r",'
            'tenant="unknown"} 1.0') in body
    assert 'llm_client_requests_in_flight{model="m",provider="unknown",route="r"} 0.0' in body


def test_a_call_recorded_inside_the_lock_holders_own_thread_is_recorded_on_release():
    recorder = runtime.state().recorder
    key = recorder.started("m", "p", "r")
    t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="t")
    t.token(1000)
    t.end, t.outcome = 2000, names.OK
    with recorder.held:  # as a finaliser run during this thread's own locked section would
        recorder.record_call(t, key)
        assert len(recorder._deferred) == 1 and not recorder.rows[names.REQUESTS_TOTAL]
    counters = recorder.counts()  # recorded on release: no other call needed
    assert counters.rows[names.REQUESTS_TOTAL] == {("m", names.OK, "p", "r", "t"): 1}
    assert counters.rows[names.REQUESTS_IN_FLIGHT] == {("m", "p", "r"): 0}
