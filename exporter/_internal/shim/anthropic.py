"""The anthropic SDK patch: Messages (and beta Messages), sync and async, streamed or not.

Same hooks as the openai patch (see openai.py and hooks.py): the client's `request()`,
`_build_request()`, `Stream.__stream__` / `AsyncStream.__stream__`, and `messages.create` for
the `start` stamp. `messages.stream(...)` posts through `request()` when its context manager is
entered, so it is measured from there.

Token events (docs/metrics.md): `content_block_delta` with a non-empty `text_delta` (content),
`thinking_delta` (reasoning) or `input_json_delta` (tool arguments). `message_start`,
`content_block_start`, `content_block_stop`, `signature_delta`, `citations_delta`,
`message_delta`, `message_stop` are framing (`ping` never reaches us: the SDK drops it).

Usage: Anthropic's `input_tokens` excludes the prompt-cache reads and writes. To keep
`llm_client_input_tokens` the total prompt size for every provider (OpenAI's count includes
cached tokens), input = `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`
and cached = `cache_read_input_tokens` (the span's cache write: `cache_creation_input_tokens`).
Streamed usage is spread over `message_start` (input, cache) and `message_delta` (cumulative
output; newer servers repeat the input counts there).

Upstream: a Message carries no fingerprint of its serving configuration (no field like
OpenAI's `system_fingerprint`), and the headers Anthropic documents on every response
(`request-id`, `anthropic-organization-id`) name the request and the account, not the upstream:
an Anthropic call's upstream is its address and region, its fingerprint `unknown`.
"""

from __future__ import annotations

from typing import Any, Callable

from ..names import ATTR_CACHE_WRITE_TOKENS, CONTENT, REASONING, TOOL
from .hooks import SDK, client_hooks, start_hook
from .providers import ClientProvider
from .sdk_call import HOT_ANTHROPIC, Endpoint, SdkCall, field

_USAGE_FIELDS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                 "output_tokens")


def classify(event: Any, call: SdkCall) -> str | None:
    kind = event.type
    if kind == "content_block_delta":
        delta = event.delta
        dtype = delta.type
        if dtype == "text_delta":
            return CONTENT if delta.text else None
        if dtype == "thinking_delta":
            return REASONING if delta.thinking else None
        if dtype == "input_json_delta":
            return TOOL if delta.partial_json else None
        return None  # signature_delta, citations_delta
    if kind == "message_start":
        message = event.message
        _note(call, field(message, "usage"), field(message, "model"))
        call.response(id=field(message, "id"))
    elif kind == "message_delta":
        _note(call, field(event, "usage"), None)
        call.response(finish_reason=field(event, "delta", "stop_reason"))
    elif kind == "message_stop":
        call.complete = True
    return None


def _note(call: SdkCall, usage: Any, model: Any) -> None:
    seen = call.usage_seen
    if seen is None:
        seen = call.usage_seen = {}
    for name in _USAGE_FIELDS:
        value = field(usage, name)
        if isinstance(value, int):
            seen[name] = value
    if isinstance(model, str) and model:
        seen["model"] = model


def final(last: Any, call: SdkCall) -> None:
    seen = call.usage_seen
    if seen:
        _record(call, seen)


def body_usage(message: Any, call: SdkCall) -> None:
    usage = field(message, "usage")
    seen = {name: field(usage, name) for name in _USAGE_FIELDS}
    seen["model"] = field(message, "model")
    _record(call, seen)
    call.response(id=field(message, "id"), finish_reason=field(message, "stop_reason"))


def _record(call: SdkCall, seen: dict[str, Any]) -> None:
    parts = [seen.get(name) for name in _USAGE_FIELDS[:3]]
    total = None
    if isinstance(parts[0], int):
        total = sum(p for p in parts if isinstance(p, int))
    call.usage(input=total, output=seen.get("output_tokens"),
                  cached=seen.get("cache_read_input_tokens"), model=seen.get("model"))
    written = seen.get("cache_creation_input_tokens")
    if call._attributes and type(written) is int and written >= 0:  # only the span reads it
        call.span_attributes[ATTR_CACHE_WRITE_TOKENS] = written


ENDPOINTS = {"/v1/messages": Endpoint(classify, final, body_usage, HOT_ANTHROPIC)}

#: aws.bedrock / gcp.vertex_ai / azure.ai.inference for those clients, else from the base
#: URL host.
provider = ClientProvider("anthropic", (
    ("bedrock", "aws.bedrock"), ("aws", "aws.bedrock"), ("vertex", "gcp.vertex_ai"),
    ("googlecloud", "gcp.vertex_ai"), ("foundry", "azure.ai.inference"),
    ("azure", "azure.ai.inference")))
SDK_SPEC = SDK("anthropic", ENDPOINTS, provider)


def targets() -> dict[str, Callable[[Any], list[tuple[type, str, Any]]]]:
    """Each module holding hooked classes -> its hooks once imported: (class, attribute,
    make_replacement(original)). instrument() patches a module when the app imports it."""
    return {
        "anthropic._base_client": client_hooks(SDK_SPEC),
        "anthropic.resources.messages.messages": _create_hooks,
        "anthropic.resources.beta.messages.messages": _create_hooks,
    }


def _create_hooks(module: Any) -> list[tuple[type, str, Any]]:
    return [(module.Messages, "create", lambda f: start_hook(f, is_async=False)),
            (module.AsyncMessages, "create", lambda f: start_hook(f, is_async=True))]
