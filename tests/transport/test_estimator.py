"""transport/sensing/estimator.py and filters.py: the estimator's rules, fed synthetic packets.

A sensing Reno controller is driven with hand-made `QuicSentPacket`s over a simulated path, so
every rule (rate samples, the app-limited bubble, flight re-basing, push rate, loss window) is
checked deterministically.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch

from netsense.errors import ConfigError
from netsense.transport.sensing import estimator, filters
from netsense.transport.sensing.congestion import SensingReno
from netsense.transport.sensing.estimator import SensingConfig, SensingState
from netsense.transport.sensing.filters import WindowedMax

MDS = 1200


def test_sensing_config_rejects_bad_windows() -> None:
    with pytest.raises(ConfigError, match="loss_window_s"):
        SensingConfig(loss_window_s=0)


def _packet(number: int, sent_time: float, size: int = MDS) -> QuicSentPacket:
    return QuicSentPacket(
        epoch=Epoch.ONE_RTT, in_flight=True, is_ack_eliciting=True, is_crypto_packet=False,
        packet_number=number, packet_type=QuicPacketType.ONE_RTT, sent_time=sent_time,
        sent_bytes=size,
    )


class Flow:
    """Drives a sensing controller with synthetic packets: a sender and a fixed-rate, fixed-RTT path."""

    def __init__(self, cc: SensingReno | None = None) -> None:
        self.cc = cc or SensingReno(max_datagram_size=MDS)
        self.cc.sensing.pacing_until = lambda: None  # as if attached, pacer never in the way
        self.number = 0

    def send(self, count: int, at: float) -> list[QuicSentPacket]:
        packets = []
        for _ in range(count):
            packet = _packet(self.number, at)
            self.number += 1
            self.cc.on_packet_sent(packet=packet)
            packets.append(packet)
        return packets

    def fill(self, at: float) -> list[QuicSentPacket]:
        """Send as many packets as the congestion window allows (a bulk sender)."""
        room = (self.cc.congestion_window - self.cc.bytes_in_flight) // MDS
        return self.send(max(room, 0), at)

    def run(self, start: float, seconds: float, rate_Bps: float, rtt: float) -> float:
        """Bulk transfer over a path of `rate_Bps` with a FIFO queue and base RTT `rtt`; returns the end."""
        spacing = MDS / rate_Bps
        inflight = self.fill(start)
        last_ack = start
        while last_ack < start + seconds:
            packet = inflight.pop(0)
            last_ack = max(last_ack + spacing, packet.sent_time + rtt)
            self.cc.on_packet_acked(now=last_ack, packet=packet)
            self.cc.on_rtt_measurement(now=last_ack, rtt=last_ack - packet.sent_time)
            inflight += self.fill(last_ack)
        for packet in inflight:  # the application stops: drain what is in flight
            last_ack = max(last_ack + spacing, packet.sent_time + rtt)
            self.cc.on_packet_acked(now=last_ack, packet=packet)
        self.cc.sensing.flush()
        return last_ack


def test_a_delivery_is_timed_by_the_ack_that_completes_it() -> None:
    """`when_delivered` fires from the ack that takes the count past the bytes watched, with that
    ack's time, once; watches registered later count from their own start; 0 bytes fire at once."""
    flow = Flow()
    packets = flow.send(4, at=0.0)
    fired: list[tuple[str, float]] = []
    flow.cc.sensing.when_delivered(2 * MDS, lambda at: fired.append(("first two", at)))
    flow.cc.sensing.when_delivered(4 * MDS, lambda at: fired.append(("all four", at)))
    for i, packet in enumerate(packets[:2]):
        flow.cc.on_packet_acked(now=0.01 * (i + 1), packet=packet)
    assert fired == [("first two", 0.02)]
    flow.cc.sensing.when_delivered(MDS, lambda at: fired.append(("one more", at)))  # from 2 delivered
    flow.cc.on_packet_acked(now=0.03, packet=packets[2])
    assert fired[1:] == [("one more", 0.03)]
    flow.cc.on_packet_acked(now=0.04, packet=packets[3])
    flow.cc.sensing.when_delivered(0, lambda at: fired.append(("nothing", at)))
    assert fired[2:] == [("all four", 0.04), ("nothing", 0.04)]


