"""The smoke test of an installed ttft-exporter on one Python (`make pythons` runs it in a fresh
venv per Python, with the package installed as a user installs it).

With the interpreter of that venv, and only the installed package (never the checkout):

1. the optional C parts are built wherever a compiler and this Python's headers are found;
2. `ttft-exporter serve` (the aggregator) on a free loopback port, and a push worker process
   that makes five calls through the real openai SDK patched by `exporter.instrument()` against
   the demo provider and exits: the aggregator serves exactly those five calls, with sane values,
   and answers 408 to a push whose body stops coming (its body timeout);
3. the in-process exporter (`exporter.start_http_server`) scraped after an openai and two
   anthropic calls, once through the C parts and once through the Python code a build without a
   compiler runs: both serve the same counts.

Exits 1 with what went wrong on the first failure. Usage: `python smoke.py` (the roles
`worker URL` and `in-process c|python URL` are its own child processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: The C parts setup.py builds, and the module attribute that is None without each.
C_PARTS = {
    "exporter._internal.shim._hotloop": ("exporter._internal.shim.tokens", "Stamper"),
    "exporter._internal.shim._hottrace": ("exporter._internal.shim.httpx_trace", "Tracer"),
    "exporter._internal.record._hotrecord": ("exporter._internal.record.recorder",
                                             "append_in_c"),
}
#: Every scripted call: its first token after PREFILL s, then TOKENS tokens GAP s apart.
PREFILL, TOKENS, GAP = 0.02, 4, 0.005
SCRIPT = {"x-demo-script": json.dumps({"prefill": PREFILL, "tokens": TOKENS, "gap": GAP,
                                       "input_tokens": 12})}
MESSAGES = [{"role": "user", "content": "why is my first token slow?"}]
#: The push worker's calls: (what, streamed, reports usage).
WORKER_CALLS = (("chat stream with include_usage", True, True),
                ("chat stream without include_usage", True, False),
                ("chat, not streamed", False, True),
                ("responses stream", True, True),
                ("async chat stream with include_usage", True, True))
#: The in-process calls: (provider, streamed, reports usage).
IN_PROCESS_CALLS = (("openai", True, True), ("anthropic", True, True),
                    ("anthropic", False, True))
TIMEOUT = 120.0
#: The aggregator's `server.body_timeout_seconds`: a trickling push is answered 408 after it.
BODY_TIMEOUT = 1.0


class SmokeError(Exception):
    """A check failed: the message says which, with what was seen."""


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SmokeError(what)


# --- the children --------------------------------------------------------------------------------

def worker(provider_url: str) -> None:
    """A push worker (TTFT_EXPORTER_PUSH_URL is set by the parent): WORKER_CALLS, then exit,
    which pushes the last delta."""
    import openai

    import exporter

    exporter.instrument()
    client = openai.OpenAI(base_url=provider_url + "/v1", api_key="smoke", max_retries=0)
    with exporter.labels(route="smoke", tenant="pythons"):
        for _ in client.chat.completions.create(
                model="smoke-chat", messages=MESSAGES, stream=True, extra_headers=SCRIPT,
                stream_options={"include_usage": True}):
            pass
        for _ in client.chat.completions.create(model="smoke-chat", messages=MESSAGES,
                                                stream=True, extra_headers=SCRIPT):
            pass
        client.chat.completions.create(model="smoke-chat", messages=MESSAGES,
                                       extra_headers=SCRIPT)
        for _ in client.responses.create(model="smoke-chat", input="hi", stream=True,
                                         extra_headers=SCRIPT):
            pass

        async def async_stream() -> None:
            aclient = openai.AsyncOpenAI(base_url=provider_url + "/v1", api_key="smoke",
                                         max_retries=0)
            stream = await aclient.chat.completions.create(
                model="smoke-chat", messages=MESSAGES, stream=True, extra_headers=SCRIPT,
                stream_options={"include_usage": True})
            async for _ in stream:
                pass
            await aclient.close()

        asyncio.run(async_stream())


def in_process(path: str, provider_url: str) -> None:
    """`exporter.start_http_server` after IN_PROCESS_CALLS, through the C parts (`c`) or the
    Python code (`python`: the C modules made unimportable, as in a build without a compiler);
    prints what its /metrics served as JSON."""
    if path == "python":
        for module in C_PARTS:
            sys.modules[module] = None  # type: ignore[assignment]  # import fails: the fallback
    import anthropic
    import openai

    import exporter

    used = c_parts_in_use()
    check(all(used.values()) if path == "c" else not any(used.values()),
          f"the {path} path runs with these C parts in use: {used}")
    exporter.instrument()
    server = exporter.start_http_server(port=0)
    oai = openai.OpenAI(base_url=provider_url + "/v1", api_key="smoke", max_retries=0)
    ant = anthropic.Anthropic(base_url=provider_url, api_key="smoke", max_retries=0)
    with exporter.labels(route="smoke", tenant="pythons"):
        for _ in oai.chat.completions.create(
                model="smoke-chat", messages=MESSAGES, stream=True, extra_headers=SCRIPT,
                stream_options={"include_usage": True}):
            pass
        for _ in ant.messages.create(model="smoke-claude", max_tokens=64, messages=MESSAGES,
                                     stream=True, extra_headers=SCRIPT):
            pass
        ant.messages.create(model="smoke-claude", max_tokens=64, messages=MESSAGES,
                            extra_headers=SCRIPT)
    print(json.dumps(summary(scrape(server.base_url + "/metrics"))))


def c_parts_in_use() -> dict[str, bool]:
    """Which C parts the imported package runs (each module's attribute is None without it)."""
    import importlib

    return {module.rsplit(".", 1)[1]: getattr(importlib.import_module(owner), attr) is not None
            for module, (owner, attr) in C_PARTS.items()}


# --- scraping ------------------------------------------------------------------------------------

def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        check(response.status == 200, f"{url} answered {response.status}")
        return response.read().decode()


def summary(text: str) -> dict[str, Any]:
    """The served values the checks read: every histogram's count and sum, the TTFT buckets,
    the counters by name and labels (sorted, as `k=v,...`)."""
    from prometheus_client.parser import text_string_to_metric_families

    from exporter._internal import names

    counts: dict[str, float] = defaultdict(float)
    sums: dict[str, float] = defaultdict(float)
    ttft_buckets: dict[float, float] = defaultdict(float)
    counters: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "histogram":
                if sample.name.endswith("_count"):
                    counts[family.name] += sample.value
                elif sample.name.endswith("_sum"):
                    sums[family.name] += sample.value
                elif family.name == names.TTFT.name:
                    ttft_buckets[float(sample.labels["le"])] += sample.value
            elif family.type in ("counter", "gauge"):
                key = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                counters[sample.name][key] = sample.value
    return {"counts": counts, "sums": sums, "ttft_buckets": sorted(ttft_buckets.items()),
            "counters": counters}


def check_calls(seen: dict[str, Any], calls: tuple[tuple[str, bool, bool], ...],
                where: str) -> None:
    """`seen` (a summary) holds exactly `calls`, each with sane values."""
    from exporter._internal import names

    streamed = sum(1 for _, stream, _ in calls if stream)
    with_usage = sum(1 for _, _, usage in calls if usage)
    requests = seen["counters"].get(names.REQUESTS_TOTAL, {})
    total = sum(requests.values())
    check(total == len(calls), f"{where}: {total:g} calls served, {len(calls)} made "
                               f"({names.REQUESTS_TOTAL}: {requests or 'absent'})")
    check(all("outcome=ok" in key for key, n in requests.items() if n),
          f"{where}: a call did not end ok: {requests}")
    counts, sums = seen["counts"], seen["sums"]
    check(counts[names.DURATION.name] == len(calls),
          f"{where}: {counts[names.DURATION.name]:g} durations for {len(calls)} calls")
    ttft_count = counts[names.TTFT.name]
    check(ttft_count == len(calls), f"{where}: {ttft_count:g} TTFTs for {len(calls)} calls")
    early = sum(n for le, n in seen["ttft_buckets"] if le < PREFILL)
    check(early == 0, f"{where}: {early:g} TTFTs under the scripted {PREFILL} s")
    mean = sums[names.TTFT.name] / ttft_count
    check(PREFILL <= mean < 10, f"{where}: mean TTFT {mean:.4f} s, scripted {PREFILL} s")
    gaps = counts[names.ITL.name]
    check(gaps == streamed * (TOKENS - 1),
          f"{where}: {gaps:g} inter-token gaps, {streamed} streams of {TOKENS} tokens made")
    out = counts[names.OUTPUT_TOKENS.name], sums[names.OUTPUT_TOKENS.name]
    check(out == (with_usage, with_usage * TOKENS),
          f"{where}: output tokens (count, sum) {out}, {with_usage} calls of {TOKENS} reported")
    drops = {k: n for k, n in seen["counters"].get(names.SELF_DROPS + "_total", {}).items() if n}
    check(not drops, f"{where}: values dropped: {drops}")


# --- the parent ----------------------------------------------------------------------------------

def check_c_parts() -> str:
    """The C parts are built wherever a compiler and this Python's headers are found."""
    used = c_parts_in_use()
    compiler = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0])
    headers = Path(sysconfig.get_paths()["include"], "Python.h").is_file()
    if all(used.values()):
        return f"C parts built ({', '.join(used)})"
    missing = [name for name, built in used.items() if not built]
    check(not (compiler and headers),
          f"C parts not built although {compiler} and Python.h are here: {missing} (see the "
          f"pip install log: setup.py builds them with optional=True, so a failure is silent)")
    return f"C parts not built (no compiler or Python.h): the Python code runs ({missing})"


