"""How each API renders the same token events: its SSE stream, its JSON body, its errors.

Three wire formats: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages. The
provider decides what a response does (a `Plan`, made into token events by answers.py); a wire
format only says how that looks on the wire, so every API gives the same answer token for token.

Usage follows each provider's convention: OpenAI's input counts include cached tokens,
Anthropic's `input_tokens` excludes `cache_read_input_tokens`; output counts include reasoning.
An answer cut at the request's output limit ends as each API says so: `finish_reason: length`,
a `response.incomplete` with reason `max_output_tokens`, `stop_reason: max_tokens`. The OpenAI
formats report the provider's own time before the headers in `openai-processing-ms`, as OpenAI
does. A chat completion can carry an engine's own timings, as llama.cpp and vLLM add them
(engines.py).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from ..names import PROCESSING_HEADER
from . import engines
from .latency import Plan

#: The chat completions' `system_fingerprint`: one fleet configuration behind both regions.
FINGERPRINT = "fp_demo_1"


@dataclass(frozen=True)
class Call:
    """One parsed request: what a wire format needs to render its response."""

    model: str
    stream: bool
    include_usage: bool
    tool_name: str | None
    plan: Plan
    #: When the provider started on the request (time.monotonic()): its processing clock.
    received: float = 0.0
    #: The chat completion's `system_fingerprint` (null where None).
    fingerprint: str | None = FINGERPRINT
    #: The engine whose own timings a chat completion carries (engines.py), if any.
    engine: str | None = None


class WireFormat:
    """One API's wire format. Subclasses render the same token events their own way.

    A response is a sequence of blocks (reasoning, then content or tool arguments); the base
    class tracks which block is open so subclasses only say how a block opens, grows, closes.
    """

    request_id_header: ClassVar[str] = "x-request-id"
    #: Header reporting the provider's own processing time in ms (None: the API has none).
    processing_header: ClassVar[str | None] = None
    #: Request keys that may hold the output limit, in order of precedence.
    max_tokens_keys: ClassVar[tuple[str, ...]] = ("max_tokens",)

    def __init__(self, call: Call) -> None:
        self.call = call
        self.plan = call.plan
        self.id = uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.text = {"reasoning": "", "content": "", "tool": ""}
        answer_kind = "tool" if self.plan.tool_call else "content"
        self.kinds = ["reasoning", answer_kind] if self.plan.reasoning_tokens else [answer_kind]
        self.kind = self.kinds[0]
        #: Its steps as an engine times them: made once the provider's wait is over.
        self.stamps = engines.Stamps(call.received, time.monotonic())

    # Request side.
    @staticmethod
    def tool_name(body: dict[str, Any]) -> str | None:
        raise NotImplementedError

    @staticmethod
    def include_usage(body: dict[str, Any]) -> bool:
        return False

    @classmethod
    def max_tokens(cls, body: dict[str, Any]) -> int | None:
        """The request's output limit, if it set one (ValueError when it is not a number)."""
        for key in cls.max_tokens_keys:
            if body.get(key) is not None:
                return int(body[key])
        return None

    @staticmethod
    def error_body(status: int, message: str) -> dict[str, Any]:
        raise NotImplementedError

    # Response side, streamed.
    def opening(self) -> bytes:
        """Framing sent right after the headers, before any token (and before the prefill)."""
        return self._start() + self._open(self.kind)

    def token(self, kind: str, text: str) -> bytes:
        out = self._switch(kind) + self._delta(kind, text)
        self.record(kind, text)
        return out

    def closing(self) -> bytes:
        return self._switch(self.kinds[-1]) + self._close(self.kind) + self._finish()

    # Response side, not streamed.
    def record(self, kind: str, text: str) -> None:
        self.text[kind] += text
        self.stamps.token()

    def body(self) -> dict[str, Any]:
        raise NotImplementedError

    def _switch(self, kind: str) -> bytes:
        if kind == self.kind:
            return b""
        out = self._close(self.kind) + self._open(kind)
        self.kind = kind
        return out

    def _start(self) -> bytes:
        raise NotImplementedError

    def _open(self, kind: str) -> bytes:
        return b""

    def _delta(self, kind: str, text: str) -> bytes:
        raise NotImplementedError

    def _close(self, kind: str) -> bytes:
        return b""

    def _finish(self) -> bytes:
        raise NotImplementedError


