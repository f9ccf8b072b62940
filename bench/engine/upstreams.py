"""A second, different upstream for the same model: the silent route change's other end.

What a client can see change on the wire when its calls move (docs/engine.md, "Two
upstreams"): the address it connects to (another loopback address, 127.0.0.2, and port), the
response's `system_fingerprint` (the other build: `b2-...`), and the timing: a relay in front
holds every byte `one_way` seconds each way (exporter/_internal/demo/relay.py), and the engine
behind it may run with fewer threads. The model name stays the same (`--alias`), as it does when
a provider moves a model to another region.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.engine.build import Engine
from bench.engine.server import LlamaServer, Options
from exporter._internal.demo.relay import Relay, RelayThread

#: The far upstream's loopback address: another address, so a client's upstream identity
#: (address:port) differs even when the ports happen to match.
FAR_HOST = "127.0.0.2"


def relay_to(host: str, target_port: int, one_way: float) -> RelayThread:
    """The demo's relay thread, listening on `host` (and forwarding to `host:target_port`)
    instead of 127.0.0.1: its `Relay` takes a host, its thread wrapper does not."""
    thread = RelayThread(target_port, one_way)
    thread.relay = Relay(target_port, one_way, host=host)
    return thread


@dataclass
class FarUpstream:
    """The alternate build on `FAR_HOST`, behind a relay `one_way` seconds away when
    `one_way` > 0. Clients use `openai_base_url` (the relay's, or the engine's own)."""

    engine: Engine
    options: Options = field(default_factory=lambda: Options(threads=1))
    one_way: float = 0.0
    server: LlamaServer = field(init=False)
    relay: RelayThread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.server = LlamaServer(self.engine.alternate_server, self.engine.model,
                                  replace(self.options, host=FAR_HOST))

    @property
    def base_url(self) -> str:
        return self.relay.base_url if self.relay is not None else self.server.base_url

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def start(self) -> "FarUpstream":
        self.server.start()
        if self.one_way > 0:
            try:
                self.relay = relay_to(FAR_HOST, self.server.port, self.one_way).__enter__()
            except BaseException:
                self.server.stop()
                raise
        return self

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.__exit__(None, None, None)
            self.relay = None
        self.server.stop()

    def __enter__(self) -> "FarUpstream":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
