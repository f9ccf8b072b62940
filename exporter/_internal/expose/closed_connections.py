"""The connections the exporter's HTTP servers closed, by reason: counted by the connection
guard, the server and the aggregator, served by every scrape
(`ttft_exporter_http_connections_closed_total`).

Apart from the guard (connection_guard.py), which imports aiohttp's server: a scrape served
through prometheus_client (`exporter.collector()`) reads them without loading a server.
"""

from __future__ import annotations

#: Connections closed by the guards of this process, by reason (`limit`, `slow`, `shed`,
#: `unread`, `large`).
CLOSED: dict[str, int] = {"limit": 0, "slow": 0, "shed": 0, "unread": 0, "large": 0}
REASONS: tuple[str, ...] = tuple(CLOSED)
