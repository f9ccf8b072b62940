"""`python -m bench.engine.facts [--runs N]`: measure, on the real engine, the facts
docs/engine.md states, and print them as markdown.

What the engine answers (fields of streamed and non-streamed calls), how its slots and prompt
cache behave (which slot a call lands on, what evicts a prefix), how prefill time scales with
the prompt, and how one slot's work slows another's (continuous batching). Every figure is the
engine's own `timings` or a client-side stamp; nothing is modelled.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.engine import build, prompts
from bench.engine.client import Reply, chat, system_and_user
from bench.engine.server import LlamaServer, Options

_SELECTED = re.compile(r"id +(\d+) \| task -?\d+ \| selected slot by (LCP similarity|LRU|id)")


@contextmanager
def serving(engine: build.Engine, **options: Any) -> Iterator[LlamaServer]:
    with LlamaServer(engine.server, engine.model, Options(**options)) as server:
        yield server


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


# --- what the engine answers -------------------------------------------------------------------
def wire_fields(engine: build.Engine) -> list[str]:
    lines = ["| call | events | `usage` | `timings` | `system_fingerprint` | `model` (asked `any`) |",
             "| --- | --- | --- | --- | --- | --- |"]
    messages = system_and_user(prompts.text(engine.model, 300, 1))
    calls: list[tuple[str, dict[str, Any]]] = [
        ("non-streamed", {"stream": False}),
        ("streamed, no `stream_options`", {}),
        ("streamed, `include_usage: false`", {"stream_options": {"include_usage": False}}),
        ("streamed, `include_usage: true`", {"stream_options": {"include_usage": True}}),
    ]
    with serving(engine, parallel=1) as server:
        for name, body in calls:
            reply = chat(server.base_url, messages, max_tokens=4, ignore_eos=True, **body)
            usage_at = [i for i, e in enumerate(reply.events) if e.get("usage")]
            timings_at = [i for i, e in enumerate(reply.events) if "timings" in e]
            n = len(reply.events)

            def where(found: list[int]) -> str:
                if not found:
                    return "absent"
                return "the body" if n == 1 else f"event {found[-1] + 1} of {n}" + (
                    " (`choices: []`)" if not reply.events[found[-1]]["choices"] else "")

            usage = reply.events[usage_at[-1]]["usage"] if usage_at else None
            detail = f" `{usage}`" if usage and name.endswith("true`") else ""
            fingerprints = {e.get("system_fingerprint") for e in reply.events}
            models = {e.get("model") for e in reply.events}
            lines.append(f"| {name} | {n} | {where(usage_at)}{detail} | {where(timings_at)} | "
                         f"{', '.join(map(str, fingerprints))} | {', '.join(map(str, models))} |")
        timings = reply.timings()
        lines += ["", f"`timings` keys: {', '.join(f'`{k}`' for k in timings)}.",
                  f"Response headers: {reply.headers}."]
        cold = chat(server.base_url, system_and_user(prompts.text(engine.model, 2000, 2)),
                    max_tokens=1)
        lines.append(f"A streamed cold call of {cold.timings()['prompt_n']:,} prompt tokens: "
                     f"headers after {_fmt_ms(cold.headers_at)}, first token after "
                     f"{_fmt_ms(cold.ttft)}, `prompt_ms` {cold.timings()['prompt_ms']:,.0f}.")
    with LlamaServer(engine.alternate_server, engine.model, Options(parallel=1)) as other:
        alternate = chat(other.base_url, messages, stream=False, max_tokens=1).final
        lines.append(f"The alternate build answers `system_fingerprint: "
                     f"\"{alternate['system_fingerprint']}\"` (`/props` `build_info`: "
                     f"\"{other.props()['build_info']}\").")
    return lines


# --- slots and the prompt cache ----------------------------------------------------------------
def _last_slot(server: LlamaServer) -> str:
    found = _SELECTED.findall(server.log_tail(400))
    return f"{found[-1][0]} ({found[-1][1]})" if found else "?"


def slots_and_cache(engine: build.Engine) -> list[str]:
    texts = {name: prompts.text(engine.model, 1500, seed) for seed, name in enumerate("ABC")}
    sequence = "AABACABB"
    lines = []
    for ram, label in ((None, "default `--cache-ram` (8192 MiB)"), (0, "`--cache-ram 0`")):
        lines += ["", f"2 slots, {label}; three 1,500-token system prompts A, B, C:", "",
                  "| call | slot (how chosen) | cached tokens | prompt_ms |", "| --- | --- | --- | --- |"]
        with tempfile.TemporaryDirectory() as saved, \
                serving(engine, parallel=2, cache_ram_mib=ram, slot_save_path=saved) as server:

            def row(label: str, prompt: str, **body: Any) -> None:
                reply = chat(server.base_url, system_and_user(texts[prompt]), stream=False,
                             max_tokens=1, **body)
                t = reply.timings()
                lines.append(f"| {label} | {_last_slot(server)} | {t['cache_n']} | "
                             f"{t['prompt_ms']:.0f} |")

            for name in sequence:
                row(name, name)
            for slot in (0, 1):
                row(f"A, `id_slot: {slot}`", "A", id_slot=slot)
            for slot in (0, 1):
                server.erase_slot(slot)
            row("A, after `POST /slots/N?action=erase` of both slots", "A")
            server.restart()
            row("A, after a restart", "A")
    return lines


# --- prefill against prompt length -------------------------------------------------------------
def prefill_scaling(engine: build.Engine, runs: int) -> list[str]:
    lengths = (500, 2000, 8000)
    measured: dict[int, list[tuple[int, float, float]]] = {n: [] for n in lengths}
    with serving(engine, parallel=1, context=16384) as server:
        for run in range(runs):
            for n in lengths:  # interleaved: a load change touches every length alike
                reply = chat(server.base_url,
                             system_and_user(prompts.text(engine.model, n, 1000 * run + n)),
                             max_tokens=1)
                t = reply.timings()
                measured[n].append((t["prompt_n"], t["prompt_ms"] / 1000, reply.ttft))
    lines = [f"{runs} cold calls per length, interleaved; one slot, `--threads 1`:", "",
             "| prompt tokens | prefill (`prompt_ms`) min / median | per token min / median | "
             "TTFT at the client, median |", "| --- | --- | --- | --- |"]
    for n in lengths:
        tokens = measured[n][0][0]
        prefill = [m[1] for m in measured[n]]
        per_token = [m[1] / m[0] * 1000 for m in measured[n]]
        lines.append(f"| {tokens:,} | {_fmt_ms(min(prefill))} / "
                     f"{_fmt_ms(statistics.median(prefill))} | {min(per_token):.3f} / "
                     f"{statistics.median(per_token):.3f} ms | "
                     f"{_fmt_ms(statistics.median(m[2] for m in measured[n]))} |")
    return lines


# --- one slot's work against another's --------------------------------------------------------
def _gaps(reply: Reply) -> list[float]:
    times = reply.token_times
    return [b - a for a, b in zip(times, times[1:])]


class Streaming:
    """A streamed call on its own thread; `streamed(n)` waits until it has `n` tokens."""

    def __init__(self, base_url: str, messages: list[dict[str, str]], **body: Any):
        self.reply: Reply | None = None
        self._tokens = 0
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(base_url, messages, body))
        self._thread.start()

    def _run(self, base_url: str, messages: list[dict[str, str]], body: dict[str, Any]) -> None:
        try:
            self.reply = chat(base_url, messages, on_event=self._seen, **body)
        finally:
            with self._progress:
                self._tokens = -1  # done
                self._progress.notify_all()

    def _seen(self, reply: Reply) -> None:
        with self._progress:
            self._tokens = len(reply.token_times)
            self._progress.notify_all()

    def streamed(self, tokens: int) -> None:
        with self._progress:
            self._progress.wait_for(lambda: self._tokens >= tokens or self._tokens < 0, 120)

    def result(self) -> Reply:
        self._thread.join()
        assert self.reply is not None
        return self.reply


def batching(engine: build.Engine) -> list[str]:
    short = system_and_user(prompts.text(engine.model, 100, 7))
    long_prompt = system_and_user(prompts.text(engine.model, 7000, 8))
    lines = ["| victim (100-token prompt, 200 tokens streamed) | neighbour | victim median gap | "
             "victim largest gap | victim TTFT |", "| --- | --- | --- | --- | --- |"]

    def victim(server: LlamaServer) -> Reply:
        return chat(server.base_url, short, max_tokens=200, ignore_eos=True)

    def row(what: str, neighbour: str, reply: Reply) -> None:
        gaps = _gaps(reply)
        lines.append(f"| {what} | {neighbour} | {_fmt_ms(statistics.median(gaps))} | "
                     f"{_fmt_ms(max(gaps))} | {_fmt_ms(reply.ttft)} |")

    with serving(engine, parallel=2, context=16384, cache_prompt=False) as server:
        row("alone", "none", victim(server))
        neighbour = Streaming(server.base_url, short, max_tokens=1000, ignore_eos=True)
        neighbour.streamed(20)
        row("beside a decoding slot", "1,000 tokens of decode", victim(server))
        neighbour.result()
        victims = Streaming(server.base_url, short, max_tokens=1000, ignore_eos=True)
        victims.streamed(30)
        prefill = chat(server.base_url, long_prompt, max_tokens=1)
        row("1,000 tokens streamed while the neighbour arrives", f"a {prefill.timings()['prompt_n']:,}-token prompt "
            f"(prefill {prefill.timings()['prompt_ms']:,.0f} ms)", victims.result())
        neighbour = Streaming(server.base_url, long_prompt, max_tokens=1)
        time.sleep(0.2)  # the neighbour's prompt is in the batch
        row("arriving during the neighbour's prefill", "the same prompt", victim(server))
        neighbour.result()
    with serving(engine, parallel=1, context=8192, cache_prompt=False) as server:
        neighbour = Streaming(server.base_url, short, max_tokens=300, ignore_eos=True)
        neighbour.streamed(20)
        queued = Streaming(server.base_url, short, max_tokens=200, ignore_eos=True)
        time.sleep(0.05)
        deferred = server.metrics().get("llamacpp:requests_deferred", 0)
        first = neighbour.result()
        row("one slot only (`--parallel 1`): queued", "300 tokens of decode", queued.result())
        lines += ["", f"With one slot the victim waits in the queue until the neighbour's last "
                      f"token ({_fmt_ms(first.token_times[-1] - first.token_times[20])} after "
                      f"its 21st); `llamacpp:requests_deferred` read {deferred:.0f} meanwhile."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cold calls per prompt length")
    args = parser.parse_args()
    engine = build.installed()
    if engine is None:
        raise SystemExit("the engine is not built: make engine")
    print(f"Measured {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start; model {engine.model.name}.\n")
    for title, section in (("Fields", lambda: wire_fields(engine)),
                           ("Slots and the prompt cache", lambda: slots_and_cache(engine)),
                           ("Prefill against prompt length",
                            lambda: prefill_scaling(engine, args.runs)),
                           ("One slot's work against another's", lambda: batching(engine))):
        print(f"### {title}\n")
        print("\n".join(section()) + "\n", flush=True)
    print(f"Load average at the end: {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
