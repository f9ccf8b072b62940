"""The stream wrappers: the per-chunk path of a streamed SDK call.

The SDK's stream object iterates a generator (`Stream.__stream__`); the hook (hooks.py) wraps
it with `sync_tokens` / `async_tokens`, which stamp each event and yield the very same object,
so the stream keeps its type, its `with` protocol and its methods.

Each wrapper has two loops. Until the first answer token, every event goes through the
endpoint's full `classify` (framing, reasoning, first tokens). After it, a loop specialised per
wire format checks the common case inline (a non-empty text delta: no function call) and falls
back to `classify` for anything else; per event that is a `perf_counter_ns()`, a few attribute
reads, a list append and our generator's resume. Any internal failure is a counted drop and the
rest of the stream passes through unmeasured. The async wrapper is the sync one's twin: a
generator cannot be shared between the two protocols without a call per chunk, which is the
cost these loops exist to avoid, so keep the two in step.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from .sdk_call import HOT_ANTHROPIC, HOT_CHAT, HOT_GENERIC, HOT_RESPONSES, SdkCall


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
        hot = HOT_GENERIC if broken else call.endpoint.hot
        if hot == HOT_CHAT:
            for chunk in it:
                now = perf()
                try:
                    choices = chunk.choices
                    if choices and choices[0].delta.content:
                        append(now)
                    elif not _other(chunk, call, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_RESPONSES:
            for chunk in it:
                now = perf()
                try:
                    if chunk.type == "response.output_text.delta" and chunk.delta:
                        append(now)
                    elif not _other(chunk, call, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_ANTHROPIC:
            for chunk in it:
                now = perf()
                try:
                    if chunk.type == "content_block_delta" and chunk.delta.type == "text_delta" \
                            and chunk.delta.text:
                        append(now)
                    elif not _other(chunk, call, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif not broken:
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
    """The async twin of `sync_tokens` (keep the two in step)."""
    t = call.timeline
    append = t.token_times.append
    classify = call.endpoint.classify
    perf = perf_counter_ns
    last = None
    try:
        it = inner.__aiter__()
        broken = False
        async for chunk in it:
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
        hot = HOT_GENERIC if broken else call.endpoint.hot
        if hot == HOT_CHAT:
            async for chunk in it:
                now = perf()
                try:
                    choices = chunk.choices
                    if choices and choices[0].delta.content:
                        append(now)
                    elif not _other(chunk, call, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_RESPONSES:
            async for chunk in it:
                now = perf()
                try:
                    if chunk.type == "response.output_text.delta" and chunk.delta:
                        append(now)
                    elif not _other(chunk, call, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif hot == HOT_ANTHROPIC:
            async for chunk in it:
                now = perf()
                try:
                    if chunk.type == "content_block_delta" and chunk.delta.type == "text_delta" \
                            and chunk.delta.text:
                        append(now)
                    elif not _other(chunk, call, now):
                        broken = True
                except Exception:  # an unexpected shape: the full classifier decides
                    broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        elif not broken:
            async for chunk in it:
                now = perf()
                broken = not _other(chunk, call, now)
                last = chunk
                yield chunk
                if broken:
                    break
        async for chunk in it:
            last = chunk
            yield chunk
    except GeneratorExit:
        call.end(None, abandoned=True)
        raise
    except BaseException as exc:
        call.end(exc)
        raise
    call.finish_stream(last)