def package_folder() -> str:
    """Where the imported package is (the parent's only: a child chooses its C parts first)."""
    import exporter

    return str(Path(exporter.__file__).parent)


class Child:
    """A child process of this smoke, its output read by threads (never blocks on a pipe)."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        # every DeprecationWarning printed, each time: the package's own fail the smoke
        env = {**os.environ, "PYTHONWARNINGS": "always::DeprecationWarning", **(env or {})}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                        for stream, into in ((self.proc.stdout, self.out),
                                             (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait(self, what: str, timeout: float = TIMEOUT) -> str:
        """Wait for the exit; its stdout, or SmokeError with its stderr when it failed."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self.readers:
            reader.join(5)
        check(self.proc.returncode == 0,
              f"{what} exited {self.proc.returncode}:\n{''.join(self.err)[-3000:]}")
        deprecated = [line for line in self.err
                      if line.startswith(package_folder()) and "DeprecationWarning" in line]
        check(not deprecated, f"{what}: the package uses what this Python deprecates:\n"
                              + "".join(deprecated))
        return "".join(self.out)

    def line_starting(self, prefix: str, what: str) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in self.out:
                if line.startswith(prefix):
                    return line
            time.sleep(0.05)
        self.proc.kill()
        raise SmokeError(f"{what} did not start:\n{''.join(self.out + self.err)[-3000:]}")