def test_delivery_rate_matches_a_synthetic_bottleneck() -> None:
    flow = Flow()
    flow.run(start=0.0, seconds=2.0, rate_Bps=1e6, rtt=0.02)
    state = flow.cc.sensing
    assert state.bandwidth.value == pytest.approx(1e6, rel=0.05)
    assert state.rate_samples > 1000
    assert state.app_limited_samples < 0.05 * state.rate_samples  # only the final drain


def test_app_limited_samples_never_lower_the_estimate() -> None:
    flow = Flow()
    t = flow.run(start=0.0, seconds=1.0, rate_Bps=1e6, rtt=0.02)
    estimate = flow.cc.sensing.bandwidth.value
    assert estimate == pytest.approx(1e6, rel=0.05)
    # Now the application sends one packet per 50 ms (compressed gradients): far below the window.
    for _ in range(200):  # 10 s, well past the bandwidth window
        t += 0.05
        (packet,) = flow.send(1, t)
        flow.cc.on_packet_acked(now=t + 0.025, packet=packet)
        flow.cc.on_rtt_measurement(now=t + 0.025, rtt=0.025)
    state = flow.cc.sensing
    state.flush()
    assert state.latest_sample is not None and state.latest_sample.app_limited
    assert state.latest_sample.delivery_rate_Bps < estimate / 10
    assert state.app_limited_samples >= 190
    assert state.bandwidth.value == estimate


def test_app_limited_sample_may_raise_the_estimate() -> None:
    state = SensingState(MDS)
    state.bandwidth.update(0.0, 1e6)
    state.min_rtt_s = 0.01
    tx = estimator._TxState(delivered=0, delivered_time=0.0, first_sent_time=0.0, sent_time=0.01, app_limited=True)
    state.delivered = 50_000
    state._pending = (0.02, tx)  # 50 kB over 20 ms = 2.5 MB/s, app-limited
    state.flush()
    assert state.bandwidth.value == pytest.approx(2.5e6)


def test_bubble_marks_packets_until_in_flight_data_is_delivered() -> None:
    flow = Flow()
    first = flow.send(3, at=0.0)  # window 12000 bytes, 3600 in flight, nothing more to send
    (second,) = flow.send(1, at=0.001)  # next burst: the first one ended with window to spare
    assert not any(p.netsense_tx.app_limited for p in first)
    assert second.netsense_tx.app_limited
    for p in first:
        flow.cc.on_packet_acked(now=0.02, packet=p)
    bulk = flow.fill(at=0.02)  # `second` (sent in the bubble) not delivered yet: still marked
    assert bulk and all(p.netsense_tx.app_limited for p in bulk)
    flow.cc.on_packet_acked(now=0.021, packet=second)
    assert flow.cc.sensing.app_limited  # the bubble covers what was in flight when it (re)opened
    flow.cc.on_packet_acked(now=0.04, packet=bulk[0])
    assert not flow.cc.sensing.app_limited  # data sent after the bubble got through


def test_restart_with_nothing_in_flight_closes_the_bubble() -> None:
    """A new push after everything was delivered: the idle time is in no sample interval, and the
    application had the push queued, so its packets are not app-limited."""
    flow = Flow()
    first = flow.send(3, at=0.0)
    (second,) = flow.send(1, at=0.001)
    for p in first + [second]:
        flow.cc.on_packet_acked(now=0.02, packet=p)
    push = flow.fill(at=0.8)
    assert push and not any(p.netsense_tx.app_limited for p in push)
    assert all(p.netsense_tx.flight == 0.8 for p in push)  # re-based on the flight's first ack


def _push(
    flow: Flow, at: float, count: int, rate_Bps: float, rtt: float, per_ack: int = 2, tail_rate_Bps: float | None = None
) -> float:
    """One push after a compute gap, all `count` packets in one burst (the window holds them), through
    a bottleneck of `rate_Bps` (`tail_rate_Bps` for the second half) and base RTT `rtt`; the receiver
    acks every `per_ack` packets."""
    packets = flow.send(count, at)
    departed, now = at, at
    for i, packet in enumerate(packets):
        rate = tail_rate_Bps if tail_rate_Bps is not None and i >= count // 2 else rate_Bps
        departed += MDS / rate
        if i % per_ack == per_ack - 1 or i == count - 1:
            now = departed + rtt
            for p in packets[i - i % per_ack : i + 1]:
                flow.cc.on_packet_acked(now=now, packet=p)
            flow.cc.on_rtt_measurement(now=now, rtt=now - at)
    flow.cc.sensing.flush()
    return now


