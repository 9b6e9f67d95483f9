"""Prometheus metrics for the PS and workers, read from live objects at scrape time.

Collectors pull values when Prometheus scrapes, so nothing is added to the training hot path
and the components (ps, worker) need not know that metrics exist.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from netsense.errors import ConfigError
from netsense.transport.sensing.aioquic_private import smoothed_rtt

log = logging.getLogger(__name__)


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    g.add_metric(list((labels or {}).values()), value)
    return g


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class PSCollector(Collector):
    """Metrics of one `PSServer`."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        s, store = self.server, self.server.store
        yield _gauge("netsense_ps_version", "Parameter version (applied updates).", store.version)
        yield _counter("netsense_ps_steps_applied", "Updates applied since start.", store.applied_steps)
        yield _gauge("netsense_ps_live_workers", "Workers in the sync barrier.", len(store.live))
        yield _gauge("netsense_ps_max_staleness", "Async mode: largest staleness of an applied gradient (0 in sync mode).", store.max_staleness)
        yield _counter("netsense_ps_errors_sent", "ERROR replies sent to peers.", s.errors_sent)
        yield _counter("netsense_ps_wan_first_held_seconds", "Seconds local pulls waited for other sites' replies.", s.release.held_s)
        up = CounterMetricFamily("netsense_ps_bytes_received", "Bytes received per worker.", labels=["worker"])
        down = CounterMetricFamily("netsense_ps_bytes_sent", "Bytes sent per worker.", labels=["worker"])
        rtt = GaugeMetricFamily("netsense_ps_srtt_seconds", "Smoothed RTT per worker connection.", labels=["worker"])
        for wid, session in list(s.sessions.items()):
            up.add_metric([wid], session.conn.bytes_in)
            down.add_metric([wid], session.conn.bytes_out)
            srtt = smoothed_rtt(session.conn.quic)
            if srtt is not None:
                rtt.add_metric([wid], srtt)
        yield from (up, down, rtt)


class WorkerCollector(Collector):
    """Metrics of one `NetSenseOptimizer`: steps, bytes, step-time breakdown, level, link signal."""

    def __init__(self, opt: Any) -> None:
        self.opt = opt

    def collect(self) -> Iterator[Metric]:
        opt = self.opt
        last = opt.last
        yield _gauge("netsense_worker_version", "Parameter version of this replica.", max(opt.version, 0))
        yield _counter("netsense_worker_bytes_up", "Bytes sent to the PS.", opt.bytes_up)
        yield _counter("netsense_worker_bytes_down", "Bytes received from the PS.", opt.bytes_down)
        breakdown = GaugeMetricFamily("netsense_worker_step_seconds", "Last step's time by phase.", labels=["phase"])
        for phase in ("compute", "encode", "push", "wait", "decode", "apply"):
            breakdown.add_metric([phase], getattr(last, f"{phase}_s", 0.0))
        yield breakdown
        yield _counter("netsense_worker_nonfinite_keys", "Keys pushed as zero: their local gradient held NaN/inf.",
                       getattr(opt, "nonfinite_keys", 0))  # fmt: skip
        yield _counter("netsense_worker_clamped_values", "Values sent clamped to a 16-bit type's finite range.",
                       getattr(opt, "clamped_values", 0))  # fmt: skip
        yield _gauge("netsense_worker_staleness", "Async PS: staleness of the last step's gradient.", getattr(last, "staleness", 0))
        yield _gauge("netsense_worker_level", "Codec of the last step (label).", 1.0, {"codec": last.codec or "none"})
        latest = getattr(getattr(opt, "uplink", None), "last", None)
        if latest is None:
            return
        decision, link = latest
        if decision.level is not None:
            yield _gauge("netsense_worker_level_index", "Ladder index of the last uplink level (0 = lossless).", decision.level)
        for name, value, doc in (
            ("bandwidth_bytes_per_second", link.bandwidth_Bps, "Bottleneck bandwidth estimate of the PS path."),
            ("min_rtt_seconds", link.min_rtt_s, "Minimum RTT of the PS path."),
            ("srtt_seconds", link.srtt_s, "Smoothed RTT of the PS path."),
            ("queue_delay_seconds", link.queue_delay_s, "Standing queue estimate: srtt - min RTT."),
            ("loss_rate", link.loss_rate, "Recent fraction of packets lost."),
        ):
            if value is not None:
                yield _gauge(f"netsense_worker_link_{name}", doc, float(value))


class MetricsServer:
    """A running /metrics endpoint; `close()` stops its thread.

    It binds 127.0.0.1 unless told otherwise: the endpoint has no authentication, so another
    address (``--metrics-host 0.0.0.0``) exposes the job's figures to whoever reaches it."""

    def __init__(self, collector: Collector, port: int, host: str = "127.0.0.1") -> None:
        registry = CollectorRegistry()
        registry.register(collector)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:  # a port in use, an address not on this machine
            raise ConfigError(f"--metrics-host/--metrics-port: cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        self.port: int = self._server.server_address[1]
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
