"""Faults: scrapes that cost renders nobody reads (expose/render_turns.py). An address whose
response the server took back is paused before its next render, longer each time in a row;
renders are spaced by their own duration, whatever the number of addresses asking."""

from __future__ import annotations

import asyncio
import http.client
import time
from pathlib import Path

from exporter._internal.expose import render_turns
from exporter._internal.expose.render_turns import RenderTurns
from tests.faults.test_fault_slow_clients import (closed_counts, host_port, never_reading,
                                                  preloaded_serve, reset_within)
from tests.test_push_processes import Serve


def scrape(serve: Serve, source: str) -> tuple[int, str | None, bool]:
    """A scrape from `source` that reads its answer: (status, Retry-After, whether the body
    is the exposition: over 2 MB here)."""
    connection = http.client.HTTPConnection(*host_port(serve), timeout=10,
                                            source_address=(source, 0))
    try:
        connection.request("GET", "/metrics", headers={
            "X-Prometheus-Scrape-Timeout-Seconds": "10", "Accept-Encoding": "identity"})
        answer = connection.getresponse()
        return answer.status, answer.getheader("Retry-After"), len(answer.read()) > 2_000_000
    finally:
        connection.close()


def left_unread(serve: Serve, source: str) -> None:
    """A scrape from `source` that never reads, until the server resets it (write timeout)."""
    client = never_reading(serve, source)
    try:
        assert reset_within(client, 10)
    finally:
        client.close()


def test_an_address_whose_response_was_left_unread_is_paused_before_its_next_render(
        tmp_path: Path):
    """A scrape left unread past `server.write_timeout_seconds` is reset; its address's next
    scrape is refused at once (503, Retry-After 1, counted `shed`), another address is served;
    once the pause is over a scrape that reads gets its body, and a second unread response in a
    row pauses the address twice as long (Retry-After 2); a body written whole ends it."""
    serve, _ = preloaded_serve(tmp_path, write_timeout_seconds=1)
    try:
        shed = closed_counts(serve)["shed"]
        left_unread(serve, "127.0.0.2")
        assert scrape(serve, "127.0.0.2")[:2] == (503, "1")
        assert scrape(serve, "127.0.0.3") == (200, None, True)
        assert closed_counts(serve)["shed"] == shed + 1
        time.sleep(1.1)
        assert scrape(serve, "127.0.0.2") == (200, None, True)  # (the pause is over)
        left_unread(serve, "127.0.0.2")
        assert scrape(serve, "127.0.0.2")[:2] == (503, "1")  # (one in a row: a body was read)
        time.sleep(1.1)
        left_unread(serve, "127.0.0.2")
        assert scrape(serve, "127.0.0.2")[:2] == (503, "2")  # two in a row
        time.sleep(2.1)
        assert scrape(serve, "127.0.0.2") == (200, None, True)
    finally:
        serve.stop()


def test_renders_are_spaced_by_their_duration_whatever_the_addresses():
    """After a render that took d seconds the next one, from any address, starts d later at
    the earliest; a scrape arriving after that starts at once."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        turns = RenderTurns(max_waiting=32)
        assert await turns.wait("127.0.0.2") is None
        turns.rendered(0.3)
        started = loop.time()
        waiting = [asyncio.ensure_future(turns.wait(f"127.0.1.{i}")) for i in range(3)]
        assert await waiting[0] is None
        assert loop.time() - started >= 0.3
        assert not waiting[1].done()  # one render at a time
        turns.rendered(0.2)
        assert await waiting[1] is None and loop.time() - started >= 0.5
        turns.rendered(0.0)
        assert await waiting[2] is None
        turns.rendered(0.0)
        for client in ("127.0.0.2", *(f"127.0.1.{i}" for i in range(3))):
            turns.finished(client, taken_back=False)
        await asyncio.sleep(0.01)
        before = loop.time()
        assert await turns.wait("127.0.0.9") is None and loop.time() - before < 0.01

    asyncio.run(run())


def test_a_paused_address_loses_its_waiting_scrapes_and_the_pauses_remembered_are_bounded(
        monkeypatch):
    """A response taken back refuses the scrapes its address has waiting (no render for them)
    and the next ones until the pause ends; past MAX_PAUSED addresses the least recently
    paused is forgotten (memory bounded whatever the number of addresses)."""
    monkeypatch.setattr(render_turns, "MAX_PAUSED", 3)

    async def run() -> None:
        turns = RenderTurns(max_waiting=32)
        assert await turns.wait("a") is None
        turns.rendered(0.0)
        waiting = asyncio.ensure_future(turns.wait("a"))  # (its first one is being written)
        await asyncio.sleep(0)
        turns.finished("a", taken_back=True)
        assert (await waiting).retry_after == render_turns.PAUSE_FIRST
        assert (await turns.wait("a")).retry_after <= render_turns.PAUSE_FIRST
        for client in "bcd":
            assert await turns.wait(client) is None
            turns.rendered(0.0)
            turns.finished(client, taken_back=True)
        assert list(turns.paused) == ["b", "c", "d"]
        assert await turns.wait("a") is None  # (forgotten)

    asyncio.run(run())
