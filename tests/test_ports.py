"""The test suite's own port helper (tests/conftest.py): ports that survive a restart under xdist."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.conftest import reusable_port


def test_reusable_ports_sit_below_the_ephemeral_range_in_this_workers_band(monkeypatch: pytest.MonkeyPatch) -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for worker, top in (("gw0", low), ("gw2", low - 2000)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ports = {reusable_port() for _ in range(5)}
        assert len(ports) == 5 and all(top - 1000 <= p < top for p in ports), (worker, ports)


def test_a_taken_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    first = reusable_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", first))
        for _ in range(999):  # a whole band's draws: the held port never comes back
            assert reusable_port() != first
