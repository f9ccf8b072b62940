"""Derived metrics over synthetic timelines (stamps in ns; derived values in us), by both
`derive`s: the C one (_hotrecord.c, which `make test` builds) and the Python definition."""

import dataclasses

import pytest

from exporter._internal import names
from exporter._internal.record import timeline as timeline_module
from exporter._internal.record.timeline import CallTimeline, derive_in_python, new_timeline, \
    phases
from tests.support.c_parts import built_in_c

#: The C derive, or None where _hotrecord.c is not built.
DERIVE_IN_C = None if timeline_module.derive is derive_in_python else timeline_module.derive


@pytest.fixture(params=["c", "python"])
def derive(request):
    if request.param == "python":
        return derive_in_python
    if not built_in_c("_hotrecord.derive", DERIVE_IN_C is not None):
        pytest.skip("no C compiler here: the package runs the Python derive")
    return DERIVE_IN_C


MS = 1_000_000  # ns


def timeline(**stamps_ms):
    t = CallTimeline(start=0)
    for key, ms in stamps_ms.items():
        setattr(t, key, int(ms * MS))
    return t


def test_full_stream_with_reasoning(derive):
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


def test_single_token_stream(derive):
    t = timeline()
    t.token(50 * MS)
    t.end = 60 * MS
    d = derive(t)
    assert d.ttft == 50_000 and d.first_answer == 50_000
    assert d.gaps == [] and d.stall is None and d.tpot is None


def test_zero_tokens_error_call(derive):
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


def test_reasoning_only_stream_has_no_answer(derive):
    t = timeline()
    t.token(10 * MS, "reasoning")
    t.token(20 * MS, "reasoning")
    d = derive(t)
    assert d.first_answer is None and "decode" not in d.phases and "reasoning" not in d.phases
    assert d.ttft == 10_000


def test_tpot_uses_usage_count_over_event_count(derive):
    t = timeline()
    t.token(100 * MS)
    t.token(200 * MS)  # one event may carry several tokens
    t.output_tokens = 11
    assert derive(t).tpot == 10_000


def test_the_servers_own_queue_and_prefill_and_what_lies_outside_them(derive):
    # a stream whose server says it queued 40 ms and took 150 ms to its first token, which
    # reached the client 230 ms after the call: 40 ms of it outside the server
    t = timeline(server_queue=40, server_prefill=150)
    t.token(230 * MS)
    t.token(260 * MS)
    d = derive(t)
    assert (d.server_queue, d.server_prefill, d.outside_server) == (40_000, 150_000, 40_000)
    t.server_queue = None  # llama.cpp reports no queue: it is outside its account
    assert derive(t).outside_server == 80_000
    t.server_prefill = 300 * MS  # more than the client saw (coarse server clocks): 0
    assert derive(t)[12:] == (None, 300_000, 0)
    unreported = timeline()
    unreported.token(230 * MS)
    assert derive(unreported)[12:] == (None, None, None)


def test_a_non_streamed_call_has_no_part_outside_the_server(derive):
    # its first token is the whole body: the server's decode is in its ttft
    t = timeline(first_token=900, first_answer_token=900, end=900, server_queue=40,
                 server_prefill=150)
    d = derive(t)
    assert d.ttft == 900_000 and (d.server_queue, d.server_prefill) == (40_000, 150_000)
    assert d.outside_server is None


def test_a_retried_call_has_a_retry_phase_and_the_final_attempts_queue(derive):
    # two attempts failed (900 ms of them and the SDK's backoff); the third left at once
    t = timeline(attempt_start=900, dispatched=902, connected=910, sent=911, headers=1000)
    t.token(1100 * MS)
    t.token(1150 * MS)
    t.end = 1200 * MS
    d = derive(t)
    assert list(d.phases.items()) == [
        ("retry", 900_000), ("queue", 2000), ("connect", 8000), ("send", 1000),
        ("server", 89_000), ("prefill", 100_000), ("decode", 50_000)]
    # the user waited through the retries: TTFT and duration still count from the call's start
    assert (d.ttft, d.first_answer, d.duration) == (1_100_000, 1_100_000, 1_200_000)


