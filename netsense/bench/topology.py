"""Where the rows of `netsense bench scenario` run: on loopback (through the emulator child), across
the single tbf bottleneck (`NetnsTopology`), or across sites (`SitesTopology`), and the WAN figures of
a sites row (docs/history/BENCHMARKS-2026.md, "Peer comparison across two sites").

Kept apart from scenario.py, which drives the rows, so that each reads at one sitting.
"""

from __future__ import annotations

import os
import time
from typing import Any

from netsense.errors import NetSenseError
from netsense.launch.launcher import Launcher
from netsense.launch.sites import Site
from netsense.transport.emulation.linkspec import DuplexSpec


class ScenarioLauncher(Launcher):
    """A Launcher that notes when its link emulator started (trace time 0) on the monotonic clock."""

    link_t0: float | None = None

    def _start_emulator(self, ps_port: int, timeout_s: float = 30.0) -> Any:
        emu, port = super()._start_emulator(ps_port, timeout_s)
        # The emulator prints "listening on" right after it starts its traces: the trace's t = 0.
        self.link_t0 = time.monotonic()
        return emu, port


class NetnsLauncher(ScenarioLauncher):
    """The PS in the server namespace, the workers in the client namespace: every push and pull
    crosses the router's `tbf`, the same kernel bottleneck as the ddp:* peers."""

    def __init__(self, *args: Any, topo: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topo = topo

    def _spawn(self, cmd: list[str], site: str | None = None) -> Any:
        import subprocess

        from netsense.transport.emulation.netns import SERVER_IP

        sub = next(a for a in cmd[3:] if not a.startswith("-"))  # [python, -m, netsense, -v..., SUB, ...]
        cmd = list(cmd)
        if sub == "ps":
            role, cmd = "server", [*cmd, "--host", SERVER_IP]
        else:
            role = "client"
            i = cmd.index("--ps") + 1
            cmd[i] = f"{SERVER_IP}:{cmd[i].rpartition(':')[2]}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(self.topo.command(role, cmd), stdout=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        return p


class SitesLauncher(ScenarioLauncher):
    """Each site's shards and workers in that site's namespace (`SitesTopology`); shards listen on
    the site's address, so a worker reaches its own site's shard without crossing the router."""

    def __init__(self, *args: Any, topo: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topo = topo

    def _host(self, site: str | None) -> str:
        return self.topo.ip(site) if site is not None else "127.0.0.1"

    def _spawn(self, cmd: list[str], site: str | None = None) -> Any:
        import subprocess

        if site is None:
            raise NetSenseError(f"a sites job started a process with no site: {cmd[3:5]}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(self.topo.command(site, cmd), stdout=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        return p


def site_workers(workers: int, sites: int | None = None) -> list[int]:
    """Workers per site when `workers` are spread evenly over `sites` (None: one site per worker);
    the first sites take the remainder. Ranks fill the sites in order."""
    n = workers if sites is None else sites
    if not 1 <= n <= workers:
        raise NetSenseError(f"cannot spread {workers} workers over {n} sites (1 <= sites <= workers)")
    return [workers // n + (1 if i < workers % n else 0) for i in range(n)]


def scenario_sites(workers: int, sites: int | None = None) -> tuple[Site, ...]:
    """The sites of a `--topology sites` row (`site_workers`), a PS shard at each; a site of
    several workers gets a relay from the launcher (docs/ARCHITECTURE.md, "Hierarchical aggregation")."""
    return tuple(Site(f"s{i}", workers=w, shards=1) for i, w in enumerate(site_workers(workers, sites)))


def rank_site_names(workers: int, sites: int | None = None) -> list[str]:
    """Site name of each rank in a `--topology sites` row: DDP's ranks sit where NetSense's do."""
    return [f"s{i}" for i, w in enumerate(site_workers(workers, sites)) for _ in range(w)]


def wan_figures(
    wan: dict[str, int], steps: int, spec: DuplexSpec, sites: list[str], compute_s: list[float] | None = None
) -> dict[str, Any]:
    """WAN bytes per step into each site and the ideal step they allow.

    `wan` is what the router forwarded into each site over the run (start-up included, so a
    slight overestimate). Into site j come the links from every other site; the ideal per step
    is max(compute, bytes into j / the sum of those links' rates) over j, the busier direction."""
    from netsense.bench.results import rate_Bps

    per_step = {f"into {s}": (wan[s] / steps if steps else 0.0) for s in sites}
    bound = 0.0
    for j, dst in enumerate(sites):
        rates = [rate_Bps(spec.up if i < j else spec.down, 0.0) for i in range(len(sites)) if i != j]
        if all(r is not None for r in rates) and sum(rates) > 0:  # type: ignore[arg-type]
            bound = max(bound, per_step[f"into {dst}"] / sum(rates))  # type: ignore[arg-type]
    known = [c for c in compute_s or [] if c]
    ideal = sum(max(c, bound) for c in known) / len(known) if known else bound
    return {"wan_bytes_per_step": per_step, "wan_ideal_step_s": ideal}




def wan_table(results: dict[str, Any]) -> str:
    """The rows that ran across sites: WAN bytes per step into each site, mean step vs the WAN ideal
    ("" when none did)."""
    rows = [(p, f) for p, f in results["policies"].items() if "wan_bytes_per_step" in f]
    if not rows:
        return ""
    lines = ["", "", "| policy | WAN kB per step (into each site) | mean step s | WAN ideal step s | mean/WAN ideal |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, f in rows:
        into = ", ".join(f"{k.removeprefix('into ')} {v / 1e3:.1f}" for k, v in f["wan_bytes_per_step"].items())
        ideal = f["wan_ideal_step_s"]
        ratio = f"{f['mean_step_s'] / ideal:.2f}" if ideal > 0 else "—"
        lines.append(f"| `{name}` | {into} | {f['mean_step_s']:.3f} | {ideal:.3f} | {ratio} |")
    return "\n".join(lines)


def relay_table(results: dict[str, Any]) -> str:
    """The relayed rows: each relay's step phases per upstream shard, medians in ms
    (`netsense.relay.phases`; "" when no relay reported them)."""
    rows = []
    for name, f in results["policies"].items():
        for relay in f.get("relays", []):
            for shard, m in enumerate(relay.get("phases") or []):
                if m:
                    cells = " | ".join(f"{1000 * m[k]:.1f}" if k in m else "—" for k in ("gather_s", "push_s", "update_s", "install_s"))
                    rows.append(f"| `{name}` | {relay.get('site', '?')} | {shard} | {m.get('steps', 0)} | {cells} |")
    if not rows:
        return ""
    return "\n".join(["", "", "Relays' step phases (medians, ms: the site's workers to its sum taken, the push upstream, "
                      "the wait for the update, the update installed; netsense.relay.phases):", "",
                      "| policy | site | shard | steps | gather | push | update | install |", "|---|---|---|---|---|---|---|---|", *rows])

