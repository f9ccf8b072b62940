"""The call timeline: monotonic stamps of one LLM call, and the metrics derived from it.

The shim and the manual API only stamp (`time.perf_counter_ns()`) and count; every metric of
docs/metrics.md is derived here by pure functions, once per call, so the per-chunk path stays a stamp
and an append and the definitions live in one place. A stamp the client could not see stays
None, and every quantity that needs it is then *not* derived (never a made-up zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .. import names

NS_PER_US = 1000


@dataclass(slots=True)
class CallTimeline:
    """Everything observed about one call. Stamps are `perf_counter_ns()` values."""

    start: int
    model: str = ""
    provider: str = ""
    route: str = ""
    tenant: str = ""
    dispatched: int | None = None
    connected: int | None = None
    sent: int | None = None
    headers: int | None = None
    first_byte: int | None = None
    first_token: int | None = None
    first_answer_token: int | None = None
    end: int | None = None
    #: Stamp of every token event (content, reasoning and tool-call deltas), in order.
    token_times: list[int] = field(default_factory=list)
    reasoning_events: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    outcome: str | None = None
    trace_id: str | None = None
    #: The upstream the call reached: resolved "address:port", region header, the response's
    #: system fingerprint (None where the client could not see it).
    upstream_address: str | None = None
    upstream_region: str | None = None
    fingerprint: str | None = None
    #: The request's max_tokens (max_completion_tokens, max_output_tokens), when it set one.
    max_tokens: int | None = None
    #: The provider's own stop reason as it reported it (`length`, `end_turn`, ...).
    finish_reason: str | None = None
    #: ns of the server phase (sent -> headers) the provider did not spend itself by its own
    #: account (`openai-processing-ms`): the network round trip. None when it does not say.
    round_trip: int | None = None
    #: The server's own account of its time before the first token, in ns, where its response
    #: carries one (vLLM's per-request `metrics`, llama.cpp's `timings`): the time the request
    #: waited in its queue, and from scheduling (or prompt processing) to the first token.
    server_queue: int | None = None
    server_prefill: int | None = None
    #: Stamp of the final attempt's start, for a call the client retried (its earlier attempts
    #: failed): the retry phase ends and the queue phase starts there. None: one attempt.
    attempt_start: int | None = None
    #: The attempts that failed and were retried, by what ended them (names.RETRY_REASONS).
    retries: dict[str, int] | None = None

    def token(self, now: int, kind: str = names.CONTENT) -> None:
        """Note one token event at `now`: a stamp and a counter, nothing more."""
        self.token_times.append(now)
        if self.first_token is None:
            self.first_token = now
        if kind == names.REASONING:
            self.reasoning_events += 1
        elif self.first_answer_token is None:
            self.first_answer_token = now

    @property
    def last_token(self) -> int | None:
        return self.token_times[-1] if self.token_times else None


_new_object = object.__new__


def new_timeline(start: int, model: str, provider: str, route: str, tenant: str
                 ) -> CallTimeline:
    """`CallTimeline(start=..., model=..., provider=..., route=..., tenant=...)`, every other
    field at its default: what a call's start builds, without the dataclass `__init__`'s
    keyword parsing and 22 parameters (~2/3 of its instructions; one per SDK call).
    tests/test_timeline.py checks it against the dataclass for every field."""
    t = _new_object(CallTimeline)
    t.start = start
    t.model = model
    t.provider = provider
    t.route = route
    t.tenant = tenant
    t.dispatched = t.connected = t.sent = t.headers = t.first_byte = t.first_token = \
        t.first_answer_token = t.end = t.input_tokens = t.output_tokens = \
        t.cached_input_tokens = t.reasoning_output_tokens = t.outcome = t.trace_id = \
        t.upstream_address = t.upstream_region = t.fingerprint = t.max_tokens = \
        t.finish_reason = t.round_trip = t.server_queue = t.server_prefill = \
        t.attempt_start = t.retries = None
    t.token_times = []
    t.reasoning_events = 0
    return t


class Derived(NamedTuple):
    """Per-call values in microseconds (times) or tokens; None where not derivable.

    A per-call histogram family names its field (`names.Family.per_call`): the recorder
    records each family's value from that field, so adding one is a Family and a field here.
    """

    ttft: int | None
    first_answer: int | None
    tpot: int | None
    stall: int | None
    duration: int | None
    input_tokens: int | None
    output_tokens: int | None
    cached_input_tokens: int | None
    max_tokens: int | None
    max_tokens_headroom: int | None
    phases: dict[str, int]
    gaps: list[int]
    #: The server's own queue and prefill (µs), where it reported them.
    server_queue: int | None
    server_prefill: int | None
    #: A streamed call's time to first token less the server's queue and prefill (µs, at
    #: least 0): the client's queue, the network, any gateway, the server's HTTP layer.
    outside_server: int | None


def _span(a: int | None, b: int | None) -> int | None:
    """b - a in microseconds, or None when a stamp is missing or out of order."""
    if a is None or b is None or b < a:
        return None
    return (b - a) // NS_PER_US


#: The phases between two consecutive stamps of the call, in order (the attempt's start,
#: dispatched, connected, sent, headers, first token); `phases` reads them in one loop.
_STAMPED_PHASES = names.PHASES[1:6]


def gaps_us(token_times: list[int]) -> list[int]:
    """Inter-token gaps in microseconds: each gap between consecutive token events."""
    return [(b - a) // NS_PER_US for a, b in zip(token_times, token_times[1:])]


def phases(t: CallTimeline) -> dict[str, int]:
    """The phases (docs/metrics.md) that both stamps of the call make known.

    `retry` is recorded only for calls that retried (`queue` is then the final attempt's),
    `reasoning` only for calls that emitted reasoning tokens, and `decode` only once an answer
    token arrived: a call without reasoning has no reasoning phase, not a zero one.
    """
    out: dict[str, int] = {}
    a = t.attempt_start
    if a is None:
        a = t.start
    else:
        start = t.start
        if start is not None and a >= start:
            out["retry"] = (a - start) // NS_PER_US
    for name, b in zip(_STAMPED_PHASES, (t.dispatched, t.connected, t.sent, t.headers,
                                         t.first_token)):
        if a is not None and b is not None and b >= a:
            out[name] = (b - a) // NS_PER_US
        a = b
    answer = t.first_answer_token
    if answer is not None:
        if t.reasoning_events:
            value = _span(t.first_token, answer)
            if value is not None:
                out["reasoning"] = value
        times = t.token_times
        if times and times[-1] >= answer:
            out["decode"] = (times[-1] - answer) // NS_PER_US
    return out


def derive_in_python(t: CallTimeline) -> Derived:
    """Every histogram value of one finished call: the definition, and `derive` where the
    optional C part (_hotrecord.c, the same arithmetic without a Python frame) is not built."""
    times = t.token_times
    events = len(times)
    gaps = gaps_us(times) if events > 1 else []
    first = t.first_token
    last = times[-1] if times else None
    output = t.output_tokens if t.output_tokens else events
    tpot = None
    if first is not None and last is not None and output >= 2 and last > first:
        tpot = (last - first) // NS_PER_US // (output - 1)
    start = t.start
    end = t.end
    answer = t.first_answer_token
    max_tokens = t.max_tokens
    headroom = None
    if max_tokens is not None and t.output_tokens is not None:
        headroom = max(0, max_tokens - t.output_tokens)
    ttft = (first - start) // NS_PER_US if first is not None and start is not None \
        and first >= start else None
    queue = None if t.server_queue is None else t.server_queue // NS_PER_US
    prefill = None if t.server_prefill is None else t.server_prefill // NS_PER_US
    outside = None
    # streamed only: a non-streamed call's first token arrives with the whole body
    if events and ttft is not None and prefill is not None:
        outside = max(0, ttft - (queue or 0) - prefill)
    # built without the namedtuple's Python-level __new__ (its fields, in order)
    return _new_tuple(Derived, (
        ttft,
        (answer - start) // NS_PER_US if answer is not None
        and start is not None and answer >= start else None,
        tpot,
        max(gaps) if gaps else None,
        (end - start) // NS_PER_US if end is not None and start is not None
        and end >= start else None,
        t.input_tokens,
        t.output_tokens,
        t.cached_input_tokens,
        max_tokens,
        headroom,
        phases(t),
        gaps,
        queue,
        prefill,
        outside,
    ))


_new_tuple = tuple.__new__

try:
    from ._hotrecord import bind as _bind_c
    from ._hotrecord import derive as _derive_in_c

    _bind_c(Derived, derive_in_python, names.PHASES)
except (ImportError, ValueError):  # built without a compiler (or from other fields): Python
    derive = derive_in_python
else:
    derive = _derive_in_c

