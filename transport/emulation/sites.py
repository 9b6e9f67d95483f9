"""A multi-site topology in network namespaces: one namespace per site, a router between them.

Each site's namespace has one veth to the router namespace; the router forwards, and the link from
site i to site j is shaped on the router's egress veth toward j (docs/EMULATOR.md, "Sites"):

- two sites: a plain `tbf` on each egress veth, the same drop-tail bottleneck as `NetnsTopology`;
- three or more: an `htb` root on each egress veth with one class per source site (u32 filter on
  its subnet), each with a `tbf` leaf, so every ordered pair has its own bottleneck.

Inside a site, processes talk over the namespace's own address (the kernel routes it through
loopback): unshaped. `tbf` takes a constant rate and no delay (this kernel has no `netem`); the
userspace emulator is for delay and traces. The spec's ``up`` shapes traffic from a site to a
later one in the list, ``down`` the other way. Namespace and interface names carry the pid and a
counter, site i's addresses are 198.18.(10+i).0/24, and teardown deletes every namespace whatever
happened before.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from netsense.errors import ConfigError

from .linkspec import DuplexSpec, LinkSpec, as_duplex
from .netns import _ip, _run, tbf_params, teardown

log = logging.getLogger(__name__)

_PREFIX_LEN = 24
_FIRST_SUBNET = 10
MAX_SITES = 200
"""Site i uses 198.18.(10+i).0/24; the third octet must stay below 256."""
_counter = itertools.count()


def site_subnet(index: int) -> str:
    """The /24 of site `index`."""
    return f"198.18.{_FIRST_SUBNET + index}.0/{_PREFIX_LEN}"


class SitesTopology:
    """Site namespaces around a router namespace, each ordered pair of sites `tbf`-shaped.

    ``with SitesTopology(["a", "b"], "rate=20mbit") as topo: topo.popen("a", [...])``; a process
    at site ``s`` listens on ``topo.ip("s")``.
    """

    def __init__(self, sites: Sequence[str], spec: DuplexSpec | LinkSpec | str = "") -> None:
        self.sites = list(sites)
        if len(self.sites) < 2:
            raise ConfigError(f"a multi-site topology needs 2 sites or more, got {self.sites}")
        if len(set(self.sites)) != len(self.sites):
            raise ConfigError(f"site names repeat: {self.sites}")
        if len(self.sites) > MAX_SITES:
            raise ConfigError(f"at most {MAX_SITES} sites, got {len(self.sites)}")
        self.spec = as_duplex(spec)
        self._tbf = {"up": tbf_params(self.spec.up), "down": tbf_params(self.spec.down)}
        tag = f"{os.getpid()}x{next(_counter)}"
        self.router = f"netsense-{tag}-router"
        """The router namespace's name."""
        self.namespaces: dict[str, str] = {s: f"netsense-{tag}-s{i}" for i, s in enumerate(self.sites)}
        """Namespace name per site."""
        # Interface names are capped at 15 characters: v + pid (<= 7) + counter + s/r + index.
        short = f"v{os.getpid()}{tag.split('x')[1]}"
        self._site_if = {s: f"{short}s{i}" for i, s in enumerate(self.sites)}
        self._router_if = {s: f"{short}r{i}" for i, s in enumerate(self.sites)}
        self._created: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []

    def index(self, site: str) -> int:
        if site not in self.namespaces:
            raise ConfigError(f"unknown site {site!r}; the topology's sites are {', '.join(self.sites)}")
        return self.sites.index(site)

    def ip(self, site: str) -> str:
        """The address of `site`'s namespace (its processes bind and are reached there)."""
        return f"198.18.{_FIRST_SUBNET + self.index(site)}.2"

    def _router_ip(self, site: str) -> str:
        return f"198.18.{_FIRST_SUBNET + self.index(site)}.1"

    def link_params(self, src: str, dst: str) -> dict[str, int] | None:
        """tbf's parameters of the link from `src` to `dst` (None: unshaped)."""
        return self._tbf["up" if self.index(src) < self.index(dst) else "down"]

    def __enter__(self) -> SitesTopology:
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
        for name in (self.router, *self.namespaces.values()):
            _run(_ip("netns", "add", name))
            self._created.append(name)
        _run(_ip("-n", self.router, "link", "set", "lo", "up"))
        for site in self.sites:
            ns, sif, rif = self.namespaces[site], self._site_if[site], self._router_if[site]
            _run(_ip("link", "add", sif, "netns", ns, "type", "veth", "peer", "name", rif, "netns", self.router))
            _run(_ip("-n", ns, "addr", "add", f"{self.ip(site)}/{_PREFIX_LEN}", "dev", sif))
            _run(_ip("-n", self.router, "addr", "add", f"{self._router_ip(site)}/{_PREFIX_LEN}", "dev", rif))
            for where, iface in ((ns, sif), (self.router, rif)):
                _run(_ip("-n", where, "link", "set", iface, "up"))
            _run(_ip("-n", ns, "link", "set", "lo", "up"))
            _run(_ip("-n", ns, "route", "add", "default", "via", self._router_ip(site)))
        _run(self._router(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]))
        for dst in self.sites:
            self._shape(dst)
        log.info("sites topology %s up: %s", self.namespaces, self._tbf)

    def _shape(self, dst: str) -> None:
        """The qdiscs on the router's egress toward `dst`: one bottleneck per source site."""
        iface = self._router_if[dst]
        sources = [s for s in self.sites if s != dst]
        params = [self.link_params(src, dst) for src in sources]
        if len(sources) == 1:
            if params[0] is not None:
                _run(self._router(["tc", "qdisc", "add", "dev", iface, "root", *_tbf_args(params[0])]))
            return
        if all(p is None for p in params):
            return
        # htb only classifies (its classes' rate is far above any tbf's); each tbf leaf is the pair's bottleneck.
        _run(self._router(["tc", "qdisc", "add", "dev", iface, "root", "handle", "1:", "htb", "default", "999"]))
        _run(self._router(["tc", "class", "add", "dev", iface, "parent", "1:", "classid", "1:999", "htb",
                           "rate", "100gbit"]))  # fmt: skip
        for src, p in zip(sources, params):
            if p is None:
                continue
            cls = f"1:{self.index(src) + 1}"
            _run(self._router(["tc", "class", "add", "dev", iface, "parent", "1:", "classid", cls, "htb",
                               "rate", "100gbit"]))  # fmt: skip
            _run(self._router(["tc", "qdisc", "add", "dev", iface, "parent", cls, *_tbf_args(p)]))
            _run(self._router(["tc", "filter", "add", "dev", iface, "parent", "1:", "protocol", "ip", "prio", "1",
                               "u32", "match", "ip", "src", site_subnet(self.index(src)), "flowid", cls]))  # fmt: skip

    def _router(self, argv: Sequence[str]) -> list[str]:
        return _ip("netns", "exec", self.router, *argv)

    def command(self, site: str, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside `site`'s namespace."""
        return _ip("netns", "exec", self.namespaces[self.sites[self.index(site)]], *argv)

    def run(self, site: str, argv: Sequence[str], *, timeout: float = 60.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside `site`'s namespace (text mode, output captured)."""
        kwargs.setdefault("capture_output", True)
        return subprocess.run(self.command(site, argv), text=True, timeout=timeout, **kwargs)

    def popen(self, site: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a command inside `site`'s namespace; teardown kills it if it still runs."""
        proc = subprocess.Popen(self.command(site, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def wan_bytes(self) -> dict[str, int]:
        """Bytes (L2 frames) the router has sent into each site so far: everything that crossed the WAN
        toward it. With two sites, ``wan_bytes()["b"]`` is the a -> b direction."""
        shown = json.loads(_run(self._router(["ip", "-s", "-j", "link", "show"])))
        by_if = {link["ifname"]: int(link["stats64"]["tx"]["bytes"]) for link in shown if "stats64" in link}
        return {site: by_if.get(self._router_if[site], 0) for site in self.sites}

    def qdisc_stats(self, dst: str) -> list[dict[str, Any]]:
        """tc's counters of every qdisc on the router's egress toward `dst` (tbf: bytes, drops, ...)."""
        shown = json.loads(_run(self._router(["tc", "-s", "-j", "qdisc", "show", "dev", self._router_if[dst]])))
        return [q for q in shown if q.get("kind") == "tbf"]

    def close(self) -> None:
        """Kill what runs inside, then delete every namespace created; safe to call twice."""
        teardown(self._procs, self._created)


def _tbf_args(params: dict[str, int]) -> list[str]:
    return ["tbf", "rate", f"{params['rate']}bit", "burst", str(params["burst"]), "limit", str(params["limit"])]
