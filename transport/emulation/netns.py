"""Kernel-level link shaping with network namespaces, veth pairs and `tbf` (docs/EMULATOR.md).

Topology: client ns <-veth-> router ns <-veth-> server ns. The router forwards, and `tbf` sits on
its egress veth toward the server (uplink) and toward the client (downlink). As measured
(docs/EMULATOR.md), `tbf` on a *forwarding hop* is a real drop-tail bottleneck, while `tbf` on a
sender's own veth only blocks the socket. This kernel has no `netem`, so delay and random loss stay with the userspace
`LinkEmulator`. Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking range) and exist only inside
the namespaces; every name carries the pid and a counter so concurrent runs never collide, and
teardown deletes the namespaces (which takes the veths with them) whatever happened before.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal

from netsense.errors import ConfigError, NetSenseError

from .linkspec import DuplexSpec, LinkSpec, as_duplex
from .traces import ConstantRate

log = logging.getLogger(__name__)

Role = Literal["client", "router", "server"]
ROLES: tuple[Role, ...] = ("client", "router", "server")
CLIENT_IP, ROUTER_CLIENT_IP = "198.18.1.1", "198.18.1.2"
ROUTER_SERVER_IP, SERVER_IP = "198.18.2.1", "198.18.2.2"
_PREFIX_LEN = 24
_L2_MTU_BYTES = 1514
_counter = itertools.count()


class NetnsError(NetSenseError):
    """A namespace, link or qdisc command failed; the message has the command and its stderr."""


def _ip(*args: str) -> list[str]:
    return ["ip", *args]


def _run(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)
    except subprocess.CalledProcessError as exc:
        raise NetnsError(f"{' '.join(argv)!r} failed ({exc.returncode}): {exc.stderr.strip()}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)!r} failed: {exc}") from exc
    return done.stdout


@functools.lru_cache(maxsize=1)
def netns_available() -> tuple[bool, str]:
    """Whether namespaces can be built here, and why not: root, `ip` and `tc`, and a probe namespace."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (euid is not 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"the {tool!r} command (iproute2) is not installed"
    probe = f"netsense-probe-{os.getpid()}"
    try:
        _run(_ip("netns", "add", probe))
    except NetnsError as exc:
        return False, f"cannot create a network namespace: {exc}"
    try:
        _run(_ip("netns", "del", probe))
    except NetnsError as exc:
        log.warning("probe namespace %s not removed: %s", probe, exc)
    return True, "root, iproute2 and network namespaces available"


