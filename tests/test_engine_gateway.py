"""bench/engine/gateway.py: the overload look-alike's gateway sheds load past its limit with a
503 the SDK retries, and forwards the rest byte for byte (no engine needed: a held upstream)."""

from __future__ import annotations

import http.client
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.engine.gateway import Gateway


class _Held(BaseHTTPRequestHandler):
    """Answers each POST with its body, once the test releases it."""

    release = threading.Event()
    arrived = threading.Semaphore(0)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.arrived.release()
        self.release.wait(30)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _post(port: int, body: bytes) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", body,
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_past_its_limit_the_gateway_answers_503_and_forwards_the_rest():
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Held)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with Gateway(upstream.server_address[1], limit=2) as gateway, \
                ThreadPoolExecutor(2) as pool:
            held = [pool.submit(_post, gateway.port, f"call {k}".encode()) for k in range(2)]
            for _ in held:  # both in flight at the upstream
                assert _Held.arrived.acquire(timeout=30)
            status, body = _post(gateway.port, b"one too many")
            assert status == 503 and b"overloaded" in body
            _Held.release.set()
            assert sorted(f.result() for f in held) == [(200, b"call 0"), (200, b"call 1")]
            assert _post(gateway.port, b"again")[0] == 200  # nothing in flight now
            assert (gateway.refused, gateway.forwarded) == (1, 3)
    finally:
        upstream.shutdown()
        upstream.server_close()
