"""Derived metrics over synthetic timelines (stamps in ns; derived values in us)."""

import dataclasses

import pytest

from exporter._internal import names
from exporter._internal.record.timeline import CallTimeline, derive, new_timeline, phases

MS = 1_000_000  # ns


def timeline(**stamps_ms):
    t = CallTimeline(start=0)
    for key, ms in stamps_ms.items():
        setattr(t, key, int(ms * MS))
    return t


def test_full_stream_with_reasoning():
    t = timeline(dispatched=2, connected=12, sent=13, headers=113)
    # framing events (role-only delta, usage chunk) are not token events: only tokens are noted
    for ms, kind in ((300, "reasoning"), (320, "reasoning"), (900, "content"), (930, "content"),
                     (2930, "tool")):
        t.token(ms * MS, kind)
    t.end = 3000 * MS
    t.output_tokens = 5
    d = derive(t)
    assert d.ttft == 300_000
    assert d.first_answer == 900_000
    assert d.gaps == [20_000, 580_000, 30_000, 2_000_000]
    assert d.stall == 2_000_000
    assert d.tpot == (2930 - 300) * 1000 // 4
    assert d.duration == 3_000_000
    assert d.phases == {"queue": 2000, "connect": 10_000, "send": 1000, "server": 100_000,
                        "prefill": 187_000, "reasoning": 600_000, "decode": 2_030_000}


def test_no_reasoning_means_no_reasoning_phase_not_zero():
    t = timeline(headers=100)
    t.token(150 * MS)
    t.token(160 * MS)
    assert "reasoning" not in phases(t)
    assert phases(t)["decode"] == 10_000


def test_single_token_stream():
    t = timeline()
    t.token(50 * MS)
    t.end = 60 * MS
    d = derive(t)
    assert d.ttft == 50_000 and d.first_answer == 50_000
    assert d.gaps == [] and d.stall is None and d.tpot is None


def test_zero_tokens_error_call():
    t = timeline(sent=1, headers=40)
    t.end = 41 * MS
    d = derive(t)
    assert d.ttft is None and d.first_answer is None and d.stall is None and d.tpot is None
    assert d.duration == 41_000
    assert d.phases == {"server": 39_000}


def test_missing_stamps_give_no_phase():
    # dispatched and sent known, connected unknown: neither connect nor send is derivable
    t = timeline(dispatched=1, sent=5, headers=9)
    assert phases(t) == {"queue": 1000, "server": 4000}


def test_reasoning_only_stream_has_no_answer():
    t = timeline()
    t.token(10 * MS, "reasoning")
    t.token(20 * MS, "reasoning")
    d = derive(t)
    assert d.first_answer is None and "decode" not in d.phases and "reasoning" not in d.phases
    assert d.ttft == 10_000


def test_tpot_uses_usage_count_over_event_count():
    t = timeline()
    t.token(100 * MS)
    t.token(200 * MS)  # one event may carry several tokens
    t.output_tokens = 11
    assert derive(t).tpot == 10_000


def test_out_of_order_stamps_are_not_derived():
    t = timeline(sent=10, headers=5)
    assert "server" not in phases(t)



def test_new_timeline_is_the_dataclass_with_its_defaults():
    # every field (a new one too) as the dataclass __init__ sets it: the same values, a list
    # of its own per timeline
    fast = new_timeline(7, "m", "p", "r", "t")
    slow = CallTimeline(start=7, model="m", provider="p", route="r", tenant="t")
    for f in dataclasses.fields(CallTimeline):
        assert getattr(fast, f.name) == getattr(slow, f.name), f.name
    assert fast == slow
    assert fast.token_times is not new_timeline(7, "m", "p", "r", "t").token_times
    fast.token(10)
    assert derive(fast) == derive(CallTimeline(start=7, model="m", provider="p", route="r",
                                               tenant="t", token_times=[10], first_token=10,
                                               first_answer_token=10))