def _data(payload: dict[str, Any]) -> bytes:
    """One SSE `data:` line and its blank line."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _event(name: str, payload: dict[str, Any]) -> bytes:
    """One named SSE event (`event:` then `data:`)."""
    return f"event: {name}\n".encode() + _data(payload)


_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    503: ("server_error", "overloaded"),
}


def _openai_error(status: int, message: str) -> dict[str, Any]:
    default = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
    kind, code = _OPENAI_ERRORS.get(status, default)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class ChatCompletions(WireFormat):
    """OpenAI Chat Completions: one `data:` chunk per token, then `[DONE]`."""

    processing_header = PROCESSING_HEADER
    max_tokens_keys = ("max_completion_tokens", "max_tokens")

    @staticmethod
    def tool_name(body: dict[str, Any]) -> str | None:
        tools = body.get("tools") or []
        return tools[0]["function"]["name"] if tools else None

    @staticmethod
    def include_usage(body: dict[str, Any]) -> bool:
        return bool((body.get("stream_options") or {}).get("include_usage"))

    error_body = staticmethod(_openai_error)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-{self.id}", "object": "chat.completion.chunk",
            "created": self.created, "model": self.call.model,
            "system_fingerprint": self.call.fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.call.include_usage:
            chunk["usage"] = None
        return _data({**chunk, **extra})

    def _start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def _delta(self, kind: str, text: str) -> bytes:
        if kind == "reasoning":
            return self._chunk({"reasoning_content": text})
        if kind == "content":
            return self._chunk({"content": text})
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        if not self.text["tool"]:
            call.update(id=f"call_{self.id}", type="function")
            call["function"]["name"] = self.call.tool_name
        return self._chunk({"tool_calls": [call]})

    def _finish(self) -> bytes:
        """The finish chunk, the usage chunk when asked for, `[DONE]`. An engine's own timings
        go on the last chunk (llama.cpp) or on the usage chunk only (vLLM)."""
        account = engines.account(self.call.engine, self.stamps, self.plan)
        last = {} if self.call.include_usage or self.call.engine != engines.LLAMA_CPP \
            else account
        out = self._chunk({}, finish=self._finish_reason(), **last)
        if self.call.include_usage:
            out += _data({
                "id": f"chatcmpl-{self.id}", "object": "chat.completion.chunk",
                "created": self.created, "model": self.call.model,
                "system_fingerprint": self.call.fingerprint,
                "choices": [], "usage": self._usage(), **account,
            })
        return out + b"data: [DONE]\n\n"

    def _finish_reason(self) -> str:
        if self.plan.truncated:
            return "length"
        return "tool_calls" if self.plan.tool_call else "stop"

    def _usage(self) -> dict[str, Any]:
        plan = self.plan
        output = plan.reasoning_tokens + plan.answer_tokens
        return {
            "prompt_tokens": plan.input_tokens, "completion_tokens": output,
            "total_tokens": plan.input_tokens + output,
            "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
        }

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text["content"] or None,
                                   "refusal": None}
        if self.plan.reasoning_tokens:
            message["reasoning_content"] = self.text["reasoning"]
        if self.plan.tool_call:
            message["tool_calls"] = [{
                "id": f"call_{self.id}", "type": "function",
                "function": {"name": self.call.tool_name, "arguments": self.text["tool"]},
            }]
        return {
            "id": f"chatcmpl-{self.id}", "object": "chat.completion", "created": self.created,
            "model": self.call.model, "system_fingerprint": self.call.fingerprint,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": self._finish_reason()}],
            "usage": self._usage(), **engines.account(self.call.engine, self.stamps, self.plan),
        }


class Responses(WireFormat):
    """OpenAI Responses: typed, numbered events; one output item per block."""

    _ITEM_PREFIX: ClassVar[dict[str, str]] = {"reasoning": "rs", "content": "msg", "tool": "fc"}
    processing_header = PROCESSING_HEADER
    max_tokens_keys = ("max_output_tokens",)

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        self.sequence = 0
        self.index = -1
        self.done: list[dict[str, Any]] = []

    @staticmethod
    def tool_name(body: dict[str, Any]) -> str | None:
        tools = [tool for tool in body.get("tools") or [] if tool.get("type") == "function"]
        return tools[0]["name"] if tools else None

    error_body = staticmethod(_openai_error)

    def _emit(self, event_type: str, /, **fields: Any) -> bytes:
        payload = {"type": event_type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _event(event_type, payload)

    def _item_id(self, kind: str) -> str:
        return f"{self._ITEM_PREFIX[kind]}_{self.id}"

    def _item(self, kind: str, done: bool) -> dict[str, Any]:
        text = self.text[kind] if done else ""
        status = "completed" if done else "in_progress"
        if kind == "reasoning":
            summary = [{"type": "summary_text", "text": text}] if done else []
            return {"id": self._item_id(kind), "type": "reasoning", "summary": summary,
                    "status": status}
        if kind == "tool":
            return {"id": self._item_id(kind), "type": "function_call",
                    "call_id": f"call_{self.id}", "name": self.call.tool_name,
                    "arguments": text, "status": status}
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self._item_id(kind), "type": "message", "role": "assistant",
                "status": status, "content": content if done else []}

    def _response(self, output: list[dict[str, Any]], done: bool) -> dict[str, Any]:
        status, details = "in_progress", None
        if done:
            status = "incomplete" if self.plan.truncated else "completed"
            if self.plan.truncated:
                details = {"reason": "max_output_tokens"}
        return {
            "id": f"resp_{self.id}", "object": "response", "created_at": self.created,
            "status": status, "model": self.call.model,
            "output": output, "usage": self._usage() if done else None, "error": None,
            "incomplete_details": details, "instructions": None, "metadata": {},
            "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
            "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
        }

    def _usage(self) -> dict[str, Any]:
        plan = self.plan
        output = plan.reasoning_tokens + plan.answer_tokens
        return {
            "input_tokens": plan.input_tokens,
            "input_tokens_details": {"cached_tokens": plan.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
            "total_tokens": plan.input_tokens + output,
        }

    def _start(self) -> bytes:
        response = self._response([], done=False)
        return (self._emit("response.created", response=response)
                + self._emit("response.in_progress", response=response))

    def _open(self, kind: str) -> bytes:
        self.index += 1
        where = {"item_id": self._item_id(kind), "output_index": self.index}
        out = self._emit("response.output_item.added", output_index=self.index,
                         item=self._item(kind, done=False))
        if kind == "reasoning":
            out += self._emit("response.reasoning_summary_part.added", **where, summary_index=0,
                              part={"type": "summary_text", "text": ""})
        elif kind == "content":
            out += self._emit("response.content_part.added", **where, content_index=0,
                              part={"type": "output_text", "text": "", "annotations": []})
        return out

    def _delta(self, kind: str, text: str) -> bytes:
        where = {"item_id": self._item_id(kind), "output_index": self.index}
        if kind == "reasoning":
            return self._emit("response.reasoning_summary_text.delta", **where, summary_index=0,
                              delta=text)
        if kind == "tool":
            return self._emit("response.function_call_arguments.delta", **where, delta=text)
        return self._emit("response.output_text.delta", **where, content_index=0, delta=text,
                          logprobs=[])

    def _close(self, kind: str) -> bytes:
        text = self.text[kind]
        where = {"item_id": self._item_id(kind), "output_index": self.index}
        part: dict[str, Any]
        if kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            out = (self._emit("response.reasoning_summary_text.done", **where, summary_index=0,
                              text=text)
                   + self._emit("response.reasoning_summary_part.done", **where, summary_index=0,
                                part=part))
        elif kind == "tool":
            out = self._emit("response.function_call_arguments.done", **where, arguments=text,
                             name=self.call.tool_name)
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out = (self._emit("response.output_text.done", **where, content_index=0, text=text,
                              logprobs=[])
                   + self._emit("response.content_part.done", **where, content_index=0,
                                part=part))
        item = self._item(kind, done=True)
        self.done.append(item)
        return out + self._emit("response.output_item.done", output_index=self.index, item=item)

    def _finish(self) -> bytes:
        end = "response.incomplete" if self.plan.truncated else "response.completed"
        return self._emit(end, response=self._response(self.done, done=True))

    def body(self) -> dict[str, Any]:
        return self._response([self._item(kind, done=True) for kind in self.kinds], done=True)


_ANTHROPIC_ERRORS = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    529: "overloaded_error",
}


class Messages(WireFormat):
    """Anthropic Messages: content blocks (thinking, text or tool_use) between message events."""

    request_id_header = "request-id"

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        self.index = -1

    @staticmethod
    def tool_name(body: dict[str, Any]) -> str | None:
        tools = body.get("tools") or []
        return tools[0]["name"] if tools else None

    @staticmethod
    def error_body(status: int, message: str) -> dict[str, Any]:
        default = "api_error" if status >= 500 else "invalid_request_error"
        return {"type": "error",
                "error": {"type": _ANTHROPIC_ERRORS.get(status, default), "message": message}}

    def _block(self, kind: str, done: bool) -> dict[str, Any]:
        text = self.text[kind] if done else ""
        if kind == "reasoning":
            return {"type": "thinking", "thinking": text, "signature": self._signature(done)}
        if kind == "tool":
            return {"type": "tool_use", "id": f"toolu_{self.id}", "name": self.call.tool_name,
                    "input": json.loads(text) if text else {}}
        return {"type": "text", "text": text}

    def _signature(self, done: bool) -> str:
        return f"sig_{self.id}" if done else ""

    def _stop_reason(self) -> str:
        if self.plan.truncated:
            return "max_tokens"
        return "tool_use" if self.plan.tool_call else "end_turn"

    def _message(self, content: list[dict[str, Any]], done: bool) -> dict[str, Any]:
        plan = self.plan
        output = plan.reasoning_tokens + plan.answer_tokens
        return {
            "id": f"msg_{self.id}", "type": "message", "role": "assistant",
            "model": self.call.model, "content": content,
            "stop_reason": self._stop_reason() if done else None, "stop_sequence": None,
            "usage": {
                "input_tokens": plan.input_tokens - plan.cached_tokens,
                "cache_read_input_tokens": plan.cached_tokens,
                "cache_creation_input_tokens": 0,
                "output_tokens": output if done else 0,
            },
        }

    def opening(self) -> bytes:
        return super().opening() + _event("ping", {"type": "ping"})

    def _start(self) -> bytes:
        return _event("message_start",
                      {"type": "message_start", "message": self._message([], done=False)})

    def _open(self, kind: str) -> bytes:
        self.index += 1
        return _event("content_block_start", {"type": "content_block_start", "index": self.index,
                                              "content_block": self._block(kind, done=False)})

    def _delta(self, kind: str, text: str) -> bytes:
        if kind == "reasoning":
            delta = {"type": "thinking_delta", "thinking": text}
        elif kind == "tool":
            delta = {"type": "input_json_delta", "partial_json": text}
        else:
            delta = {"type": "text_delta", "text": text}
        return self._block_delta(delta)

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta",
                      {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self, kind: str) -> bytes:
        out = b""
        if kind == "reasoning":
            out = self._block_delta({"type": "signature_delta",
                                     "signature": self._signature(done=True)})
        return out + _event("content_block_stop",
                            {"type": "content_block_stop", "index": self.index})

    def _finish(self) -> bytes:
        output = self.plan.reasoning_tokens + self.plan.answer_tokens
        return (_event("message_delta", {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop_reason(), "stop_sequence": None},
                    "usage": {"output_tokens": output}})
                + _event("message_stop", {"type": "message_stop"}))

    def body(self) -> dict[str, Any]:
        return self._message([self._block(kind, done=True) for kind in self.kinds], done=True)
