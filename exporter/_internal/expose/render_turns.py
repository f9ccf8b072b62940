"""Scrapes take turns: one render at a time, and one scrape per client address at a time.

The renderer makes one body at a time (its lock). Scrapes used to wait for it in the executor
in arrival order: a flood of scrapes put a real scraper behind hundreds of renders, each held
its connection inside a handler (a slot the guard cannot shed), a connection closed while
waiting still got its render, and the renders back to back held the GIL, so the event loop
(which needs it back after every system call) answered /healthz in seconds. Here each client
address has its own queue, served in turn: a scraper waits for at most one render per other
client waiting. A client's next scrape starts only once its previous one is written (a
Prometheus scrapes a target one scrape at a time): a client that does not read what it asked
for gets no other render until that response is read, shed or timed out (connection_guard.py).
A scrape whose connection closed while it waited is skipped (the handler checks when its turn
comes). At most `max_waiting` scrapes wait: one more sheds the oldest waiting scrape of the
client with the most waiting (answered 503 and closed, counted `shed`).
"""

from __future__ import annotations

import asyncio
from collections import deque


class RenderTurns:
    """The turns of one app's scrapes (on its event loop). `wait()` is followed by
    `rendered()` once the body is made, then `finished()` once it is written."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        #: client address -> its scrapes waiting, oldest first; the next client to serve first
        self.waiting: dict[str, deque[asyncio.Future[bool]]] = {}
        self.count = 0  # scrapes waiting
        self.rendering = False  # a scrape is rendering
        self.active: set[str] = set()  # clients with a scrape rendering or being written

    async def wait(self, client: str) -> bool:
        """Until this scrape's turn to render; False when it was shed."""
        if not self.rendering and client not in self.active and client not in self.waiting:
            self._start(client)
            return True
        if self.count >= self.max_waiting:
            shed = self._pop(max(self.waiting, key=lambda c: len(self.waiting[c])))
            if not shed.done():
                shed.set_result(False)
        turn: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(client, deque()).append(turn)
        self.count += 1
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.cancelled():  # while waiting: out of the queue (if still in it)
                queue = self.waiting.get(client, deque())
                if turn in queue:
                    queue.remove(turn)
                    self.count -= 1
                    if not queue:
                        del self.waiting[client]
            elif turn.result():  # given the turn as it was cancelled: pass it on
                self.rendered()
                self.finished(client)
            raise

    def rendered(self) -> None:
        """The body is made: another client's scrape may render."""
        self.rendering = False
        self._next()

    def finished(self, client: str) -> None:
        """The scrape of `client` is written (or abandoned): its next one may render."""
        self.active.discard(client)
        self._next()

    def _start(self, client: str) -> None:
        self.rendering = True
        self.active.add(client)

    def _next(self) -> None:
        """The oldest scrape of the first waiting client with none in progress renders; that
        client goes to the back of the line."""
        while not self.rendering:
            client = next((c for c in self.waiting if c not in self.active), None)
            if client is None:
                return
            turn = self._pop(client)
            if client in self.waiting:
                self.waiting[client] = self.waiting.pop(client)
            if not turn.done():  # (not cancelled meanwhile)
                self._start(client)
                turn.set_result(True)

    def _pop(self, client: str) -> asyncio.Future[bool]:
        """`client`'s oldest waiting scrape, out of the queue."""
        queue = self.waiting[client]
        turn = queue.popleft()
        self.count -= 1
        if not queue:
            del self.waiting[client]
        return turn
