"""transport/sensing/signal.py: snapshots of a real aioquic client/server pair over loopback.

A bulk transfer runs client -> server; the client's sensing controller must see delivery samples,
a plausible bandwidth estimate, RTTs and monotone counters. With the link emulator in between, the
estimate must find the emulated rate and propagation delay.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent, StreamDataReceived

from quic_certs import self_signed
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError
from netsense.transport.sensing.aioquic_private import bound_port, connection_of
from netsense.transport.sensing.congestion import SENSING_CC
from netsense.transport.sensing.estimator import SensingConfig
from netsense.transport.sensing.signal import NetworkSignal, SignalReader, fallback_bandwidth, read_signal

MONOTONE = ("lost_packets", "lost_bytes", "sent_packets", "bytes_sent", "delivered_bytes", "rate_samples")
CHUNK = 256 * 1024


async def _serve(configuration: QuicConfiguration, **kw: Any) -> tuple[QuicServer, int]:
    """An aioquic server on a port the kernel picks (no window for another test to take it), and that port."""
    server = await serve("127.0.0.1", 0, configuration=configuration, **kw)
    return server, bound_port(server)


@dataclass
class Sink:
    """Bytes the server received, and when the first and last arrived."""

    received: int = 0
    first: float | None = None
    last: float = 0.0
    marks: list[tuple[float, int]] = field(default_factory=list)

    def add(self, size: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        self.received += size
        self.marks.append((now, self.received))

    def peak_rate(self, span_s: float) -> float:
        """The highest goodput over any `span_s` stretch, bytes/s (compares with a max filter)."""
        best, j = 0.0, 0
        for t, total in self.marks:
            while self.marks[j][0] < t - span_s:
                j += 1
            if t - self.marks[j][0] >= span_s / 2:
                best = max(best, (total - self.marks[j][1]) / (t - self.marks[j][0]))
        return best


def _sink_protocol(sink: Sink) -> type[QuicConnectionProtocol]:
    class SinkProtocol(QuicConnectionProtocol):
        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, StreamDataReceived):
                sink.add(len(event.data))

    return SinkProtocol


@dataclass
class BulkResult:
    """What one bulk transfer produced."""

    signals: list[NetworkSignal]
    """Snapshots every 50 ms, bulk phase then trickle phase."""
    goodput_Bps: float
    """Stream bytes the server received per second during the bulk phase."""
    peak_goodput_Bps: float
    """The best 200 ms of that goodput."""
    bulk_signals: int
    """How many of `signals` were read during the bulk phase."""
    app_limited_samples: int
    """Delivery samples flagged app-limited, over the whole run."""
    drained: NetworkSignal | None
    """Read once the bulk backlog was delivered, just before the trickle (None without one)."""
    app_limited_counts: list[int] = field(default_factory=list)
    """`SensingState.app_limited_samples` at each of `signals` (which samples were app-limited)."""


async def bulk_transfer(
    seconds: float, *, via_emulator: str | None = None, trickle_s: float = 0.0, window_s: float | None = None,
    min_bytes: int = 0, max_seconds: float = 60.0,
) -> BulkResult:
    """Send as fast as the connection allows for `seconds` (and on, up to `max_seconds`, until
    `min_bytes` were delivered: a starved CPU moves less per second, and counts of packets and
    samples should not depend on the load), then 3 kB every 20 ms for `trickle_s`
    (an application sending small compressed steps: 3 packets, too few for an ack train, so every
    sample is app-limited; `estimator.MIN_TRAIN_PACKETS`); read a signal every 50 ms."""
    cert, key = self_signed()
    server_cfg = QuicConfiguration(is_client=False, max_data=1 << 26, max_stream_data=1 << 26)
    server_cfg.certificate, server_cfg.private_key = cert, key
    client_cfg = QuicConfiguration(
        is_client=True, verify_mode=ssl.CERT_NONE, congestion_control_algorithm=SENSING_CC,
    )
    sink = Sink()
    server, port = await _serve(server_cfg, create_protocol=_sink_protocol(sink))
    emulator = None
    try:
        host, target = "127.0.0.1", port
        if via_emulator is not None:
            from netsense.transport.emulation.emulator import LinkEmulator

            emulator = LinkEmulator(upstream=("127.0.0.1", port), spec=via_emulator)
            await emulator.start()
            host, target = emulator.address
        async with connect(host, target, configuration=client_cfg) as client:
            quic = connection_of(client)
            reader = SignalReader(quic, None if window_s is None else SensingConfig(bandwidth_window_s=window_s))
            loop = asyncio.get_running_loop()
            stream_id = quic.get_next_available_stream_id()
            chunk = b"\0" * CHUNK
            written = 0
            signals = []
            counts: list[int] = []
            start = loop.time()
            next_read = start
            while loop.time() < start + seconds or (reader.state.delivered < min_bytes and loop.time() < start + max_seconds):
                # aioquic has no backpressure: keep ~2 MB queued ahead of what went out, no more
                while written - reader.state.delivered < 2 * 1024 * 1024:
                    quic.send_stream_data(stream_id, chunk)
                    written += CHUNK
                client.transmit()
                await asyncio.sleep(0.002)
                if loop.time() >= next_read:
                    signals.append(reader.read(now=loop.time()))
                    counts.append(reader.state.app_limited_samples)
                    next_read += 0.05
            signals.append(reader.read(now=loop.time()))
            counts.append(reader.state.app_limited_samples)
            bulk_signals = len(signals)
            assert sink.first is not None
            goodput = sink.received / max(sink.last - sink.first, 1e-3)
            peak = sink.peak_rate(0.2)
            drained = None
            if trickle_s:
                # let the bulk backlog drain first, or the "trickle" is still bulk
                deadline = loop.time() + 5.0
                while reader.state.delivered < written and loop.time() < deadline:
                    await asyncio.sleep(0.01)
                drained = reader.read(now=loop.time())
            end = loop.time() + trickle_s
            while loop.time() < end:
                quic.send_stream_data(stream_id, chunk[:3_000])
                client.transmit()
                await asyncio.sleep(0.02)
                signals.append(reader.read(now=loop.time()))
                counts.append(reader.state.app_limited_samples)
            client.close()
        return BulkResult(signals, goodput, peak, bulk_signals, reader.state.app_limited_samples, drained, counts)
    finally:
        if emulator is not None:
            await emulator.close()
        server.close()


def _assert_monotone(signals: list[NetworkSignal]) -> None:
    for before, after in zip(signals, signals[1:]):
        assert after.timestamp >= before.timestamp
        for name in MONOTONE:
            assert getattr(after, name) >= getattr(before, name), name


async def test_bulk_transfer_on_loopback_gives_a_plausible_signal() -> None:
    # the uplink's window (worker/uplink.py); 4 MB at least, so the counts below hold on a starved CPU
    result = await bulk_transfer(1.5, trickle_s=1.0, window_s=0.25, min_bytes=4_000_000)
    _assert_monotone(result.signals)
    last = result.signals[result.bulk_signals - 1]
    assert last.rate_samples > 100 and last.delivery_rate is not None
    assert last.bandwidth is not None and last.bandwidth > 0
    # Unshaped loopback: the receiver's CPU is the bottleneck, so on an idle machine the max-filtered
    # delivery rate and the best 200 ms of goodput are the same order (headers put the estimate ~4 %
    # above). Not asserted: with the CPU starved (load 2-5 on 2 cores) acks arrive in clumps and the
    # max filter ran to 4.15x the goodput, so the accuracy is a benchmark figure (`netsense probe`
    # without --link, docs/BENCHMARKS.md), not a property of the estimator this test can hold.
    ratio = last.bandwidth / result.peak_goodput_Bps
    print(f"loopback goodput {result.goodput_Bps / 1e6:.1f} MB/s (peak {result.peak_goodput_Bps / 1e6:.1f}), "
          f"estimate {last.bandwidth / 1e6:.1f} MB/s, "
          f"ratio {ratio:.2f}, srtt {last.srtt}, min_rtt {last.min_rtt}, cwnd {last.cwnd}, "
          f"lost {last.lost_packets}/{last.sent_packets}, app-limited samples {result.app_limited_samples}")
    # A bulk sender fills its window or is held by the pacer, so its estimate is trusted. Not read
    # off the last snapshot alone: with the loop starved, the newest 0.25 s window can hold only
    # the app-limited first flight of a restart (seen with two busy loops beside the test); most
    # reads of the bulk phase must be trusted. (Most single samples are app-limited even on an
    # idle machine: the first batch of each flight and short trains, `estimator.MIN_TRAIN_PACKETS`.)
    bulk_app_limited = result.app_limited_counts[result.bulk_signals - 1]
    trusted_reads = sum(not s.app_limited for s in result.signals[: result.bulk_signals])
    print(f"bulk: {bulk_app_limited} of {last.rate_samples} samples app-limited; {trusted_reads} of {result.bulk_signals} reads trusted")
    assert trusted_reads > result.bulk_signals / 2
    assert last.min_rtt is not None and last.min_rtt > 0
    assert last.srtt is not None and last.srtt >= last.min_rtt
    assert 0.0 <= last.loss_rate <= 1.0
    assert last.sent_packets > 1000 and last.delivered_bytes > 1_000_000
    link = last.to_link_state()
    assert isinstance(link, LinkState)
    # the policies plan with the rate the busy period (here the whole bulk phase) really got
    # (how close push_rate comes to the goodput is a rate figure again: on a starved CPU it was 0.42x
    # the whole phase's goodput, its last busy period being slower; so it is printed, and what is
    # asserted is that one was measured in most reads and how the link state uses it)
    bulk = result.signals[: result.bulk_signals]
    measured = [s for s in bulk if s.push_rate is not None]
    print(f"push_rate in {len(measured)} of {len(bulk)} reads; last {last.push_rate and last.push_rate / result.goodput_Bps:.2f}x goodput")
    assert len(measured) > len(bulk) / 2
    assert all(s.to_link_state().bandwidth_Bps == min(s.bandwidth, s.push_rate) for s in measured if s.bandwidth is not None)
    if last.push_rate is None:
        assert link.bandwidth_Bps == last.bandwidth
    else:
        assert link.bandwidth_Bps == min(last.bandwidth, last.push_rate)
    assert link.min_rtt_s == last.min_rtt and link.cwnd_bytes == last.cwnd

    # Then the application sends ~0.15 MB/s: its samples are app-limited and must not drag the
    # estimate down, however long it lasts (BBR's rule). Trust outlives the bulk phase by one
    # bandwidth window (the max still rests on its samples), not longer.
    # The reference is the estimate once the backlog drained, not at the end of the bulk phase: the
    # backlog's last packets are bulk samples too, and on a starved CPU they may rightly lower it
    # (their window-mates expired) before the first trickle byte is sent.
    trickle = result.signals[result.bulk_signals:]
    final = trickle[-1]
    drained = result.drained
    assert drained is not None and drained.bandwidth is not None
    assert final.app_limited
    assert final.delivery_rate is not None and final.delivery_rate < drained.bandwidth
    # BBR's rule, read between snapshots: where every new sample was app-limited, the estimate did
    # not go down. (On a starved CPU the pacer may hold a 3-packet burst back, which makes it a
    # trusted sample that may rightly lower the estimate, so the rule is checked per interval.)
    counts = result.app_limited_counts[result.bulk_signals - 1 :]
    before = [drained, *trickle[:-1]]
    steps = list(zip(before, trickle, counts, counts[1:]))
    only_app_limited = [
        (a, b) for a, b, ca, cb in steps if b.rate_samples > a.rate_samples and cb - ca == b.rate_samples - a.rate_samples
    ]
    print(f"trickle: {len(only_app_limited)} of {len(trickle)} reads saw only app-limited samples")
    assert len(only_app_limited) >= len(trickle) // 4  # the rule was exercised
    assert all(b.bandwidth >= a.bandwidth for a, b in only_app_limited)  # type: ignore[operator]


async def test_reading_before_any_traffic_gives_empty_estimates() -> None:
    """A fresh connection: no samples yet, so bandwidth is None and the link state falls back."""
    cert, key = self_signed()
    server_cfg = QuicConfiguration(is_client=False)
    server_cfg.certificate, server_cfg.private_key = cert, key
    client_cfg = QuicConfiguration(is_client=True, verify_mode=ssl.CERT_NONE, congestion_control_algorithm=SENSING_CC)
    server, port = await _serve(server_cfg)
    try:
        async with connect("127.0.0.1", port, configuration=client_cfg) as client:
            signal = read_signal(connection_of(client))
            # No loss on loopback; a PTO may fire (a timer, not a loss) when a loaded host delays
            # the handshake's ack: seen once in CI with two busy loops beside it.
            assert signal.lost_packets == 0 and signal.pto_count <= 2
            assert signal.min_rtt is not None and signal.min_rtt > 0  # the handshake was timed
            if signal.bandwidth is None:
                assert signal.to_link_state().bandwidth_Bps == signal.fallback_bandwidth
            assert signal.fallback_bandwidth is not None and signal.fallback_bandwidth > 0
            client.close()
    finally:
        server.close()


def test_fallback_is_capped_by_what_was_in_flight() -> None:
    """An app-limited sender's cwnd is no rate: the fallback uses min(cwnd, peak in flight) / srtt."""
    assert fallback_bandwidth(10_000_000, 0.01, 12_000) == pytest.approx(1.2e6)
    assert fallback_bandwidth(60_000, 0.01, 120_000) == pytest.approx(6e6)
    assert fallback_bandwidth(60_000, 0.01, None) == pytest.approx(6e6)
    assert fallback_bandwidth(60_000, None, None) is None
    signal = NetworkSignal(
        timestamp=0.0, cwnd=10_000_000, bytes_in_flight=1200, srtt=0.01, min_rtt=0.01, latest_rtt=0.01,
        rttvar=0.0, lost_packets=0, lost_bytes=0, sent_packets=10, pto_count=0, delivery_rate=None,
        standing_queue=0.0, bandwidth=None, push_rate=None, fallback_bandwidth=120_000.0, loss_rate=0.0, app_limited=True, bytes_sent=12_000,
        delivered_bytes=12_000, rate_samples=0,
    )
    assert signal.to_link_state().bandwidth_Bps == 120_000.0
    assert signal.to_link_state().app_limited


