"""The multi-site namespace topology: each ordered pair of sites is its own tbf bottleneck, traffic
inside a site is unshaped, and teardown leaves no namespace.

Needs root and iproute2; skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netsense.errors import ConfigError
from netsense.transport.emulation.netns import NetnsError, netns_available
from netsense.transport.emulation.sites import SitesTopology, site_subnet

from test_netns import RECEIVER, SENDER, _namespaces

AVAILABLE, REASON = netns_available()


def _rate(topo: SitesTopology, src: str, dst: str, offered_bps: float, seconds: float = 2.0) -> float:
    """Received bit/s of a paced UDP stream from `src` to `dst` (1200-byte datagrams).

    A shaped pair is offered twice its rate into a 0.5 s queue (as in test_netns): a sender
    descheduled for less than that by other work on the 2 cores finds the queue still full, so the
    tbf, not the sender, sets the rate. A 50 ms queue offered 1.5x measured 15.7 Mbit/s through 20
    on a loaded CI machine.
    """
    receiver = topo.popen(dst, [sys.executable, "-c", RECEIVER, topo.ip(dst)], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    port = receiver.stdout.readline().strip()
    sent = topo.run(src, [sys.executable, "-c", SENDER, topo.ip(dst), port, str(offered_bps), str(seconds), "1200"])
    assert sent.returncode == 0, sent.stderr
    result = json.loads(receiver.stdout.readline())
    receiver.wait(timeout=5)
    return result["bytes"] * 8 / result["seconds"]


def test_refused_before_anything_is_created() -> None:
    with pytest.raises(ConfigError, match="2 sites or more"):
        SitesTopology(["a"])
    with pytest.raises(ConfigError, match="repeat"):
        SitesTopology(["a", "a"])
    with pytest.raises(ConfigError, match="LinkEmulator"):
        SitesTopology(["a", "b"], "delay=10ms")
    assert site_subnet(0) == "198.18.10.0/24"
    topo = SitesTopology(["a", "b", "c"], "up.rate=20mbit,down.rate=10mbit")
    assert topo.link_params("a", "c")["rate"] == 20_000_000  # type: ignore[index]
    assert topo.link_params("c", "a")["rate"] == 10_000_000  # type: ignore[index]
    with pytest.raises(ConfigError, match="unknown site 'x'"):
        topo.ip("x")


@pytest.mark.root
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_two_sites_a_shaped_link_between_them_unshaped_inside_and_total_teardown() -> None:
    with SitesTopology(["a", "b"], "rate=20mbit,queue=500ms") as topo:
        names = [topo.router, *topo.namespaces.values()]
        assert all(name in _namespaces() for name in names)
        wan_before = topo.wan_bytes()
        across = _rate(topo, "a", "b", 40e6)
        wan = topo.wan_bytes()
        inside = _rate(topo, "a", "a", 60e6, seconds=1.0)  # the site's own address: loopback, no tbf
        after = topo.wan_bytes()
        # nothing inside a site crosses the router (a few IPv6 neighbour-discovery frames may)
        assert all(after[s] - wan[s] < 2000 for s in wan), (wan, after)
        assert [q["kind"] for q in topo.qdisc_stats("b")] == ["tbf"]
        assert topo.qdisc_stats("b")[0]["drops"] > 0
    assert across == pytest.approx(20e6 * 1200 / 1242, rel=0.10), f"{across / 1e6:.2f} Mbit/s a -> b"
    assert inside > 30e6, f"{inside / 1e6:.1f} Mbit/s inside site a: shaped?"
    assert wan["b"] - wan_before["b"] > 20e6 / 8 * 1.0  # the router counted the stream into b
    listed = _namespaces()
    assert not any(name in listed for name in names)


@pytest.mark.root
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_three_sites_each_pair_is_its_own_bottleneck() -> None:
    with SitesTopology(["a", "b", "c"], "up.rate=8mbit,down.rate=4mbit,queue=500ms") as topo:
        names = [topo.router, *topo.namespaces.values()]
        a_to_c = _rate(topo, "a", "c", 16e6)  # an earlier site to a later: up
        c_to_b = _rate(topo, "c", "b", 8e6)  # a later to an earlier: down
        assert len(topo.qdisc_stats("c")) == 2  # one tbf per source site (a, b) under htb
    assert a_to_c == pytest.approx(8e6 * 1200 / 1242, rel=0.12), f"{a_to_c / 1e6:.2f} Mbit/s"
    assert c_to_b == pytest.approx(4e6 * 1200 / 1242, rel=0.12), f"{c_to_b / 1e6:.2f} Mbit/s"
    assert not any(name in _namespaces() for name in names)


@pytest.mark.root
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_a_failed_setup_removes_what_it_created() -> None:
    broken = SitesTopology(["a", "b"], "rate=10mbit")
    broken._site_if["b"] = "x" * 20  # an invalid interface name fails half way through
    with pytest.raises(NetnsError), broken:
        pass
    listed = _namespaces()
    assert not any(name in listed for name in (broken.router, *broken.namespaces.values()))
