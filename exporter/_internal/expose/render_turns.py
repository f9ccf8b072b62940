"""Scrapes take turns: one render at a time, spaced, and one scrape per client address at a time.

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

Two bounds hold whatever the number of client addresses. Renders take at most half of the
time: after a render that took d seconds, the next one starts d seconds later at the earliest,
so the event loop has the GIL at least as long as the renders had it. And an address whose last
response the server took back (shed, or left unread past the write timeout: a client that does
not read) is paused: its scrapes are refused at once (503 with Retry-After, closed, counted
`shed`), without a render, for 1 s after its first such response, twice as long after each
next one in a row, PAUSE_MAX at most, until a response of it is written whole. A Prometheus
scrapes a target once per scrape interval (1 s at the shortest) and after a failed scrape waits
for the next interval, so the first pause costs it nothing; a client that never reads costs
one render per pause. A client closing its own connection early is not paused (a Prometheus
whose scrape timed out comes back at once when its timeout equals its interval): it holds
nothing afterwards, and the spacing bounds what its renders cost.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import NamedTuple

#: An address's first pause after a response it did not take, in seconds (the shortest scrape
#: interval Prometheus is run with); doubled after each next one in a row, up to PAUSE_MAX (the
#: default `server.write_timeout_seconds`: what a client that does not read holds anyway).
PAUSE_FIRST = 1.0
PAUSE_MAX = 30.0
#: Addresses remembered with their pauses, the least recently paused forgotten first (~150
#: bytes each); past them an address starts afresh, and the render spacing still holds.
MAX_PAUSED = 4096


class Refused(NamedTuple):
    """Why a scrape gets no render, and when to come back (seconds)."""

    why: str
    retry_after: float


SHED = Refused("too many scrapes waiting", 1.0)


class RenderTurns:
    """The turns of one app's scrapes (on its event loop). `wait()` is followed by
    `rendered()` once the body is made, then `finished()` once it is written."""

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        #: client address -> its scrapes waiting, oldest first; the next client to serve first
        self.waiting: dict[str, deque[asyncio.Future[Refused | None]]] = {}
        self.count = 0  # scrapes waiting
        self.rendering = False  # a scrape is rendering
        self.active: set[str] = set()  # clients with a scrape rendering or being written
        self.not_before = 0.0  # (loop time) no render starts earlier: the spacing
        self._wake: asyncio.TimerHandle | None = None  # the next turn, once the spacing ends
        #: client address -> (responses taken back in a row, paused until (loop time))
        self.paused: OrderedDict[str, tuple[int, float]] = OrderedDict()

    async def wait(self, client: str) -> Refused | None:
        """Until this scrape's turn to render (None), or why it gets none."""
        loop = asyncio.get_running_loop()
        pause = self._pause_left(client, loop.time())
        if pause:
            return Refused("this address left its last response unread", pause)
        if (not self.rendering and client not in self.active and client not in self.waiting
                and loop.time() >= self.not_before):
            self._start(client)
            return None
        if self.count >= self.max_waiting:
            shed = self._pop(max(self.waiting, key=lambda c: len(self.waiting[c])))
            if not shed.done():
                shed.set_result(SHED)
        turn: asyncio.Future[Refused | None] = loop.create_future()
        self.waiting.setdefault(client, deque()).append(turn)
        self.count += 1
        self._next()  # (a render may be due: its spacing ended with nobody waiting)
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
            elif turn.result() is None:  # given the turn as it was cancelled: pass it on
                self.rendered(0.0)
                self.finished(client, taken_back=False)
            raise

    def rendered(self, seconds: float) -> None:
        """The body is made, in `seconds`: another scrape may render that much later."""
        self.rendering = False
        self.not_before = asyncio.get_running_loop().time() + seconds
        self._next()

    def finished(self, client: str, taken_back: bool) -> None:
        """The scrape of `client` is written, or abandoned: its next one may render, at once
        unless the server took the response back (then once its pause ends, its scrapes
        waiting meanwhile refused)."""
        self.active.discard(client)
        if taken_back:
            self._pause(client)
        else:
            self.paused.pop(client, None)
        self._next()

    def _pause(self, client: str) -> None:
        loop = asyncio.get_running_loop()
        failures = self.paused.pop(client, (0, 0.0))[0] + 1
        seconds = min(PAUSE_FIRST * 2 ** min(failures - 1, 16), PAUSE_MAX)
        self.paused[client] = (failures, loop.time() + seconds)
        if len(self.paused) > MAX_PAUSED:
            self.paused.popitem(last=False)
        refused = Refused("this address left its last response unread", seconds)
        while client in self.waiting:
            turn = self._pop(client)
            if not turn.done():
                turn.set_result(refused)

    def _pause_left(self, client: str, now: float) -> float:
        """Seconds left of `client`'s pause (0 when none)."""
        paused = self.paused.get(client)
        return max(paused[1] - now, 0.0) if paused is not None else 0.0

    def _start(self, client: str) -> None:
        self.rendering = True
        self.active.add(client)

    def _next(self) -> None:
        """Once the spacing has passed: the oldest scrape of the first waiting client with none
        in progress renders; that client goes to the back of the line."""
        if self.rendering or not self.waiting:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self.not_before:
            if self._wake is None:
                self._wake = loop.call_at(self.not_before, self._woken)
            return
        while not self.rendering:
            client = next((c for c in self.waiting if c not in self.active), None)
            if client is None:
                return
            turn = self._pop(client)
            if client in self.waiting:
                self.waiting[client] = self.waiting.pop(client)
            if not turn.done():  # (not cancelled meanwhile)
                self._start(client)
                turn.set_result(None)

    def _woken(self) -> None:
        self._wake = None
        self._next()

    def _pop(self, client: str) -> asyncio.Future[Refused | None]:
        """`client`'s oldest waiting scrape, out of the queue."""
        queue = self.waiting[client]
        turn = queue.popleft()
        self.count -= 1
        if not queue:
            del self.waiting[client]
        return turn