def tbf_params(link: LinkSpec) -> dict[str, int] | None:
    """tbf's rate (bit/s), burst and limit (bytes) for one direction; None when it is unshaped."""
    if link.delay_s or link.loss:
        raise ConfigError(
            f"netns link: delay={link.delay_s}s / loss={link.loss} need netem, which this kernel lacks; "
            "use the userspace LinkEmulator for delay and loss"
        )
    if link.rate is None:
        return None
    if not isinstance(link.rate, ConstantRate):
        raise ConfigError(f"netns link: tbf takes a constant rate, got {link.rate!r}; use LinkEmulator for traces")
    rate = int(link.rate.bps)
    # tbf needs a bucket of at least one full frame, and a tick's worth at high rates.
    burst = max(link.burst_bytes, 2 * _L2_MTU_BYTES, rate // 8 // 1000)
    limit = link.queue_limit_bytes or 2 * _L2_MTU_BYTES
    return {"rate": rate, "burst": burst, "limit": max(limit, burst)}


class NetnsTopology:
    """client / router / server namespaces joined by veths, `tbf`-shaped at the router.

    ``with NetnsTopology("up.rate=20mbit,queue=50ms") as topo: topo.popen("server", [...])``;
    the server listens on ``topo.server_ip``, the client sends from ``topo.client_ip``.
    """

    def __init__(self, spec: DuplexSpec | LinkSpec | str = "") -> None:
        self.spec = as_duplex(spec)
        self._tbf = {"up": tbf_params(self.spec.up), "down": tbf_params(self.spec.down)}
        tag = f"{os.getpid()}x{next(_counter)}"
        self.namespaces: dict[Role, str] = {role: f"netsense-{tag}-{role}" for role in ROLES}
        """Namespace name per role."""
        # Interface names are capped at 15 characters: v + pid (<= 7 digits) + counter + 2.
        short = f"v{os.getpid()}{tag.split('x')[1]}"
        self._ifaces = {
            "client": short + "c", "router_c": short + "rc", "router_s": short + "rs", "server": short + "s"
        }
        self._created: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self.client_ip = CLIENT_IP
        self.server_ip = SERVER_IP

    def __enter__(self) -> NetnsTopology:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        ns, ifs = self.namespaces, self._ifaces
        for role in ROLES:
            _run(_ip("netns", "add", ns[role]))
            self._created.append(ns[role])
        _run(_ip("link", "add", ifs["client"], "netns", ns["client"], "type", "veth",
                 "peer", "name", ifs["router_c"], "netns", ns["router"]))
        _run(_ip("link", "add", ifs["router_s"], "netns", ns["router"], "type", "veth",
                 "peer", "name", ifs["server"], "netns", ns["server"]))
        for role, iface, addr in (
            ("client", ifs["client"], CLIENT_IP),
            ("router", ifs["router_c"], ROUTER_CLIENT_IP),
            ("router", ifs["router_s"], ROUTER_SERVER_IP),
            ("server", ifs["server"], SERVER_IP),
        ):
            _run(_ip("-n", ns[role], "addr", "add", f"{addr}/{_PREFIX_LEN}", "dev", iface))
            _run(_ip("-n", ns[role], "link", "set", iface, "up"))
        for role in ROLES:
            _run(_ip("-n", ns[role], "link", "set", "lo", "up"))
        _run(_ip("-n", ns["client"], "route", "add", "default", "via", ROUTER_CLIENT_IP))
        _run(_ip("-n", ns["server"], "route", "add", "default", "via", ROUTER_SERVER_IP))
        _run(self.command("router", ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]))
        for direction, iface in (("up", ifs["router_s"]), ("down", ifs["router_c"])):
            params = self._tbf[direction]
            if params is not None:
                _run(self.command("router", ["tc", "qdisc", "add", "dev", iface, "root", "tbf",
                                             "rate", f"{params['rate']}bit", "burst", str(params["burst"]),
                                             "limit", str(params["limit"])]))
        log.info("netns topology %s up: %s", self.namespaces, self._tbf)

    def command(self, role: Role, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside ``role``'s namespace."""
        return _ip("netns", "exec", self.namespaces[role], *argv)

    def run(
        self, role: Role, argv: Sequence[str], *, timeout: float = 60.0, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside ``role``'s namespace (text mode, output captured)."""
        kwargs.setdefault("capture_output", True)
        return subprocess.run(self.command(role, argv), text=True, timeout=timeout, **kwargs)

    def popen(self, role: Role, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a command inside ``role``'s namespace; teardown kills it if it still runs."""
        proc = subprocess.Popen(self.command(role, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def qdisc_stats(self, direction: Literal["up", "down"]) -> dict[str, Any]:
        """tc's counters of the direction's tbf (``bytes``, ``packets``, ``drops``, ``backlog`` ...)."""
        iface = self._ifaces["router_s" if direction == "up" else "router_c"]
        shown = json.loads(_run(self.command("router", ["tc", "-s", "-j", "qdisc", "show", "dev", iface])))
        return next((q for q in shown if q.get("kind") == "tbf"), {})

    def close(self) -> None:
        """Kill what runs inside, then delete every namespace created; safe to call twice."""
        teardown(self._procs, self._created)


def teardown(procs: list[subprocess.Popen[Any]], created: list[str]) -> None:
    """Kill what runs inside the namespaces, then delete every one created (newest first); both
    lists are emptied, so a second call does nothing. Shared by `NetnsTopology` and `SitesTopology`."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    procs.clear()
    while created:
        name = created.pop()
        try:
            _run(_ip("netns", "del", name))
        except NetnsError as exc:
            log.warning("namespace %s not removed: %s", name, exc)
