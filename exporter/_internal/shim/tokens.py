"""The stream wrappers: the per-chunk path of a streamed SDK call.

The SDK's stream object iterates a generator (`Stream.__stream__`); the hook (hooks.py) wraps
it with `sync_tokens` / `async_tokens`, which stamp each event and yield the very same object,
so the stream keeps its type, its `with` protocol and its methods.

`sync_tokens` has two phases. Until the first answer token, every event goes through the
endpoint's full `classify` (framing, reasoning, first tokens). After it, a loop of the
endpoint's wire format (chat, Responses, Anthropic, or the generic one) checks the common case
inline (a plain, non-empty text delta: no function call) and falls back to `classify` for
anything else; per event that is a `perf_counter_ns()`, one to three reads of the SDK's
objects, a list append and our generator's resume. Any internal failure is a counted drop and
the rest of the stream passes through unmeasured.

`async_tokens` has no loop of its own: it appends each event of the async stream to a list that
the sync loop (`stamped`) iterates (a list iterator follows appends), so one body stamps both
protocols. The hand-over is C-level, with no comparison of events (a pydantic `__eq__` costs
~600 ns): an append, one generator resume, and the slot cleared after it (8 bytes per event
stay until the stream ends; the event itself is not kept).

`stamped` is what the hook returns for a sync stream: the same loop as a C iterator
(`_hotloop.Stamper`, no Python frame per event) where the optional extension was built and the
stamps can come from the clock `perf_counter_ns()` reads, else `sync_tokens`. Both recognise the
same events with the same reads; tests/test_stream_hot_loop.py runs every case through both.
"""

from __future__ import annotations

import inspect
from time import perf_counter_ns
from typing import Any, Callable

from ..record.clock import PERF_COUNTER_IS_CLOCK_MONOTONIC
from .sdk_call import HOT_ANTHROPIC, HOT_CHAT, HOT_RESPONSES, SdkCall

#: The C loop (setup.py builds it where a compiler is found), or None. Its stamps are
#: CLOCK_MONOTONIC readings: used only where `perf_counter_ns()` reads that clock too.
Stamper: Any
try:
    from ._hotloop import Stamper
except ImportError:  # built without a compiler: sync_tokens runs the loop
    Stamper = None
if not PERF_COUNTER_IS_CLOCK_MONOTONIC:
    Stamper = None

#: What `Stamper` asks of its cold callback after each event before the first answer token.
STAY_COLD, GO_HOT, GO_PASS = range(3)

#: A pydantic model's fields, read from its instance `__dict__` through the descriptor itself:
#: no attribute lookup, so none of the two type-attribute-cache lookups (`__getattr__`,
#: `__getattribute__`) that pydantic's `__getattr__` hook adds to every attribute read. Those of
#: a chat chunk's `Choice` and `ChoiceDelta` (classes built back to back) share cache slots in
#: most processes and then evict each other on every chunk; reading the choice this way leaves
#: them nothing to evict (docs/performance.md).
try:
    from pydantic import BaseModel as _BaseModel

    _fields = _BaseModel.__dict__["__dict__"].__get__
except Exception:  # pragma: no cover - both SDKs depend on pydantic
    _fields = vars


def stamped(inner: Any, call: SdkCall) -> Any:
    """Every event of the sync `inner` unchanged, token events stamped: by the C loop where it
    is built, else by `sync_tokens`."""
    if Stamper is None:
        return sync_tokens(inner, call)
    t = call.timeline
    classify = call.endpoint.classify
    hot = call.endpoint.hot

    def cold(chunk: Any, now: int, first: bool) -> int:
        """`sync_tokens`' cold loop for one event: the full classification."""
        try:
            if first:
                t.first_byte = now
            kind = classify(chunk, call)
            if kind is not None:
                t.token(now, kind)
        except Exception:
            call.count_drop()
            return GO_PASS
        return STAY_COLD if t.first_answer_token is None else GO_HOT

    learn: Callable[[Any], Any] | None = (
        _anthropic_delta_event if hot == HOT_ANTHROPIC else
        _responses_text if hot == HOT_RESPONSES else None)
    return Stamper(iter(inner), t.token_times, cold, lambda chunk, now: _other(chunk, call, now),
                   learn, call.finish_stream, call.end,
                   lambda: call.end(None, abandoned=True), hot)


