"""Faults around fork(): a call in flight in another thread of the parent, a lock held by one."""

from __future__ import annotations

import os
import signal
import threading

import exporter
from exporter._internal import names, runtime


def test_calls_in_flight_in_the_parents_other_threads_do_not_stay_in_flight_in_a_child():
    inside, leave = threading.Event(), threading.Event()

    def long_call():
        with exporter.track(model="m", route="r"):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=long_call)
    thread.start()
    assert inside.wait(10)
    assert sum(runtime.state().recorder.counts().rows[names.REQUESTS_IN_FLIGHT].values()) == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the thread with the call does not exist here
        signal.alarm(5)
        try:
            counters = runtime.state().recorder.counts()
            with exporter.track(model="m", route="r") as call:  # a call of the child's own
                call.token()
            after = runtime.state().recorder.counts()
            before = counters.rows[names.REQUESTS_IN_FLIGHT]
            ok = sum(before.values()) == 0 and \
                sum(after.rows[names.REQUESTS_IN_FLIGHT].values()) == 0
            os.write(write, b"ok" if ok else repr(before).encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1000)
    os.waitpid(pid, 0)
    leave.set()
    thread.join()
    assert answer == b"ok", answer
    in_flight = runtime.state().recorder.counts().rows[names.REQUESTS_IN_FLIGHT]
    assert sum(in_flight.values()) == 0  # the parent's ended
