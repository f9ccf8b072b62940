"""The openai SDK patch: Chat Completions and Responses, sync and async, streamed or not.

Hooks (all at class level, so clients created before `instrument()` are measured too):
`SyncAPIClient.request` / `AsyncAPIClient.request` (every call, helpers and raw responses
included), `BaseClient._build_request` (httpx trace extension), `Stream.__stream__` /
`AsyncStream.__stream__` (the token wrapper) and the `create`/`parse` methods of
`chat.completions` and `responses` (the `start` stamp). `chat.completions.stream()` and
`responses.stream()` call `create`, so they are covered. See hooks.py for the mechanics.

Token events (docs/metrics.md): a chat chunk is a token when a choice's delta carries `content`,
`refusal`, tool-call or function-call `arguments` (kind tool), an audio transcript, or
`reasoning_content` / `reasoning` (kind reasoning; vLLM, DeepSeek and other OpenAI-compatible
servers). Role-only, empty and usage-only chunks are framing. A Responses event is a token when
it is one of the `*.delta` events in `RESPONSES_KINDS` with a non-empty delta; every other event
(`response.created`, `response.in_progress`, `*.added`, `*.done`, ...) is framing.

Usage: input = `prompt_tokens` / `input_tokens` (OpenAI counts include cached tokens), cached =
`prompt_tokens_details.cached_tokens` / `input_tokens_details.cached_tokens`.

Upstream: a chat completion (and each chunk) names its serving configuration in
`system_fingerprint`; a Response has no such field (its fingerprint stays unknown).

The server's own timings: vLLM (`metrics`) and llama.cpp (`timings`) add them to a chat
completion (`server_account`): its queue and prefill, beside the client's phases.
"""

from __future__ import annotations

from typing import Any, Callable

from ..names import CONTENT, REASONING, TOOL
from .hooks import SDK, client_hooks, start_hook
from .providers import ClientProvider
from .sdk_call import HOT_CHAT, HOT_RESPONSES, Endpoint, SdkCall, field


# --- Chat Completions -----------------------------------------------------------------------------
def chat_classify(chunk: Any, call: SdkCall) -> str | None:
    choices = chunk.choices
    if choices:
        choice = choices[0]
        delta = getattr(choice, "delta", None)
        if delta is not None and delta.content and not getattr(choice, "finish_reason", None):
            return CONTENT
        return _chat_other(choices, call)  # also the last text that carries the finish reason
    return None  # usage-only chunk


def _chat_other(choices: Any, call: SdkCall | None = None) -> str | None:
    """Every case but the common one (text in the first choice): tools, reasoning, n > 1."""
    found = None
    for choice in choices:
        reason = getattr(choice, "finish_reason", None)
        if call is not None and reason:
            call.complete = True
            call.response(finish_reason=reason)
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        if delta.content or getattr(delta, "refusal", None):
            return CONTENT
        for tool_call in getattr(delta, "tool_calls", None) or ():
            function = getattr(tool_call, "function", None)
            if function is not None and getattr(function, "arguments", None):
                return TOOL
        function = getattr(delta, "function_call", None)
        if function is not None and getattr(function, "arguments", None):
            return TOOL
        audio = getattr(delta, "audio", None)
        if audio is not None and getattr(audio, "transcript", None):
            return CONTENT
        extra = getattr(delta, "__pydantic_extra__", None)
        if extra and (extra.get("reasoning_content") or extra.get("reasoning")):
            found = REASONING
    return found


def chat_usage(obj: Any, call: SdkCall) -> None:
    """Usage, model and id of a ChatCompletion, the last chunk of a stream, or a JSON body
    (whose choices also say why each one stopped; a stream's were seen chunk by chunk)."""
    usage = None if obj is None or isinstance(obj, dict) else getattr(obj, "usage", None)
    if obj is not None and not isinstance(obj, dict) and not isinstance(usage, dict):
        # The SDK's objects (every call but `with_raw_response`): their declared fields read
        # directly, no `field()` call per value (this runs once per call, ~2 µs less).
        if usage is not None:
            details = getattr(usage, "prompt_tokens_details", None)  # (most often None)
            reasoning = getattr(usage, "completion_tokens_details", None)
            call.usage(getattr(usage, "prompt_tokens", None),
                       getattr(usage, "completion_tokens", None),
                       None if details is None else getattr(details, "cached_tokens", None),
                       getattr(obj, "model", None),
                       None if reasoning is None else getattr(reasoning, "reasoning_tokens",
                                                              None))
        else:
            call.usage(model=getattr(obj, "model", None))
        call.upstream(fingerprint=getattr(obj, "system_fingerprint", None))
        extra = getattr(obj, "__pydantic_extra__", None)  # (fields the SDK does not declare)
        if extra:
            server_account(call, extra.get("timings"), extra.get("metrics"))
        if call._attributes:  # only the span and the GenAI metrics read the id
            call.response(id=getattr(obj, "id", None))
        if not call.streaming:
            for choice in getattr(obj, "choices", None) or ():
                call.response(finish_reason=getattr(choice, "finish_reason", None))
        return
    usage = field(obj, "usage")
    call.usage(input=field(usage, "prompt_tokens"), output=field(usage, "completion_tokens"),
               cached=field(usage, "prompt_tokens_details", "cached_tokens"),
               reasoning=field(usage, "completion_tokens_details", "reasoning_tokens"),
               model=field(obj, "model"))
    call.response(id=field(obj, "id"))
    call.upstream(fingerprint=field(obj, "system_fingerprint"))
    server_account(call, field(obj, "timings"), field(obj, "metrics"))
    if not call.streaming:
        for choice in field(obj, "choices") or ():
            call.response(finish_reason=field(choice, "finish_reason"))