def test_a_call_that_did_not_retry_has_no_retry_phase(derive):
    t = timeline(dispatched=2, connected=2, sent=3, headers=50)
    assert "retry" not in derive(t).phases and derive(t).phases["queue"] == 2000
    # an attempt start before the call's (a caller's own stamps): no retry phase, the queue
    # still from the attempt's start
    t = timeline(dispatched=2)
    t.start, t.attempt_start = 5 * MS, 1 * MS
    assert derive(t).phases == {"queue": 1000}


def test_out_of_order_stamps_are_not_derived():
    t = timeline(sent=10, headers=5)
    assert "server" not in phases(t)



def test_new_timeline_is_the_dataclass_with_its_defaults(derive):
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


def _outcome(function, t: CallTimeline):
    """What `function(t)` gives: each field with its type (an int is not a bool or a float),
    the phases in their order; or the exception's type."""
    try:
        d = function(t)
    except Exception as exc:  # noqa: BLE001 - the very exception is what is compared
        return type(exc)
    return (type(d), [(type(value), value) for value in d[:10] + d[12:]],
            list(d.phases.items()), d.gaps)


def test_c_derive_is_the_python_definition_for_any_timeline():
    # every field, stamps in and out of order or missing, and input no call should carry
    # (negative, huge, bool and float values, a stamp list that is not a list): the C derive
    # answers as the Python definition does, raising where it raises
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    if not built_in_c("_hotrecord.derive", DERIVE_IN_C is not None):
        pytest.skip("no C compiler here: the package runs the Python derive")
    base = 10**12
    # stamps on a coarse grid (equal stamps are common) or anywhere, ns apart (floor division)
    on_grid = st.integers(-2, 12).map(lambda k: base + k * 1_000_000)
    anywhere = st.integers(base - 10**9, base + 10**10)
    stamp = st.one_of(st.none(), on_grid, on_grid, anywhere,
                      st.sampled_from([0, -1, -1001, 2**62 - 1, 2**62, -2**62, 2**63, 2**70,
                                       True, base + 0.5]))
    count = st.one_of(st.none(), st.integers(-3, 5), st.integers(0, 10**6),
                      st.sampled_from([2**62 - 1, 2**62, -2**62, 2**63, True, False, 2.0, "7"]))
    times = st.one_of(st.lists(on_grid, max_size=8).map(sorted),
                      st.lists(st.one_of(on_grid, anywhere), max_size=8).map(sorted),
                      st.lists(st.one_of(on_grid, anywhere), max_size=8),
                      st.lists(st.sampled_from([base, -1001, 2**62, 2**63, base + 0.5, True]),
                               max_size=3),
                      st.just((base, base + 10)))
    fields = ("start", "dispatched", "connected", "sent", "headers", "first_token",
              "first_answer_token", "end", "attempt_start")

    # the server's own queue and prefill (ns): none, plausible, or anything
    server = st.one_of(st.none(), st.integers(0, 10**10), count)

    @settings(max_examples=3000, deadline=None, derandomize=True)
    @given(st.tuples(*(stamp for _ in fields)), times, st.tuples(count, count, count, count),
           st.one_of(st.integers(0, 3), st.sampled_from([None, -1, 2**64])),
           st.tuples(server, server))
    def check(stamps, token_times, counts, reasoning_events, server_account):
        t = CallTimeline(start=0, token_times=token_times, reasoning_events=reasoning_events)
        for name, value in zip(fields, stamps):
            setattr(t, name, value)
        (t.input_tokens, t.output_tokens, t.cached_input_tokens, t.max_tokens) = counts
        t.server_queue, t.server_prefill = server_account
        assert _outcome(DERIVE_IN_C, t) == _outcome(derive_in_python, t)

    check()