def sync_tokens(inner: Any, call: SdkCall) -> Any:
    """Yield every event of `inner` unchanged; stamp token events (docs/metrics.md)."""
    t = call.timeline
    append = t.token_times.append
    classify = call.endpoint.classify
    perf = perf_counter_ns
    fields = _fields
    last = None
    try:
        it = iter(inner)
        broken = False
        for chunk in it:  # cold: until the first answer token
            now = perf()
            try:
                if last is None:
                    t.first_byte = now
                last = chunk
                kind = classify(chunk, call)
                if kind is not None:
                    t.token(now, kind)
            except Exception:
                call.count_drop()
                broken = True
            yield chunk
            if broken or t.first_answer_token is not None:
                break
        hot = call.endpoint.hot
        # Hot: after the first answer token, one loop per wire format (no per-event branch on
        # the format). Each recognises its plain text delta with the fewest reads of the SDK's
        # pydantic objects (each read ~75-250 ns, docs/performance.md) and sends anything
        # else, or anything that raises, to the full classifier.
        if broken:
            pass  # an internal failure: the rest passes through below
        elif hot == HOT_CHAT:
            for chunk in it:
                now = perf()
                try:  # the first choice through its `__dict__` (see `_fields`)
                    choices = chunk.choices
                    if choices:
                        first = fields(choices[0])
                        text = first["finish_reason"] is None and first["delta"].content
                    else:
                        text = None
                except Exception:
                    text = None
                if text:
                    append(now)
                elif not _other(chunk, call, now):
                    broken = True
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_ANTHROPIC:
            # The class of a `content_block_delta` event, learnt from the stream: the SDK builds
            # an event's class from its `type` (an unknown type gets the union's first class,
            # `message_start`'s), so the class stands for the event's `type` read. Not for the
            # delta's: an unknown delta type is built as the first delta class, `TextDelta`.
            event_cls = _anthropic_delta_event(last)
            for chunk in it:
                now = perf()
                try:
                    if type(chunk) is event_cls:
                        delta = chunk.delta
                        text = delta.type == "text_delta" and delta.text
                    else:
                        text = None
                except Exception:
                    text = None
                if text:
                    append(now)
                else:
                    if event_cls is None:
                        event_cls = _anthropic_delta_event(chunk)
                    if not _other(chunk, call, now):
                        broken = True
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_RESPONSES:
            # As above, the class of a `response.output_text.delta` event stands for its `type`
            # (an unknown type gets the union's first class, `response.audio.delta`'s).
            event_cls = _responses_text(last)
            for chunk in it:
                now = perf()
                try:
                    text = type(chunk) is event_cls and chunk.delta
                except Exception:
                    text = None
                if text:
                    append(now)
                else:
                    if event_cls is None:
                        event_cls = _responses_text(chunk)
                    if not _other(chunk, call, now):
                        broken = True
                last = chunk
                yield chunk
                if broken:
                    break
        else:
            for chunk in it:
                now = perf()
                broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        for chunk in it:  # only after an internal failure: pass the rest through
            last = chunk
            yield chunk
    except GeneratorExit:  # closed or garbage-collected before its end
        call.end(None, abandoned=True)
        raise
    except BaseException as exc:
        call.end(exc)
        raise
    call.finish_stream(last)


def _anthropic_delta_event(event: Any) -> Any:
    """The class of `event` when it is a `content_block_delta`, else None. Never raises."""
    try:
        if event.type == "content_block_delta":
            return type(event)
    except Exception:
        pass
    return None


def _responses_text(event: Any) -> Any:
    """The class of `event` when it is a `response.output_text.delta`, else None. Never
    raises."""
    try:
        if event.type == "response.output_text.delta":
            return type(event)
    except Exception:
        pass
    return None


def _other(chunk: Any, call: SdkCall, now: int) -> bool:
    """Classify an event after the first answer token; False after an internal failure."""
    try:
        kind = call.endpoint.classify(chunk, call)
        if kind is not None:
            call.timeline.token(now, kind)
        return True
    except Exception:
        call.count_drop()
        return False


async def async_tokens(inner: Any, call: SdkCall) -> Any:
    """Yield every event of the async `inner` unchanged, stamped by a `sync_tokens` body."""
    events: list[Any] = []
    stamper = stamped(iter(events), call)
    try:
        async for chunk in inner:
            events.append(chunk)
            yield next(stamper)
            events[-1] = None
    except BaseException as exc:
        _failed(stamper, call, exc)
        raise
    next(stamper, None)  # the list iterator ends, so does the stream: `finish_stream`


def _failed(stamper: Any, call: SdkCall, exc: BaseException) -> None:
    """The async stream failed or was closed: end the call as `sync_tokens` does, through it
    once it runs (the caller's traceback is left as it was). The C loop is ended directly
    (what its `fail` and `abandon` would do; its finaliser then finds the call ended)."""
    if not inspect.isgenerator(stamper) or \
            inspect.getgeneratorstate(stamper) != inspect.GEN_SUSPENDED:  # before the first event
        if inspect.isgenerator(stamper):
            stamper.close()
        if isinstance(exc, GeneratorExit):
            call.end(None, abandoned=True)
        else:
            call.end(exc)
        return
    traceback = exc.__traceback__
    try:
        if isinstance(exc, GeneratorExit):
            stamper.close()
        else:
            stamper.throw(exc)
    except BaseException:  # `exc` itself, raised again by the caller
        pass
    exc.__traceback__ = traceback
