"""What keeps the page safe to open: security headers on every response, and the Host
allowlist that defeats DNS rebinding.

The page shows a service's latency and proxies its Prometheus. Another site open in the same
browser must not frame it, run script in it, or read it: a DNS name of the attacker's that
resolves to 127.0.0.1 makes the browser send the attacker's name as Host to this server, so a
request is answered only when its Host names the address it arrived on (`localhost` too on a
loopback address) or a name the operator allowed (`ttft-exporter view --allow-host NAME`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

#: The page's own script and style files only (no inline script, no inline style attribute),
#: fetches to this server only, never inside a frame.
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:",
    "connect-src 'self'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"))
#: Sent with every response, pages, files, API answers and errors alike. No referrer: a page's
#: URL holds the selected models, routes and tenants, and runbook links lead off this host.
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the headers of HEADERS on the response (static files and error
    answers pass here too, which a middleware would miss for some)."""
    response.headers.update(HEADERS)


def host_name(host: str) -> str:
    """The name or address of a Host header, without port or IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _same_address(name: str, address: str) -> bool:
    try:
        return ipaddress.ip_address(name) == ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return False


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.partition("%")[0]).is_loopback
    except ValueError:
        return False


def host_allowlist(allowed: Iterable[str] = ()) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware answering 421 to a request whose Host is not the address it arrived on,
    `localhost` (on a loopback address) or one of the `allowed` names."""
    names = frozenset(host_name(name) for name in allowed)

    @web.middleware
    async def check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        local = str(sockname[0]) if sockname else ""
        if host is not None:
            name = host_name(host)
            if name in names or _same_address(name, local) or (
                    name == "localhost" and _is_loopback(local)):
                return await handler(request)
        raise web.HTTPMisdirectedRequest(
            text=f"this page is served as {local or 'its address'}; Host {host!r} is not "
                 f"allowed (a DNS name pointing here is refused unless named with "
                 f"`ttft-exporter view --allow-host NAME`)\n")

    return check_host
