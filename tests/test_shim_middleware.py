"""Inbound labels (aiohttp and ASGI middlewares) and the aiohttp TraceConfig helper."""

from __future__ import annotations

from types import SimpleNamespace

import aiohttp
import openai
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import exporter
from exporter._internal import names
from exporter._internal.record.timeline import derive
from exporter.integrations import (ASGIMiddleware, aiohttp_middleware,
                                   aiohttp_trace_config as trace_config)
from tests import test_shim_support as support
from tests.test_shim_support import script

# Shared fixtures of tests/test_shim_support.py.
server, recorded, instrumented = support.server, support.recorded, support.instrumented


async def test_aiohttp_middleware_labels_sdk_calls_with_the_route_template(server, recorded):
    llm = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)

    async def chat(request: web.Request) -> web.Response:
        s = await llm.chat.completions.create(model="m", stream=True, extra_headers=script(),
                                              messages=[{"role": "user", "content": "hi"}])
        text = "".join([c.choices[0].delta.content or "" async for c in s if c.choices])
        return web.Response(text=text)

    app = web.Application(middlewares=[aiohttp_middleware(tenant_header="x-tenant")])
    app.router.add_post("/sessions/{session}/chat", chat)
    async with TestClient(TestServer(app)) as http:
        for session, tenant in (("123", "acme"), ("456", None)):
            headers = {"x-tenant": tenant} if tenant else {}
            response = await http.post(f"/sessions/{session}/chat", headers=headers)
            assert response.status == 200 and await response.text()
        assert (await http.get("/nowhere")).status == 404
    first, second = recorded.all()
    assert (first.route, first.tenant) == ("/sessions/{session}/chat", "acme")
    assert (second.route, second.tenant) == ("/sessions/{session}/chat", "")


async def test_asgi_middleware_reads_the_route_when_the_call_is_made():
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            seen.append(scope["type"])
            return
        # what a router does after matching: FastAPI (and recent Starlette) set scope["route"]
        if scope["path"].startswith("/items/"):
            scope["route"] = SimpleNamespace(path="/items/{item_id}")
        with exporter.track(model="m") as call:
            pass
        with exporter.labels(route=None):  # a nested labels() block sees the lazy route too
            with exporter.track(model="m") as nested:
                pass
        seen.append((call.timeline.route, call.timeline.tenant, nested.timeline.route))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = ASGIMiddleware(app, tenant_header="X-Tenant")

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        pass

    for path, headers in (("/items/42", [(b"x-tenant", b"acme")]), ("/other", [])):
        scope = {"type": "http", "path": path, "headers": headers}
        await wrapped(scope, receive, send)
    await wrapped({"type": "lifespan"}, receive, send)  # passes through
    assert seen == [("/items/{item_id}", "acme", "/items/{item_id}"),
                    (names.UNKNOWN, "", names.UNKNOWN), "lifespan"]
    with exporter.track(model="m") as after:
        pass
    assert after.timeline.route == names.UNKNOWN  # the context is restored


async def test_aiohttp_trace_config_stamps_the_manual_api(server, recorded):
    url = server.base_url + "/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession(trace_configs=[trace_config()]) as session:
        for _ in range(2):
            with exporter.track(model="m", provider="vllm") as call:
                async with session.post(url, json=body, trace_request_ctx=call,
                                        headers=script(server_wait=0.05, tokens=2)) as r:
                    await r.json()
                    call.token()
    new, reused = recorded.all()
    assert new.dispatched <= new.connected <= new.sent <= new.headers
    assert reused.connected == reused.dispatched  # a reused connection: connect = 0
    d = derive(new)
    assert {"queue", "connect", "send", "server"} <= set(d.phases)
    assert 0.045 <= d.phases["server"] / 1e6 <= 0.07