def server_account(call: SdkCall, timings: Any, metrics: Any) -> None:
    """The server's own account of the call, where an OpenAI-compatible engine adds one to a
    chat completion (to the body, or to a stream's last chunk): vLLM's per-request `metrics`
    (`--enable-per-request-metrics`: `queue_time_ms`, and `time_to_first_token_ms` counted
    from scheduling) and llama.cpp's `timings` (`prompt_ms` for the `prompt_n` prompt tokens
    it processed, `cache_n` reused from its cache, `predicted_n` generated). llama.cpp's
    counts stand in for the usage where it said none (a stream without `include_usage`)."""
    if metrics is not None:
        call.server_timing(field(metrics, "queue_time_ms"),
                           field(metrics, "time_to_first_token_ms"))
    if timings is not None:
        call.server_timing(prefill_ms=field(timings, "prompt_ms"))
        t = call.timeline
        cached, processed = field(timings, "cache_n"), field(timings, "prompt_n")
        counted = type(cached) is int and type(processed) is int and min(cached, processed) >= 0
        call.usage(input=cached + processed if counted and t.input_tokens is None else None,
                   output=field(timings, "predicted_n") if t.output_tokens is None else None,
                   cached=cached if t.cached_input_tokens is None else None)


# --- Responses ------------------------------------------------------------------------------------
RESPONSES_KINDS = {
    "response.output_text.delta": CONTENT,
    "response.refusal.delta": CONTENT,
    "response.audio.transcript.delta": CONTENT,
    "response.function_call_arguments.delta": TOOL,
    "response.custom_tool_call_input.delta": TOOL,
    "response.mcp_call_arguments.delta": TOOL,
    "response.code_interpreter_call_code.delta": TOOL,
    "response.shell_call_command.delta": TOOL,
    "response.reasoning_summary_text.delta": REASONING,
    "response.reasoning_text.delta": REASONING,
}


_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def responses_classify(event: Any, call: SdkCall) -> str | None:
    kind = RESPONSES_KINDS.get(event.type)
    if kind is not None:
        return kind if getattr(event, "delta", None) else None
    if call is not None and event.type in _RESPONSE_ENDS:
        call.complete = True
    return None


def responses_final(last: Any, call: SdkCall) -> None:
    """`response.completed` (or `.incomplete` / `.failed`) carries the final response."""
    response = field(last, "response")
    if response is not None:
        responses_usage(response, call)


def responses_usage(obj: Any, call: SdkCall) -> None:
    """Usage, model, id and end of a Response: its finish reason is why it is incomplete
    (`max_output_tokens`, `content_filter`), else its status (`completed`, `failed`)."""
    usage = field(obj, "usage")
    call.usage(input=field(usage, "input_tokens"), output=field(usage, "output_tokens"),
               cached=field(usage, "input_tokens_details", "cached_tokens"),
               reasoning=field(usage, "output_tokens_details", "reasoning_tokens"),
               model=field(obj, "model"))
    call.response(id=field(obj, "id"), finish_reason=field(
        obj, "incomplete_details", "reason") or field(obj, "status"))


ENDPOINTS = {
    "/chat/completions": Endpoint(chat_classify, chat_usage, chat_usage, HOT_CHAT),
    "/responses": Endpoint(responses_classify, responses_final, responses_usage, HOT_RESPONSES),
}

#: azure.ai.openai for the Azure clients, else from the base URL host (api.openai.com ->
#: openai).
provider = ClientProvider("openai", (("azure", "azure.ai.openai"),))
SDK_SPEC = SDK("openai", ENDPOINTS, provider)


def targets() -> dict[str, Callable[[Any], list[tuple[type, str, Any]]]]:
    """Each module holding hooked classes -> its hooks once imported: (class, attribute,
    make_replacement(original)). instrument() patches a module when the app imports it."""
    return {
        "openai._base_client": client_hooks(SDK_SPEC),
        "openai.resources.chat.completions.completions":
            lambda module: _start_hooks(module.Completions, module.AsyncCompletions),
        "openai.resources.responses.responses":
            lambda module: _start_hooks(module.Responses, module.AsyncResponses),
    }


def _start_hooks(sync_cls: type, async_cls: type) -> list[tuple[type, str, Any]]:
    out: list[tuple[type, str, Any]] = []
    for method in ("create", "parse"):
        out.append((sync_cls, method, lambda f: start_hook(f, is_async=False)))
        out.append((async_cls, method, lambda f: start_hook(f, is_async=True)))
    return out