def push_round_trip(provider_url: str) -> None:
    """The aggregator serves exactly the worker's calls (the 3.10 regression: every /push
    answered 500 and the worker's batches were given up at its exit), and answers 408 to a
    push whose body stops coming."""
    serve = str(Path(sys.executable).with_name("ttft-exporter"))
    with tempfile.TemporaryDirectory(prefix="ttft-smoke-") as folder:
        config = Path(folder, "ttft-exporter.yaml")
        config.write_text(f"server: {{body_timeout_seconds: {BODY_TIMEOUT}}}\n",
                          encoding="utf-8")
        aggregator = Child([serve, "serve", "--config", str(config), "--addr", "127.0.0.1",
                            "--port", "0"])
        try:
            metrics_url = aggregator.line_starting("ttft-exporter serving ",
                                                   "ttft-exporter serve").split()[-1]
            worker_served(provider_url, metrics_url)
            trickling_push_is_refused(metrics_url.removesuffix("/metrics"))
        except SmokeError as e:
            raise SmokeError(f"{e}\nthe aggregator's log:\n{''.join(aggregator.err)[-3000:]}")
        finally:
            aggregator.proc.send_signal(signal.SIGTERM)
        aggregator.wait("ttft-exporter serve, stopped by SIGTERM", timeout=30)


