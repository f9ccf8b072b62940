"""A TCP relay that puts the demo provider `one_way` seconds away: a farther region on loopback.

Every byte is held `one_way` seconds in each direction, so a request costs one round trip more
before its headers (the server phase) while the tokens keep their pace: the network term of the
agent workload (agents.py) and of its end-to-end test, and the distance of the far region
(far_region.py), where it stands in front of a TLS listener. The kernel completes the client's TCP
connect to the relay at once, so the connect phase does not show the distance; requests on the
SDKs' kept-alive connections, the common case, do not pay a connect anyway. A busy machine
delivers late (a timer wakes the relay when the scheduler lets it); with `log` the relay keeps,
per connection, when it read and wrote each chunk, so a test can count what it really held.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

_CHUNK = 65536


#: One delivered chunk: direction (UP: to the server), read and written (loop.time()).
Held = tuple[str, float, float]
UP, DOWN = "up", "down"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                one_way: float, direction: str, log: list[Held] | None) -> None:
    """Copy reader to writer, each chunk delivered `one_way` seconds after it was read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the distance itself: pacing, not synchronisation
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            if log is not None:
                log.append((direction, due - one_way, loop.time()))
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(_CHUNK)
            queue.put_nowait((loop.time() + one_way, data))
            if not data:
                break
        await sender
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        sender.cancel()
        writer.close()


class Relay:
    """Listens on a free loopback port, forwarding to `target_port`, `one_way` s each way."""

    def __init__(self, target_port: int, one_way: float, host: str = "127.0.0.1",
                 log: bool = False):
        self.target = (host, target_port)
        self.one_way = one_way
        #: With `log`: per connection, every chunk delivered, in delivery order.
        self.log: list[list[Held]] | None = [] if log else None
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> "Relay":
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        log: list[Held] | None = None
        if self.log is not None:
            log = []
            self.log.append(log)
        try:
            await asyncio.gather(_pipe(client_r, server_w, self.one_way, UP, log),
                                 _pipe(server_r, client_w, self.one_way, DOWN, log))
        except asyncio.CancelledError:  # close(): asyncio would log a cancelled handler
            client_w.close()
            server_w.close()
        finally:
            if task is not None:
                self._tasks.discard(task)


class RelayThread:
    """A `Relay` on its own event loop in a daemon thread, for synchronous callers."""

    def __init__(self, target_port: int, one_way: float, log: bool = False):
        self.relay = Relay(target_port, one_way, log=log)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="demo-relay",
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return self.relay.base_url

    def __enter__(self) -> "RelayThread":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.relay.start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.relay.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
