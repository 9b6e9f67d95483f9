"""The sensing congestion controls: aioquic's Reno and Cubic, feeding a `SensingState` estimator.

aioquic exposes neither loss counters nor delivery-rate samples, but it calls its congestion
control on every packet sent, acked and lost. Subclassing Reno / Cubic (their window logic is
untouched) puts an estimator on those hooks; the classes are registered with aioquic's
`register_congestion_control` on import, as aioquic registers "reno" and "cubic". Finding a
connection's controller and its pacer state reads private attributes: `aioquic_private` does that.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aioquic.quic.congestion.base import QuicCongestionControl, register_congestion_control
from aioquic.quic.congestion.cubic import CubicCongestionControl
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.packet_builder import QuicSentPacket

from netsense.errors import ConfigError

from . import aioquic_private
from .estimator import SensingConfig, SensingState

if TYPE_CHECKING:
    from aioquic.quic.connection import QuicConnection

SENSING_CC = "netsense-reno"
"""Name of Reno with delivery-rate sensing, for `QuicConfiguration(congestion_control_algorithm=)`."""
SENSING_CUBIC_CC = "netsense-cubic"
"""Name of Cubic with delivery-rate sensing."""


class _SensingMixin(QuicCongestionControl):
    """Feeds `SensingState` from aioquic's congestion-control hooks; the wrapped CC sets the window."""

    sensing: SensingState

    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.sensing = SensingState(max_datagram_size)

    def on_packet_sent(self, *, packet: QuicSentPacket) -> None:
        self.sensing.on_sent(packet, self.congestion_window, self.bytes_in_flight)
        super().on_packet_sent(packet=packet)

    def on_packet_acked(self, *, now: float, packet: QuicSentPacket) -> None:
        self.sensing.on_acked(packet, now, self.congestion_window, self.bytes_in_flight)
        super().on_packet_acked(now=now, packet=packet)

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        packets = list(packets)  # iterated twice
        self.sensing.on_lost(packets, now, self.congestion_window, self.bytes_in_flight)
        super().on_packets_lost(now=now, packets=packets)

    def on_packets_expired(self, *, packets: Iterable[QuicSentPacket]) -> None:
        self.sensing.on_other(self.congestion_window, self.bytes_in_flight)
        super().on_packets_expired(packets=packets)

    def on_persistent_congestion(self) -> None:
        self.sensing.on_other(self.congestion_window, self.bytes_in_flight)
        super().on_persistent_congestion()

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        self.sensing.on_rtt(rtt, now)
        super().on_rtt_measurement(now=now, rtt=rtt)


class SensingReno(_SensingMixin, RenoCongestionControl):
    """aioquic's New Reno, plus delivery-rate and loss sensing."""


class SensingCubic(_SensingMixin, CubicCongestionControl):
    """aioquic's Cubic, plus delivery-rate and loss sensing."""


def ensure_registered() -> None:
    """Register `SENSING_CC` and `SENSING_CUBIC_CC` with aioquic (idempotent)."""
    register_congestion_control(SENSING_CC, SensingReno)
    register_congestion_control(SENSING_CUBIC_CC, SensingCubic)


def sensing_state(quic: QuicConnection) -> SensingState:
    """The estimator of `quic`; `ConfigError` if the connection does not use a sensing controller."""
    cc = aioquic_private.congestion_control(quic)
    if not isinstance(cc, _SensingMixin):
        raise ConfigError(
            f"connection uses congestion control {type(cc).__name__}, which records no delivery "
            f"samples; set QuicConfiguration(congestion_control_algorithm={SENSING_CC!r}) "
            f"(or {SENSING_CUBIC_CC!r}) after importing netsense.transport.sensing.congestion"
        )
    return cc.sensing


def attach(quic: QuicConnection, config: SensingConfig | None = None) -> SensingState:
    """Wire the estimator of `quic` to the connection's pacer state; optionally set its windows.

    With this the app-limited check can tell "the pacer held the burst back" from "nothing to send".
    A weak reference avoids a cycle connection -> recovery -> controller -> connection.
    """
    state = sensing_state(quic)
    ref = weakref.ref(quic)

    def pacing_until() -> float | None:
        conn = ref()
        return None if conn is None else aioquic_private.pacing_at(conn)

    state.pacing_until = pacing_until
    if config is not None:
        state.configure(config)
    return state


# Registered on import, as aioquic registers "reno" and "cubic": a configuration naming SENSING_CC
# then works wherever this module has been imported (transport/tls.py and sensing/signal.py import it).
ensure_registered()