def worker_served(provider_url: str, metrics_url: str) -> None:
    """A push worker's WORKER_CALLS, served by the aggregator at `metrics_url` once it exits."""
    from exporter._internal import names

    worker_run = Child([sys.executable, __file__, "worker", provider_url],
                       env={"TTFT_EXPORTER_PUSH_URL": metrics_url.removesuffix("/metrics")})
    worker_run.wait("the push worker")
    errors = [line for line in worker_run.err if "ttft-exporter push" in line]
    check(not errors, "the push worker could not push:\n" + "".join(errors))
    seen = summary(scrape(metrics_url))
    where = "the aggregator"
    check_calls(seen, WORKER_CALLS, where)
    counters = seen["counters"]
    rejected = {k: n for k, n in counters.get(names.SELF_PUSH_REJECTED, {}).items() if n}
    check(not rejected, f"{where} rejected pushes: {rejected}")
    applied = counters.get(names.SELF_PUSH_BATCHES, {}).get("result=applied", 0)
    check(applied >= 1, f"{where} applied {applied:g} pushes")
    in_flight = sum(counters.get(names.REQUESTS_IN_FLIGHT, {}).values())
    check(in_flight == 0, f"{where}: {in_flight:g} calls in flight after the worker's exit")


def trickling_push_is_refused(url: str) -> None:
    """A push whose body stops coming is answered 408 after `server.body_timeout_seconds`
    (asyncio.timeout on 3.11+, compat's equivalent on 3.10)."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=BODY_TIMEOUT + 20) as s:
        s.sendall(b"POST /push HTTP/1.1\r\nHost: smoke\r\nContent-Type: "
                  b"application/x-ttft-delta\r\nContent-Length: 1000\r\n\r\nabc")
        answer = s.recv(1000)
    check(answer.startswith(b"HTTP/1.1 408"),
          f"a push body that stops coming was answered {answer[:200]!r}, not 408")


def in_process_both_ways(provider_url: str, c_built: bool) -> None:
    """The in-process exporter's calls through the C parts and through the Python code: each
    sane, and the same counts both ways."""
    served = {}
    for path in ("c", "python") if c_built else ("python",):
        out = Child([sys.executable, __file__, "in-process", path, provider_url]).wait(
            f"the in-process exporter ({path} path)")
        served[path] = json.loads(out.strip().splitlines()[-1])
        check_calls(served[path], IN_PROCESS_CALLS, f"the in-process exporter ({path} path)")
    if c_built:
        c, py = ({k: v for k, v in served[p]["counts"].items()} for p in ("c", "python"))
        check(c == py, f"the C and Python paths counted differently:\nC:      {c}\nPython: {py}")
        requests = served["c"]["counters"]["llm_client_requests_total"]
        check(requests == served["python"]["counters"]["llm_client_requests_total"],
              f"the C and Python paths' request rows differ: {served}")


def main() -> None:
    from exporter._internal.demo.provider import ProviderServer

    started = time.monotonic()
    print(f"  python {sys.version.split()[0]} ({sys.executable})")
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    check(any(package_folder().startswith(path) for path in site),
          f"exporter is imported from {package_folder()}, not from this Python's site-packages "
          f"{sorted(site)}: run the smoke from outside the checkout")
    c_parts = check_c_parts()
    print(f"  {c_parts}")
    with ProviderServer() as provider:
        step = time.monotonic()
        push_round_trip(provider.base_url)
        print(f"  push: the aggregator serves the worker's {len(WORKER_CALLS)} calls, a "
              f"trickling push is answered 408 "
              f"({time.monotonic() - step:.1f} s)")
        step = time.monotonic()
        in_process_both_ways(provider.base_url, c_parts.startswith("C parts built"))
        print(f"  in-process: openai and anthropic calls served, C and Python paths agree "
              f"({time.monotonic() - step:.1f} s)")
    print(f"  smoke passed in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    role = sys.argv[1:2]
    try:
        if role == ["worker"]:
            worker(sys.argv[2])
        elif role == ["in-process"]:
            in_process(sys.argv[2], sys.argv[3])
        else:
            main()
    except SmokeError as failure:
        print(f"SMOKE FAILED on Python {sys.version.split()[0]}: {failure}", file=sys.stderr)
        sys.exit(1)
