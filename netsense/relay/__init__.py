"""Hierarchical aggregation: a relay sums one site's gradients before the WAN and fans the update
out at the site (docs/ARCHITECTURE.md, "Hierarchical aggregation"). It lives in `netsense` because
it is both a PS (to its local workers) and a worker (to the upstream PS shards), and `netsense.ps`
and `netsense.worker` never import each other."""

from __future__ import annotations

from .server import Relay, RelayServer, RelaySettings
from .site import Aggregate, SiteStore
from .thread import RunningRelay, start_relay

__all__ = ["Aggregate", "Relay", "RelayServer", "RelaySettings", "RunningRelay", "SiteStore", "start_relay"]
