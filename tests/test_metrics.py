"""Prometheus endpoints of PS and worker, scraped and parsed with prometheus-client's parser."""

from __future__ import annotations

import urllib.request

import torch
from prometheus_client.parser import text_string_to_metric_families

from netsense.metrics import MetricsServer, PSCollector, WorkerCollector
from netsense.worker.optimizer import NetSenseOptimizer

from .conftest import RunningPS


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {m.name: [(s.labels, s.value) for s in m.samples] for m in text_string_to_metric_families(text)}


def test_ps_and_worker_metrics(ps: RunningPS) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = NetSenseOptimizer(model, connect=ps.connect_settings(), rank=0, worker_id="w0")
    ps_metrics = MetricsServer(PSCollector(ps.server), 0)
    w_metrics = MetricsServer(WorkerCollector(opt), 0)
    try:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            opt.step(samples=5)
        m = _scrape(ps_metrics.port)
        assert m["netsense_ps_version"] == [({}, 3.0)]
        assert m["netsense_ps_steps_applied"][0][1] == 3.0
        assert m["netsense_ps_live_workers"] == [({}, 1.0)]
        received = dict((s[0]["worker"], s[1]) for s in m["netsense_ps_bytes_received"] if s[0])
        assert received["w0"] > 0
        w = _scrape(w_metrics.port)
        assert w["netsense_worker_version"] == [({}, 3.0)]
        assert w["netsense_worker_bytes_up"][0][1] == opt.bytes_up > 0
        phases = {s[0]["phase"] for s in w["netsense_worker_step_seconds"]}
        assert phases == {"compute", "encode", "push", "wait", "decode", "apply"}
        assert w["netsense_worker_level_index"] == [({}, 0.0)]  # fp32: the lossless level
        assert w["netsense_worker_link_min_rtt_seconds"][0][1] > 0
        assert "netsense_worker_link_queue_delay_seconds" in w and "netsense_worker_link_loss_rate" in w
    finally:
        ps_metrics.close()
        w_metrics.close()
        opt.close()


def test_ps_command_serves_metrics(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    from netsense.launch.launcher import stop_processes

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "netsense", "ps", "--port", "0", "--metrics-port", "0"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        ready = json.loads(p.stdout.readline())  # type: ignore[union-attr]
        m = _scrape(ready["metrics_port"])
        assert m["netsense_ps_version"] == [({}, 0.0)]
    finally:
        stop_processes([p])
    assert p.returncode == 0


class _Empty:
    def collect(self):  # type: ignore[no-untyped-def]
        return iter(())


def test_metrics_host_binds_where_told_and_a_busy_port_is_a_config_error() -> None:
    import pytest

    from netsense.errors import ConfigError

    anywhere = MetricsServer(_Empty(), 0, host="0.0.0.0")  # type: ignore[arg-type]
    try:
        assert anywhere._server.server_address[0] == "0.0.0.0"
        _scrape(anywhere.port)  # reachable on loopback too
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{anywhere.port}"):
            MetricsServer(_Empty(), anywhere.port, host="127.0.0.1")  # type: ignore[arg-type]
    finally:
        anywhere.close()
    local = MetricsServer(_Empty(), 0)  # type: ignore[arg-type]
    try:
        assert local._server.server_address[0] == "127.0.0.1"  # the default stays loopback
    finally:
        local.close()
