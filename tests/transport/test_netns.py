"""Kernel shaping in network namespaces: tbf at the router is a real bottleneck; teardown is total.

Needs root and iproute2; skipped with the reason elsewhere. Traffic runs only between namespaces the
test created, on addresses that exist only inside them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netsense.errors import ConfigError
from netsense.transport.emulation.linkspec import parse_link
from netsense.transport.emulation.netns import NetnsError, NetnsTopology, netns_available, tbf_params

AVAILABLE, REASON = netns_available()

# Arrival times are the kernel's (SO_TIMESTAMPNS, 35 on Linux; Python does not name it), not the
# receiver's clock when it got around to reading: with other work on the 2 cores a late read at the
# end stretched the window and measured 16.3 Mbit/s through a 20 Mbit/s tbf.
RECEIVER = """
import json, socket, struct, sys, time
SO_TIMESTAMPNS = 35
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
sock.bind((sys.argv[1], 0))
print(sock.getsockname()[1], flush=True)
sock.settimeout(5.0)
first = last = None; total = count = 0
try:
    while True:
        data, anc, _, _ = sock.recvmsg(65535, 64)
        stamps = [struct.unpack("qq", d[:16]) for lvl, kind, d in anc if lvl == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS]
        last = stamps[0][0] + stamps[0][1] * 1e-9 if stamps else time.time()
        if first is None: first = last; sock.settimeout(0.5)
        else: total += len(data)
        count += 1
except socket.timeout:
    pass
print(json.dumps({"bytes": total, "packets": count, "seconds": (last - first) if first else 0}), flush=True)
"""

SENDER = """
import socket, sys, time
host, port, bps, seconds, size = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = bytes(size); sent = 0; start = time.monotonic()
while (elapsed := time.monotonic() - start) < seconds:
    owed = int(elapsed * bps / 8 / size) + 1
    for _ in range(owed - sent):
        sock.sendto(payload, (host, port))
    sent = owed
    time.sleep(0.001)
"""


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_availability_is_reported_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    ok, reason = netns_available()
    assert isinstance(ok, bool) and reason
    netns_available.cache_clear()
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    try:
        assert netns_available() == (False, "network namespaces need root (euid is not 0)")
    finally:
        netns_available.cache_clear()


def test_tbf_params_refuse_what_tbf_cannot_do() -> None:
    assert tbf_params(parse_link("").up) is None
    params = tbf_params(parse_link("rate=20mbit,queue=50ms").up)
    assert params == {"rate": 20_000_000, "burst": 3028, "limit": 125_000}
    for text in ("delay=10ms", "loss=0.01", "rate=0s:10mbit,1s:5mbit"):
        with pytest.raises(ConfigError, match="LinkEmulator"):
            tbf_params(parse_link(text).up)
    with pytest.raises(ConfigError):
        NetnsTopology("delay=5ms")  # refused before anything is created


@pytest.mark.root
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_udp_through_tbf_gets_the_rate_and_teardown_is_total() -> None:
    # Offered at twice the rate into a 0.5 s queue: a sender descheduled for less than that (other
    # work on the 2 cores) finds the queue still full, and the tbf, not the sender, sets the rate.
    size, rate = 1200, 20e6
    with NetnsTopology("up.rate=20mbit,queue=500ms") as topo:
        names = list(topo.namespaces.values())
        assert all(name in _namespaces() for name in names)
        receiver = topo.popen("server", [sys.executable, "-c", RECEIVER, topo.server_ip],
                              stdout=subprocess.PIPE, text=True)
        assert receiver.stdout is not None
        port = receiver.stdout.readline().strip()
        sent = topo.run("client", [sys.executable, "-c", SENDER, topo.server_ip, port, "40e6", "2.0", str(size)])
        assert sent.returncode == 0, sent.stderr
        result = json.loads(receiver.stdout.readline())
        receiver.wait(timeout=5)
        qdisc = topo.qdisc_stats("up")
        # the addresses exist only inside the namespaces
        root_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        assert topo.server_ip not in root_addrs
    # tbf counts the Ethernet frame: payload + 8 UDP + 20 IP + 14 Ethernet
    expected = rate * size / (size + 42)
    measured = result["bytes"] * 8 / result["seconds"]
    assert measured == pytest.approx(expected, rel=0.10), f"{measured / 1e6:.2f} Mbit/s through tbf"
    assert qdisc["drops"] > 0  # offered 40 Mbit/s into 20: the tbf queue overflowed
    listed = _namespaces()
    assert not any(name in listed for name in names)


@pytest.mark.root
@pytest.mark.skipif(not AVAILABLE, reason=REASON)
def test_two_topologies_do_not_collide_and_failed_setup_cleans_up() -> None:
    with NetnsTopology("up.rate=10mbit") as a, NetnsTopology("down.rate=5mbit") as b:
        assert set(a.namespaces.values()).isdisjoint(b.namespaces.values())
        ping = a.run("client", [sys.executable, "-c",
                                "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                                f"s.connect(('{a.server_ip}', 9)); print(s.getsockname()[0])"])
        assert ping.stdout.strip() == a.client_ip  # routed via the router
        assert a.qdisc_stats("up")["kind"] == b.qdisc_stats("down")["kind"] == "tbf"
        assert a.qdisc_stats("down") == {} and b.qdisc_stats("up") == {}  # unshaped directions
    broken = NetnsTopology("rate=10mbit")
    broken._ifaces["server"] = "x" * 20  # an invalid interface name fails half way through
    with pytest.raises(NetnsError), broken:
        pass
    listed = _namespaces()
    every = (*a.namespaces.values(), *b.namespaces.values(), *broken.namespaces.values())
    assert not any(name in listed for name in every)
