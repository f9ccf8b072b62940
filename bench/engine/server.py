"""One `llama-server` process on a loopback address: started with chosen options, ready when
`/health` says so, stopped cleanly, restarted on the same address (its prompt cache lost, as a
provider's replica loses it when it restarts), and what it reports (`/metrics`, `/slots`,
`/props`) read back.

llama-server's facts this harness relies on are measured in docs/engine.md: the context is
split evenly between the slots (`--ctx-size` / `--parallel` tokens each), a slot keeps the
KV cache of its last prompt, and `system_fingerprint` is the build's (`b<number>-<commit>`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: The model name the engine answers with (`--alias`), whatever the request asked for: the
#: shim labels a call with the response's model.
DEFAULT_ALIAS = "tiny-llama"


@dataclass(frozen=True)
class Options:
    """llama-server's command line, the parts the scenarios turn.

    `context` is the whole KV cache; each of the `parallel` slots gets `context / parallel`
    tokens of it (a prompt longer than its slot's share is refused). `cache_prompt` False
    makes every request prefill its whole prompt (`--no-cache-prompt`). `cache_ram_mib` is the
    host-memory prompt cache behind the slots (llama-server's default 8192 MiB; 0 turns it off,
    so a prefix survives only in the slot that last held it).
    """

    parallel: int = 2
    threads: int = 1
    context: int = 16384
    cache_prompt: bool = True
    cache_ram_mib: int | None = None
    metrics: bool = True
    slots_endpoint: bool = True
    slot_save_path: Path | None = None
    alias: str = DEFAULT_ALIAS
    host: str = "127.0.0.1"
    batch: int | None = None
    ubatch: int | None = None
    extra: tuple[str, ...] = ()

    def argv(self, model: Path, port: int) -> list[str]:
        args = ["-m", str(model), "--host", self.host, "--port", str(port),
                "--parallel", str(self.parallel), "--threads", str(self.threads),
                "--ctx-size", str(self.context), "--alias", self.alias,
                "--no-webui",  # the API only
                "--cache-prompt" if self.cache_prompt else "--no-cache-prompt",
                "--slots" if self.slots_endpoint else "--no-slots"]
        if self.metrics:
            args.append("--metrics")
        if self.cache_ram_mib is not None:
            args += ["--cache-ram", str(self.cache_ram_mib)]
        if self.slot_save_path is not None:
            args += ["--slot-save-path", str(self.slot_save_path)]
        if self.batch is not None:
            args += ["--batch-size", str(self.batch)]
        if self.ubatch is not None:
            args += ["--ubatch-size", str(self.ubatch)]
        return args + list(self.extra)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EngineError(RuntimeError):
    """The engine did not start, or answered with an error; the message ends with its log."""


@dataclass
class LlamaServer:
    """A llama-server child process. Use as a context manager, or `start()` / `stop()`."""

    binary: Path
    model: Path
    options: Options = field(default_factory=Options)
    port: int = 0
    startup_timeout: float = 60.0
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: Any = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> "LlamaServer":
        """Start on `port` (a free one when 0, kept across restarts) and wait until ready."""
        if self.running:
            return self
        if not self.port:
            self.port = free_port(self.options.host)
        self._log = tempfile.TemporaryFile()
        env = dict(os.environ, LLAMA_LOG_COLORS="off")
        self._process = subprocess.Popen(
            [str(self.binary), *self.options.argv(self.model, self.port)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise EngineError(f"llama-server exited with {self._process.returncode}"
                                  f"\n{self.log_tail()}")
            try:
                if self.get("/health").get("status") == "ok":
                    return
            except (OSError, EngineError):  # not listening yet, or 503 while loading
                pass
            time.sleep(0.05)
        raise EngineError(f"llama-server not ready after {self.startup_timeout} s"
                          f"\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (llama-server finishes its loop and exits), SIGKILL past `timeout`."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """A new process on the same address: every slot's and the host cache's prompts are
        gone, so the next call of every prefix is cold."""
        self.stop()
        self.start()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's own log (stdout and stderr)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        self._log.seek(0, os.SEEK_END)
        return "\n".join(text.splitlines()[-lines:])

    # --- what the engine reports ------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as e:
            raise EngineError(f"{method} {path}: HTTP {e.code} {e.read()[:500]!r}") from e

    def get(self, path: str) -> Any:
        return json.loads(self.request("GET", path, timeout=5.0))

    def post(self, path: str, body: Any, timeout: float = 60.0) -> Any:
        return json.loads(self.request("POST", path, body, timeout))

    def props(self) -> dict[str, Any]:
        """`/props`: the slots, the alias, `build_info` (the fingerprint), the chat template."""
        return self.get("/props")

    def slots(self) -> list[dict[str, Any]]:
        """`/slots`: per slot its id, whether it is processing, its context share."""
        return self.get("/slots")

    def metrics(self) -> dict[str, float]:
        """`/metrics` (`--metrics`) as {name: value}: `llamacpp:prompt_tokens_total`,
        `llamacpp:prompt_seconds_total`, `llamacpp:requests_processing`,
        `llamacpp:requests_deferred`, `llamacpp:n_decode_total`, ..."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self.request("GET", "/metrics", timeout=5.0).decode()
        return {sample.name: sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples}

    def tokenize(self, text: str) -> list[int]:
        """The prompt's tokens as the engine cuts them (no BOS)."""
        return self.post("/tokenize", {"content": text})["tokens"]

    def save_slot(self, slot: int, filename: str) -> dict[str, Any]:
        """Write a slot's KV cache under `--slot-save-path` (needs one)."""
        return self.post(f"/slots/{slot}?action=save", {"filename": filename})

    def restore_slot(self, slot: int, filename: str) -> dict[str, Any]:
        return self.post(f"/slots/{slot}?action=restore", {"filename": filename})

    def erase_slot(self, slot: int) -> dict[str, Any]:
        """Forget a slot's cached prompt (its next call prefills from the start)."""
        return self.post(f"/slots/{slot}?action=erase", {})

    def with_options(self, **changes: Any) -> "LlamaServer":
        """A stopped copy with other options (same binary and model, a new port)."""
        return LlamaServer(self.binary, self.model, replace(self.options, **changes))
