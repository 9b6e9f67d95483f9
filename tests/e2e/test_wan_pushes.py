"""WAN pushes first at a worker: its own site's shard gets each step's push only after the push to
the shard at the other site has left (worker/wanpushes.py), in the plain and the full-duplex step."""

from __future__ import annotations

import pytest
import torch

from netsense.ps.server import ServerSettings
from netsense.worker.optimizer import NetSenseOptimizer
from tests.conftest import SLOW_SEND_S, start_ps, stop_ps, time_pushes

STEPS = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "duplex"])
@pytest.mark.parametrize("wan_first", [True, False], ids=["wan-pushes-first", "off"])
def test_far_shard_takes_each_push_first(certs, slow_sends: set[int], overlap: bool, wan_first: bool) -> None:  # type: ignore[no-untyped-def]
    """Shard 0 at the worker's site a, shard 1 at site b, whose pushes leave `SLOW_SEND_S` late and
    are acked as late: with WAN pushes first shard 0 gets each step's first push that much after
    shard 1's; off, both at once."""
    servers = [start_ps(certs, site="a"), start_ps(certs, site="b")]
    arrived = time_pushes(servers, slow=1)
    model = _model()
    opt = NetSenseOptimizer(
        model, connect=[ps.connect_settings(site="a", wan_first=wan_first) for ps in servers], rank=0, world_size=1,
        worker_id="w0", optimizer={"name": "sgd", "lr": 0.1}, codec="fp32", bucket_bytes=512, overlap=overlap,
        overlap_bucket_bytes=512,
    )  # fmt: skip
    slow_sends.add(id(opt._exchange.clients[1].conn))
    try:
        g = torch.Generator().manual_seed(0)
        for _ in range(STEPS):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            opt.zero_grad(samples=len(x))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step(samples=len(x))
        assert all(ps.call(lambda ps=ps: ps.server.store.version) == STEPS for ps in servers)
    finally:
        opt.close()
        for ps in servers:
            stop_ps(ps)
    lead = [arrived[0][k] - arrived[1][k] for k in range(STEPS)]
    if wan_first:
        assert min(lead) > SLOW_SEND_S / 2, lead  # this site's shard waited for the far push to leave
    else:
        assert max(lead) < SLOW_SEND_S / 2, lead  # both at once


def test_no_order_against_an_asynchronous_ps(certs) -> None:  # type: ignore[no-untyped-def]
    """An asynchronous PS applies each push alone: nothing to order, even with sites said."""
    servers = [start_ps(certs, ServerSettings(port=0, staleness=2), site=s) for s in "ab"]
    opt = NetSenseOptimizer(
        _model(), connect=[ps.connect_settings(site="a") for ps in servers], rank=0, world_size=1, worker_id="w0",
        optimizer={"name": "sgd", "lr": 0.1}, codec="fp32",
    )  # fmt: skip
    try:
        assert opt._exchange._roles == ["local", "remote"] and opt._exchange._wan is None
    finally:
        opt.close()
        for ps in servers:
            stop_ps(ps)
