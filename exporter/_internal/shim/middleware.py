"""Inbound context: `route` and `tenant` labels for every LLM call a request handler makes.

* aiohttp: `web.Application(middlewares=[aiohttp_middleware(tenant_header="x-tenant")])`.
  aiohttp matches the route before middlewares run, so the label is the matched resource's
  template (`/users/{id}/chat`, its `canonical`), never the raw path. An unmatched request (404)
  gets no route label.
* ASGI (Starlette, FastAPI, any ASGI app): `app = ASGIMiddleware(app, tenant_header="x-tenant")`.
  The router runs inside the app, after this middleware, so the route is read lazily, when a
  call is made: from `scope["route"]` (set by FastAPI and by recent Starlette routers when they
  match: its `path_format` or `path`, the template), or from a `route_of(scope)` function you
  pass. A request whose route is not known by then gets no route label.

The tenant comes from a configurable header (default `x-tenant`; a missing or empty header sets
none). Values still go through the label guard (allow-list, hashing, `max_tenants`). A request
carrying `ttft-deadline-ms` (sent by an upstream service's task, deadline.py) puts that deadline
in force for its handler: `exporter.remaining()` reads it and tasks inherit it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Awaitable, Callable

from .. import names
from . import context, deadline
from .context import labels

DEFAULT_TENANT_HEADER = "x-tenant"
_DEADLINE_HEADER = deadline.HEADER.encode("latin-1")


# --- aiohttp --------------------------------------------------------------------------------------
def aiohttp_middleware(tenant_header: str | None = DEFAULT_TENANT_HEADER) -> Any:
    """An aiohttp middleware setting `route` (matched template) and `tenant` (header)."""
    from aiohttp import web

    @web.middleware
    async def ttft_exporter_labels(request: web.Request, handler: Callable[..., Awaitable[Any]]
                                   ) -> Any:
        route = tenant = inbound = None
        try:
            resource = request.match_info.route.resource
            if resource is not None:
                route = resource.canonical or None
            if tenant_header:
                tenant = request.headers.get(tenant_header) or None
            sent = request.headers.get(deadline.HEADER)
            if sent is not None:
                inbound = deadline.parse(sent)
        except Exception:
            pass
        if route is None and tenant is None and inbound is None:
            return await handler(request)
        token = deadline.enter(inbound) if inbound is not None else None
        try:
            if route is None and tenant is None:
                return await handler(request)
            with labels(route=route, tenant=tenant):
                return await handler(request)
        finally:
            deadline.leave(token)

    return ttft_exporter_labels


# --- ASGI -----------------------------------------------------------------------------------------
def route_from_scope(scope: Mapping[str, Any]) -> str | None:
    """The matched route template of an ASGI scope, once a router has matched it."""
    route = scope.get("route")
    if route is None:
        return None
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    # Inside a mounted sub-application the template is relative to the mount: pass your own
    # `route_of` to prefix it.
    return template if isinstance(template, str) and template else None


class _LazyLabels(Mapping[str, str]):
    """The labels of an inbound ASGI request: `route` is looked up when first read."""

    __slots__ = ("_outer", "_tenant", "_scope", "_route_of")

    def __init__(self, outer: Mapping[str, str], tenant: str | None, scope: Mapping[str, Any],
                 route_of: Callable[[Mapping[str, Any]], str | None]):
        self._outer = outer
        self._tenant = tenant
        self._scope = scope
        self._route_of = route_of

    def _route(self) -> str | None:
        try:
            route = self._route_of(self._scope)
        except Exception:
            return None
        return route if isinstance(route, str) and route else None

    def _items(self) -> dict[str, str]:
        out = dict(self._outer)
        route = self._route()
        if route is not None:
            out[names.ROUTE] = route
        if self._tenant is not None:
            out[names.TENANT] = self._tenant
        return out

    def __getitem__(self, key: str) -> str:
        if key == names.ROUTE:
            route = self._route()
            if route is not None:
                return route
        elif key == names.TENANT and self._tenant is not None:
            return self._tenant
        return self._outer[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


class ASGIMiddleware:
    """ASGI middleware setting `route` (lazily, from the router's match) and `tenant`."""

    def __init__(self, app: Callable[..., Awaitable[None]],
                 tenant_header: str | None = DEFAULT_TENANT_HEADER,
                 route_of: Callable[[Mapping[str, Any]], str | None] = route_from_scope):
        self.app = app
        self.tenant_header = tenant_header.lower().encode("latin-1") if tenant_header else None
        self.route_of = route_of

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[None]]) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        token = deadline_token = None
        try:
            tenant = inbound = None
            for key, value in scope.get("headers") or ():
                key = key.lower()
                if key == self.tenant_header and tenant is None:
                    tenant = value.decode("latin-1") or None
                elif key == _DEADLINE_HEADER:
                    inbound = deadline.parse(value)
            token = context._current.set(
                _LazyLabels(context.current(), tenant, scope, self.route_of))
            if inbound is not None:
                deadline_token = deadline.enter(inbound)
        except Exception:
            pass
        try:
            await self.app(scope, receive, send)
        finally:
            deadline.leave(deadline_token)
            if token is not None:
                try:
                    context._current.reset(token)
                except ValueError:
                    pass
