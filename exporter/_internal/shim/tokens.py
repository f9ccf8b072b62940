"""The stream wrappers: the per-chunk path of a streamed SDK call.

The SDK's stream object iterates a generator (`Stream.__stream__`); the hook (hooks.py) wraps
it with `sync_tokens` / `async_tokens`, which stamp each event and yield the very same object,
so the stream keeps its type, its `with` protocol and its methods.

`sync_tokens` has two loops. Until the first answer token, every event goes through the
endpoint's full `classify` (framing, reasoning, first tokens). After it, the hot loop checks the
common case of the endpoint's wire format inline (a non-empty text delta: no function call) and
falls back to `classify` for anything else; per event that is a `perf_counter_ns()`, a few
attribute reads, a list append and our generator's resume. Any internal failure is a counted
drop and the rest of the stream passes through unmeasured.

`async_tokens` has no loop of its own: it appends each event of the async stream to a list that
a `sync_tokens` generator iterates (a list iterator follows appends), so one body stamps both
protocols. The hand-over is C-level, with no comparison of events (a pydantic `__eq__` costs
~600 ns): an append, one generator resume, and the slot cleared after it (8 bytes per event
stay until the stream ends; the event itself is not kept).
"""

from __future__ import annotations

import inspect
from time import perf_counter_ns
from typing import Any

from .sdk_call import HOT_ANTHROPIC, HOT_CHAT, HOT_RESPONSES, SdkCall

def sync_tokens(inner: Any, call: SdkCall) -> Any:
    """Yield every event of `inner` unchanged; stamp token events (docs/metrics.md)."""
    t = call.timeline
    append = t.token_times.append
    classify = call.endpoint.classify
    perf = perf_counter_ns
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
        chat, responses, anthropic = hot == HOT_CHAT, hot == HOT_RESPONSES, hot == HOT_ANTHROPIC
        if not broken:  # hot: after the first answer token
            for chunk in it:
                now = perf()
                try:  # the wire format's plain text delta, read inline
                    if chat:
                        choices = chunk.choices
                        text = choices and choices[0].delta.content
                    elif responses:
                        text = chunk.type == "response.output_text.delta" and chunk.delta
                    elif anthropic:
                        text = chunk.type == "content_block_delta" \
                            and chunk.delta.type == "text_delta" and chunk.delta.text
                    else:
                        text = None
                except Exception:  # an unexpected shape: the full classifier decides
                    text = None
                if text:
                    append(now)
                elif not _other(chunk, call, now):
                    broken = True
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
    stamped = sync_tokens(iter(events), call)
    try:
        async for chunk in inner:
            events.append(chunk)
            yield next(stamped)
            events[-1] = None
    except BaseException as exc:
        _failed(stamped, call, exc)
        raise
    next(stamped, None)  # the list iterator ends, so does the stream: `finish_stream`


def _failed(stamped: Any, call: SdkCall, exc: BaseException) -> None:
    """The async stream failed or was closed: end the call as `sync_tokens` does, through it
    once it runs (the caller's traceback is left as it was)."""
    if inspect.getgeneratorstate(stamped) != inspect.GEN_SUSPENDED:  # before the first event
        stamped.close()
        if isinstance(exc, GeneratorExit):
            call.end(None, abandoned=True)
        else:
            call.end(exc)
        return
    traceback = exc.__traceback__
    try:
        if isinstance(exc, GeneratorExit):
            stamped.close()
        else:
            stamped.throw(exc)
    except BaseException:  # `exc` itself, raised again by the caller
        pass
    exc.__traceback__ = traceback