def test_push_sent_in_one_flight_gives_a_trusted_rate() -> None:
    """The uplink defect (docs/BENCHMARKS.md, rate step): a push after a compute gap is one burst sent
    before its first ack. Stamped from the flight's start, every sample carried one RTT and was
    app-limited, so the estimate stayed a lower bound at about half the rate (150 kB at 50 Mbit/s,
    20 ms RTT: 25 Mbit/s). Re-based on the first ack, the ack train measures the bottleneck."""
    flow = Flow()
    flow.cc.congestion_window = 1 << 24  # Reno's window grew while app-limited: it holds any push
    rate, rtt = 6.25e6, 0.020  # 50 Mbit/s
    for i in range(4):
        _push(flow, at=i * 1.0, count=150, rate_Bps=rate, rtt=rtt)  # 180 kB: 29 ms at the bottleneck
    state = flow.cc.sensing
    assert state.latest_sample is not None and not state.latest_sample.app_limited
    assert state.bandwidth.value == pytest.approx(rate, rel=0.05)
    assert state.bandwidth_trusted
    # read later, between pushes (nothing in flight): still trusted, whatever the moment
    (ping,) = flow.send(1, at=4.5)  # e.g. a control message: its lone sample is a lower bound
    flow.cc.on_packet_acked(now=4.53, packet=ping)
    state.flush()
    assert state.latest_sample is not None and state.latest_sample.app_limited
    assert state.bandwidth_trusted and state.bandwidth.value == pytest.approx(rate, rel=0.05)


