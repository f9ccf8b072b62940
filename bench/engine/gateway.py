"""A provider's gateway in front of the engine that sheds load: past `limit` requests in
flight it answers HTTP 503 at once, as an overloaded provider does (OpenAI's and Anthropic's
front doors answer 503/529), and the SDK's own retries take over (bench/engine/scenarios.py,
the overload look-alike).

Each forwarded request goes to the engine on a connection of its own with `Connection:
close`, so the engine ends the response by closing it and the gateway copies the bytes back as
they come (a stream keeps its pace); the client's connection closes after it too. A 503 keeps
the client's connection open (the SDK retries on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

_REFUSAL = b'{"error": {"message": "the engine is overloaded", "type": "server_error"}}'


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head (without its Connection header) and body; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        return None
    lines = head[:-4].split(b"\r\n")
    length = 0
    kept = [lines[0]]
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() != b"connection":
            kept.append(line)
    body = await reader.readexactly(length) if length else b""
    return b"\r\n".join(kept) + b"\r\n", body


class Gateway:
    """Listens on a free port of `host`, forwarding to `host:target_port`; answers 503 to a
    request arriving while `limit` are in flight. `refused` and `forwarded` count them."""

    def __init__(self, target_port: int, limit: int, host: str = "127.0.0.1"):
        self.target = (host, target_port)
        self.limit = limit
        self.host = host
        self.port = 0
        self.in_flight = 0
        self.refused = 0
        self.forwarded = 0
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway",
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await _read_request(reader)) is not None:
                if self.in_flight >= self.limit:
                    self.refused += 1
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                                 b"application/json\r\nContent-Length: "
                                 + str(len(_REFUSAL)).encode() + b"\r\n\r\n" + _REFUSAL)
                    await writer.drain()
                    continue
                self.in_flight += 1
                self.forwarded += 1
                try:
                    await self._forward(*request, writer)
                finally:
                    self.in_flight -= 1
                break  # the engine closed its side: so does the gateway
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    async def _forward(self, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        engine_r, engine_w = await asyncio.open_connection(*self.target)
        try:
            engine_w.write(head + b"Connection: close\r\n\r\n" + body)
            await engine_w.drain()
            while data := await engine_r.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            engine_w.close()

    def __enter__(self) -> "Gateway":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
