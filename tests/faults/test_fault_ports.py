"""A port that is taken: one clear line naming the address, never a traceback or asyncio noise."""

from __future__ import annotations

import socket
import subprocess

import pytest

import exporter
from tests.test_push_processes import CLI


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_start_http_server_raises_an_error_naming_the_address(taken_port):
    with pytest.raises(OSError) as info:
        exporter.start_http_server(port=taken_port)
    assert str(info.value) == f"[Errno 98] cannot listen on 127.0.0.1:{taken_port}: Address " \
                              f"already in use"


def test_serve_on_a_taken_port_says_which_and_exits_2(taken_port):
    run = subprocess.run([*CLI, "serve", "--port", str(taken_port)], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 2
    assert run.stderr == (f"ttft-exporter serve: cannot listen on 127.0.0.1:{taken_port}: "
                          f"Address already in use\n")
