"""How inference engines report a call's own timings beside an OpenAI chat completion.

llama.cpp's server adds `timings` to every chat completion: `prompt_ms` for the `prompt_n`
prompt tokens it processed (`cache_n` more reused from its prompt cache), `predicted_ms` for
the `predicted_n` tokens it generated, and their rates. vLLM started with
`--enable-per-request-metrics` adds `metrics`: `queue_time_ms` (queued to scheduled),
`time_to_first_token_ms` (scheduled to the first token), `generation_time_ms` (first to last
token), `mean_itl_ms`, `tokens_per_second`. Both put theirs in the body of a non-streamed
response; in a stream llama.cpp puts `timings` on its last chunk, vLLM `metrics` on the final
usage chunk only (so only when the request asked for `include_usage`).

The demo provider measures its response as an engine measures its request (`Stamps`: when
it arrived, when its queue and server wait were over, its first and last token) and renders
those times in the engine's shape (`account`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .latency import Plan

LLAMA_CPP = "llama.cpp"
VLLM = "vllm"
ENGINES = (LLAMA_CPP, VLLM)


@dataclass
class Stamps:
    """time.monotonic() of one response's steps on the provider."""

    received: float
    scheduled: float
    first: float | None = None
    last: float | None = None

    def token(self) -> None:
        """A token event was produced now."""
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now


def _ms(a: float, b: float) -> float:
    return round((b - a) * 1000, 3)


def _rate(n: int, ms: float) -> float:
    return round(n * 1000 / ms, 3) if ms > 0 else 0.0


def llama_cpp_timings(stamps: Stamps, plan: Plan) -> dict[str, float | int]:
    """llama.cpp's `timings`: its prompt processing and its generation."""
    now = time.monotonic()
    first = stamps.first if stamps.first is not None else now
    last = stamps.last if stamps.last is not None else first
    processed = plan.input_tokens - plan.cached_tokens
    generated = plan.reasoning_tokens + plan.answer_tokens
    prompt_ms, predicted_ms = _ms(stamps.scheduled, first), _ms(first, last)
    return {
        "cache_n": plan.cached_tokens,
        "prompt_n": processed, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": round(prompt_ms / processed, 3) if processed else 0.0,
        "prompt_per_second": _rate(processed, prompt_ms),
        "predicted_n": generated, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": round(predicted_ms / generated, 3) if generated else 0.0,
        "predicted_per_second": _rate(generated, predicted_ms),
    }


def vllm_metrics(stamps: Stamps, plan: Plan) -> dict[str, float | None]:
    """vLLM's per-request `metrics` (None where its timestamps are not there: no token)."""
    generated = plan.reasoning_tokens + plan.answer_tokens
    first, last = stamps.first, stamps.last
    if first is None or last is None:
        return {"time_to_first_token_ms": None, "generation_time_ms": None,
                "queue_time_ms": _ms(stamps.received, stamps.scheduled), "mean_itl_ms": None,
                "tokens_per_second": None}
    generation = _ms(first, last)
    return {
        "time_to_first_token_ms": _ms(stamps.scheduled, first),
        "generation_time_ms": generation,
        "queue_time_ms": _ms(stamps.received, stamps.scheduled),
        "mean_itl_ms": round(generation / (generated - 1), 3) if generated > 1 else None,
        "tokens_per_second": _rate(generated, _ms(stamps.scheduled, last)),
    }


def account(engine: str | None, stamps: Stamps, plan: Plan) -> dict[str, dict]:
    """The field `engine` adds to its response (`{}` for none)."""
    if engine == LLAMA_CPP:
        return {"timings": llama_cpp_timings(stamps, plan)}
    if engine == VLLM:
        return {"metrics": vllm_metrics(stamps, plan)}
    return {}