async def test_reader_refuses_a_connection_without_the_sensing_controller() -> None:
    cert, key = self_signed()
    server_cfg = QuicConfiguration(is_client=False)
    server_cfg.certificate, server_cfg.private_key = cert, key
    server, port = await _serve(server_cfg)
    try:
        async with connect("127.0.0.1", port, configuration=QuicConfiguration(
            is_client=True, verify_mode=ssl.CERT_NONE)) as client:
            with pytest.raises(ConfigError, match="congestion_control_algorithm"):
                SignalReader(connection_of(client))
            client.close()
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.serial
async def test_estimate_finds_an_emulated_20mbit_10ms_link() -> None:
    """The estimate finds the emulated rate (never below it) and the propagation delay.

    How close it comes from above is a benchmark figure (`netsense probe --link
    rate=20mbit,delay=10ms`, docs/BENCHMARKS.md): with the sender's loop starved (load 2-5 on two
    cores, or two busy loops beside it) acks are read in clumps, and a max filter of delivery-rate
    samples then overshoots (3.07 and 2.96 MB/s against 2.5 were seen while the relay carried the
    full link rate). Nothing bounds that overshoot but the CPU, so only the side the link itself
    bounds is asserted: the pipe was full, so its max delivery rate is at least what got through."""
    pytest.importorskip("netsense.transport.emulation.emulator")
    result = await bulk_transfer(3.0, via_emulator="rate=20mbit,delay=10ms")
    last = result.signals[-1]
    _assert_monotone(result.signals)
    link_Bps = 20e6 / 8
    print(f"emulated 20 mbit: estimate {last.bandwidth / 1e6:.3f} MB/s (link {link_Bps / 1e6:.3f}), goodput "
          f"{result.goodput_Bps / 1e6:.3f} MB/s, min_rtt {last.min_rtt}, srtt {last.srtt}, "
          f"lost {last.lost_packets}/{last.sent_packets}, loss_rate {last.loss_rate:.4f}")
    if result.goodput_Bps < 0.85 * link_Bps:
        # A healthy run carries ~96 % of the link rate as stream bytes (the rest is QUIC headers);
        # less means the CPU-starved relay is the bottleneck (seen at load average ~4 on 2 cores),
        # and the ack clumping of a starved loop inflates every max-filter estimate.
        pytest.skip(f"emulator could not sustain the link: goodput {result.goodput_Bps / 1e6:.2f} MB/s")
    # >= 0.85 of the link over 3 s, and at most the link in any second, means the estimator's last
    # 2 s window (SensingConfig.bandwidth_window_s) carried >= (3 * 0.85 - 1) / 2 = 0.775 of it.
    assert last.bandwidth >= 0.775 * link_Bps
    if last.bandwidth > 1.15 * link_Bps:
        print(f"estimate {last.bandwidth / link_Bps:.2f}x the link: ack clumping of a starved loop (see docstring)")
    one_way = 0.010
    assert last.min_rtt is not None
    assert abs(last.min_rtt - 2 * one_way) <= 0.25 * 2 * one_way + 0.001
