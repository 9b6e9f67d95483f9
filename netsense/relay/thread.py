"""`start_relay`: a relay on its own event-loop thread, for tests, benchmarks and the launcher."""

from __future__ import annotations

from dataclasses import dataclass

from netsense.transport.tls import TransportSettings, server_configuration
from netsense.transport.wire import Limits
from netsense.worker.netthread import NetThread

from .server import Relay, RelaySettings


@dataclass
class RunningRelay:
    """A started relay and the thread its loop runs on."""

    relay: Relay
    net: NetThread

    @property
    def ports(self) -> list[int]:
        return self.relay.ports

    def wan_bytes(self) -> tuple[int, int]:
        """(sent, received) on the upstream connections, read on the relay's loop."""

        async def read() -> tuple[int, int]:
            return self.relay.wan_bytes()

        return self.net.run(read())

    def stop(self) -> None:
        """Stop serving, BYE upstream, end the thread (idempotent)."""
        if not self.net.loop.is_closed():
            self.net.run(self.relay.close(), timeout=10)
            self.net.close()


def start_relay(
    settings: RelaySettings, *, cert: str, key: str, secret: bytes | None,
    transport: TransportSettings = TransportSettings(), limits: Limits = Limits(),
) -> RunningRelay:  # fmt: skip
    """Connect the relay upstream and listen (ports in `RunningRelay.ports`); raises what the
    upstream connect raised (a wrong secret, no PS there)."""
    net = NetThread(f"relay-{settings.site}")
    relay = Relay(settings, secret=secret, limits=limits)
    try:
        net.run(relay.start(server_configuration(cert, key, transport), transport.socket_buffer_bytes))
    except BaseException:
        net.close()
        raise
    return RunningRelay(relay, net)
