"""transport/sensing/congestion.py: the sensing controllers on a real aioquic connection pair.

The pair (`quic_pair.py`) is in memory, with a simulated clock: deterministic, no sockets.
"""

from __future__ import annotations

import pytest
from aioquic.quic.congestion.base import create_congestion_control

from quic_pair import MDS, Pair, loaded_pair
from netsense.errors import ConfigError
from netsense.transport.sensing import congestion
from netsense.transport.sensing.aioquic_private import congestion_control
from netsense.transport.sensing.congestion import SENSING_CC, SENSING_CUBIC_CC, SensingCubic, SensingReno


@pytest.fixture
def pair() -> Pair:
    return loaded_pair()


def test_sensing_counts_deliveries_on_a_real_connection(pair: Pair) -> None:
    state = congestion.sensing_state(pair.client)
    state.flush()
    assert state.delivered >= 200_000
    assert state.sent_packets >= 200_000 // MDS
    assert state.rate_samples > 0 and state.bandwidth.value is not None
    assert state.lost_packets == 0
    assert state.min_rtt_s == pytest.approx(2 * Pair.DELAY, rel=0.2)


def test_plain_reno_connection_is_refused_with_the_fix_in_the_message() -> None:
    p = Pair(cc="reno")
    with pytest.raises(ConfigError, match=SENSING_CC):
        congestion.sensing_state(p.client)


def test_both_controllers_are_registered() -> None:
    congestion.ensure_registered()
    assert type(create_congestion_control(SENSING_CC, max_datagram_size=MDS)) is SensingReno
    assert type(create_congestion_control(SENSING_CUBIC_CC, max_datagram_size=MDS)) is SensingCubic
    p = Pair(cc=SENSING_CUBIC_CC)
    assert type(congestion_control(p.client)) is SensingCubic
    p.client.send_stream_data(p.client.get_next_available_stream_id(), b"x" * 100_000)
    p.exchange(rounds=20)
    state = congestion.attach(p.client)
    state.flush()
    assert state.delivered >= 100_000 and state.rate_samples > 0
    assert state.inflight_peak.value is not None and state.inflight_peak.value > 10 * MDS
