"""What the demo provider answers: the token events of a response's plan.

Reasoning words, then answer words (or, for a tool call, arguments whose concatenation is valid
JSON), one token event each; the wire formats (wire_formats.py) render them per API.
"""

from __future__ import annotations

from .latency import Plan

_ANSWER = tuple(
    "Time to first token is what a user waits for before anything appears on the screen. "
    "It hides a queue, a prefill that grows with the prompt, a cache that may be cold, and a "
    "batch shared with other tenants. Measure each phase apart and the slow call explains "
    "itself.".split()
)
_THOUGHT = tuple(
    "The user asks about latency. First recall what the phases are, then check which one "
    "moved, then write a short answer that names it.".split()
)
_FIRST_TOOL_PIECE = '{"text": "'


def _words(text: tuple[str, ...], count: int) -> list[str]:
    """`count` word tokens, each but the first with its leading space, as BPE tokens have."""
    return [(" " if i else "") + text[i % len(text)] for i in range(count)]


def token_events(plan: Plan) -> list[tuple[str, str]]:
    """(kind, text) of every token event; kind is "reasoning", "content" or "tool"."""
    answer = _words(_ANSWER, plan.answer_tokens)
    if plan.tool_call and answer:
        # Arguments whose concatenation is valid JSON, one word per piece.
        answer[0] = _FIRST_TOOL_PIECE + answer[0]
        answer[-1] += '"}'
    answer_kind = "tool" if plan.tool_call else "content"
    return ([("reasoning", word) for word in _words(_THOUGHT, plan.reasoning_tokens)]
            + [(answer_kind, piece) for piece in answer])