def _windowed_push(flow: Flow, at: float, count: int, rates: tuple[float, float], rtt: float) -> float:
    """A push of `count` packets sent as the window allows (a window-limited sender) through a FIFO
    bottleneck that serves the first half at rates[0] and the second half at rates[1]."""
    pending: list[tuple[float, QuicSentPacket]] = []  # (ack time, packet), FIFO
    sent, departed, now = 0, at, at

    def send(t: float) -> None:
        nonlocal sent, departed
        room = (flow.cc.congestion_window - flow.cc.bytes_in_flight) // MDS
        for packet in flow.send(max(0, min(room, count - sent)), t):
            departed = max(departed, t) + MDS / rates[0 if sent < count // 2 else 1]
            pending.append((departed + rtt, packet))
            sent += 1

    send(at)
    while pending:
        now, packet = pending.pop(0)
        flow.cc.on_packet_acked(now=now, packet=packet)
        flow.cc.on_rtt_measurement(now=now, rtt=now - packet.sent_time)
        send(now)
    flow.cc.sensing.flush()
    return now


def test_push_rate_is_what_a_shared_push_really_got() -> None:
    """Two workers push at once through one bottleneck: each gets half while both send and the whole
    link for its tail. The max filter reads the full rate; the push rate, the average over the push
    (what the next push's time depends on), reads between. A drop during a push shows the same way."""
    flow = Flow()
    full = 2.5e6  # 20 Mbit/s
    _windowed_push(flow, at=0.0, count=600, rates=(full / 2, full), rtt=0.020)
    state = flow.cc.sensing
    assert state.bandwidth.value == pytest.approx(full, rel=0.1)
    assert state.push_rate_Bps is not None and full / 2 < state.push_rate_Bps < 0.8 * full
    # the next push meets a link that fell to a fifth halfway: the max still holds the old samples
    _windowed_push(flow, at=2.0, count=600, rates=(full, full / 5), rtt=0.020)
    assert state.bandwidth.value == pytest.approx(full, rel=0.1)
    assert state.push_rate_Bps is not None and state.push_rate_Bps < full / 2.5


def test_push_shorter_than_min_rtt_stays_a_lower_bound() -> None:
    """A push that passes the bottleneck in less than one min RTT gives no interval long enough to
    trust (ack compression could fake any rate): its samples stay app-limited lower bounds."""
    flow = Flow()
    flow.cc.congestion_window = 1 << 24
    _push(flow, at=0.0, count=20, rate_Bps=6.25e6, rtt=0.020)  # 24 kB: 4 ms at the bottleneck
    state = flow.cc.sensing
    assert not state.bandwidth_trusted
    assert state.bandwidth.value is not None and state.bandwidth.value < 6.25e6 / 2


def test_recent_rtt_ignores_the_queue_a_push_builds_itself() -> None:
    """Each push starts on an empty queue: the windowed min RTT stays at the path's RTT while srtt
    carries the queue the push built (srtt was what shrank the bandwidth of the policy)."""
    flow = Flow()
    flow.cc.congestion_window = 1 << 24
    for i in range(3):
        _push(flow, at=i * 1.0, count=400, rate_Bps=6.25e6, rtt=0.020)  # 77 ms of own queue at the end
    state = flow.cc.sensing
    assert state.recent_rtt.value == pytest.approx(0.020, abs=0.001)
    assert state.srtt_s is not None and state.srtt_s > 0.05


def test_window_full_burst_is_not_app_limited() -> None:
    flow = Flow()
    first = flow.send(10, at=0.0)  # initial window is 10 packets: cwnd-limited, not app-limited
    flow.cc.on_packet_acked(now=0.02, packet=first[0])
    (nxt,) = flow.send(1, at=0.02)
    assert not nxt.netsense_tx.app_limited


def test_paced_burst_is_not_app_limited() -> None:
    flow = Flow()
    flow.cc.on_rtt_measurement(now=0.0, rtt=0.02)
    flow.cc.sensing.pacing_until = lambda: 0.0005  # the pacer stopped the burst until t=0.5 ms
    flow.send(2, at=0.0)
    (nxt,) = flow.send(1, at=0.0005)  # sent when the pacer allowed it: the sender had data
    assert not nxt.netsense_tx.app_limited


def test_burst_sent_long_after_the_pacer_allowed_is_app_limited() -> None:
    """aioquic checks the pacer before looking for data: a late next burst means the data ran out."""
    flow = Flow()
    flow.cc.on_rtt_measurement(now=0.0, rtt=0.02)
    flow.cc.sensing.pacing_until = lambda: 0.0005
    flow.send(2, at=0.0)
    (nxt,) = flow.send(1, at=0.015)
    assert nxt.netsense_tx.app_limited


def test_windowed_max_expires_old_samples() -> None:
    filt = WindowedMax(window_s=2.0)
    filt.update(0.0, 10.0)
    filt.update(1.0, 4.0)
    filt.update(1.5, 6.0)
    assert filt.value == 10.0
    filt.update(2.5, 1.0)  # 10.0 at t=0 is now older than the window
    assert filt.value == 6.0
    filt.update(3.6, 2.0)  # 6.0 at t=1.5 expired too
    assert filt.value == 2.0
    assert filt.latest_time == 3.6


def test_bandwidth_window_follows_srtt() -> None:
    state = SensingState(MDS, SensingConfig(bandwidth_window_s=1.0, bandwidth_window_rtts=10))
    state.on_rtt(0.5)
    state.delivered = 10_000
    state._pending = (1.0, estimator._TxState(0, 0.0, 0.0, 0.0, False))
    state.flush()  # the window is resized when a sample is admitted
    assert state.bandwidth.window_s == pytest.approx(5.0)
    state.configure(SensingConfig(bandwidth_window_s=8.0))
    assert state.bandwidth.window_s == pytest.approx(8.0)


def test_losses_are_counted_from_synthetic_packets() -> None:
    flow = Flow()
    packets = flow.send(10, at=0.001)
    for p in packets[:6]:
        flow.cc.on_packet_acked(now=0.02, packet=p)
    window_before = flow.cc.congestion_window
    flow.cc.on_packets_lost(now=0.03, packets=iter(packets[6:9]))  # an iterator: consumed twice inside
    state = flow.cc.sensing
    assert state.lost_packets == 3 and state.lost_bytes == 3 * MDS
    assert state.losses.rate == pytest.approx(3 / 9)
    assert flow.cc.congestion_window < window_before  # Reno still reacts to the loss
    assert flow.cc.bytes_in_flight == MDS
    flow.cc.on_packets_expired(packets=[packets[9]])  # a PTO retransmission is not a loss
    assert state.lost_packets == 3 and flow.cc.bytes_in_flight == 0


def test_loss_rate_window_forgets_old_losses() -> None:
    state = SensingState(MDS, SensingConfig(loss_window_s=1.0))
    state.losses.on_lost(0.0, 5)
    state.losses.on_acked(0.1, 5)
    assert state.losses.rate == pytest.approx(0.5)
    for i in range(20):
        state.losses.on_acked(1.5 + i * 0.01)
    assert state.losses.rate == 0.0


def test_estimator_modules_import_no_aioquic() -> None:
    """The estimator is pure: it must stay testable, and unchanged, whatever aioquic does."""
    for module in (estimator, filters):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("aioquic", "asyncio")], module.__name__
