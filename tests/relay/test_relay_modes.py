"""The relay in the other modes of a job: PS shards, and a model with buffers (state keys)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from netsense.relay import RelaySettings, start_relay
from netsense.ps.server import ServerSettings
from netsense.transport.auth import load_secret
from netsense.transport.tls import CertPaths

from tests.conftest import SLOW_SEND_S, time_pushes

from .relayhelp import PS, Worker, connect, digits, relay, run_workers, start_ps

STEPS = 4


def _bn_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _state(ps: PS) -> dict[str, torch.Tensor]:
    s = ps.server.store
    return ps.call(lambda: {**{k: v.clone() for k, v in s.params.items()}, **{k: v.clone() for k, v in s.state_keys.items()}})


def test_sharded_upstream_is_bit_exact(certs: CertPaths) -> None:
    """Two PS shards: the relay serves one local shard per upstream shard (ports in shard order),
    and training equals the same two workers on the two shards directly, bit for bit."""

    def job(through_relay: bool) -> tuple[list[dict[str, torch.Tensor]], list[Worker]]:
        shards = [start_ps(certs), start_ps(certs)]
        site = None
        try:
            if through_relay:
                settings = RelaySettings(
                    upstream=tuple(connect(certs, s.port) for s in shards), site="a", server=ServerSettings(port=0), site_workers=2
                )
                site = start_relay(settings, cert=str(certs.cert), key=str(certs.key), secret=load_secret(certs.secret))
                ports = site.ports
            else:
                ports = [s.port for s in shards]
            here: Any = [connect(certs, p) for p in ports]
            workers = [Worker(r, 2, here, STEPS, digits(), spread=0) for r in range(2)]
            run_workers(workers)
            return [_state(s) for s in shards], workers
        finally:
            if site is not None:
                site.stop()
            for s in shards:
                s.stop()

    reference, _ = job(False)
    got, workers = job(True)
    assert all(len(s) for s in got)  # each shard holds some keys
    for ref, mine in zip(reference, got):
        assert ref.keys() == mine.keys()
        for key in ref:
            assert torch.equal(mine[key], ref[key]), key


@pytest.mark.parametrize("wan_first", [True, False], ids=["wan-pushes-first", "off"])
def test_site_shard_is_pushed_after_the_wan_pushes_left(certs: CertPaths, slow_sends: set[int], wan_first: bool) -> None:
    """Shard 0 at the relay's site a, shard 1 at site b (each PS says its site in WELCOME), whose
    pushes leave `SLOW_SEND_S` late and are acked as late: each step's push reaches shard 0 that
    much after shard 1's; `server.wan_first = False` pushes both at once. Training is the same."""
    shards = [start_ps(certs, site="a"), start_ps(certs, site="b")]
    arrived = time_pushes(shards, slow=1)
    settings = RelaySettings(upstream=tuple(connect(certs, s.port, site="a") for s in shards), site="a",
                             server=ServerSettings(port=0, wan_first=wan_first), site_workers=2)  # fmt: skip
    site = start_relay(settings, cert=str(certs.cert), key=str(certs.key), secret=load_secret(certs.secret))
    try:
        assert [s.role for s in site.relay.shards] == ["local", "remote"]
        slow_sends.add(id(site.relay.shards[1].upstream.client.conn))
        here: Any = [connect(certs, p) for p in site.ports]
        run_workers([Worker(r, 2, here, STEPS, digits(), spread=0) for r in range(2)])
        assert all(s.call(lambda s=s: s.server.store.version) == STEPS for s in shards)
    finally:
        site.stop()
        for s in shards:
            s.stop()
    lead = [arrived[0][k] - arrived[1][k] for k in range(STEPS)]
    if wan_first:
        assert min(lead) > SLOW_SEND_S / 2, lead  # the site's shard waited for the far push to leave
    else:
        assert max(lead) < SLOW_SEND_S / 2, lead  # both at once


def test_buffers_through_two_sites(certs: CertPaths) -> None:
    """BatchNorm's running statistics (state keys) through two relays: site a holds rank 0 and
    knows INIT's model map, site b tells state keys from parameters at its first push. Parameters
    and buffers follow four direct workers to rounding (the PS averages two site means where it
    averaged four values), and every replica's buffers equal the PS's."""

    def run(sites: bool) -> tuple[dict[str, torch.Tensor], list[Worker]]:
        ps = start_ps(certs)
        relays = [relay(certs, ps.port, site=n, site_workers=2) for n in "ab"] if sites else []
        try:
            ports = [relays[r // 2].ports[0] if sites else ps.port for r in range(4)]
            workers = [Worker(r, 4, connect(certs, ports[r]), STEPS, digits(), model=_bn_model()) for r in range(4)]
            run_workers(workers)
            return _state(ps), workers
        finally:
            for r in relays:
                r.stop()
            ps.stop()

    reference, _ = run(False)
    got, workers = run(True)
    assert reference.keys() == got.keys() and any("running_mean" in k for k in got)
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=1e-5, atol=1e-6)
    for w in workers:
        for name, buf in w.model.named_buffers():
            key = next(k for k in got if k.startswith(name))
            assert torch.equal(buf.to(got[key].dtype).flatten(), got[key].flatten()), name


def test_two_relays_run_a_gradient_domain_downlink(certs: CertPaths) -> None:
    """A gradient-domain PS behind two relays (docs/ARCHITECTURE.md, "Gradient-domain downlink"):
    each relay runs the PS's optimizer on the update it forwards (with the hyper-parameters its
    push carried), its local workers run it too, and every replica, the relays' and the workers',
    parameters and buffers, equals the PS bit for bit under a lossy codec."""
    ps = start_ps(certs, downlink_domain="gradient")
    relays = [relay(certs, ps.port, site=n, site_workers=2) for n in "ab"]
    try:
        workers = [
            Worker(r, 4, connect(certs, relays[r // 2].ports[0]), STEPS, digits(), model=_bn_model(), options={"codec": "powersgd:2"})
            for r in range(4)
        ]
        run_workers(workers)
        want = _state(ps)
        sites = [r.net.run(_site_state(r)) for r in relays]
    finally:
        for r in relays:
            r.stop()
        ps.stop()
    assert ps.server.store.version == STEPS
    for site in sites:
        assert site.keys() == want.keys()
        assert all(torch.equal(site[k], want[k]) for k in want)
    for w in workers:
        got = {**dict(w.model.named_parameters()), **dict(w.model.named_buffers())}
        for key, value in want.items():
            assert torch.equal(got[key].detach().to(value.dtype).flatten(), value.flatten()), key


async def _site_state(running: Any) -> dict[str, torch.Tensor]:
    site = running.relay.shards[0].site
    assert site.mirror is not None  # the upstream's optimizer runs at the relay
    return {**{k: v.clone() for k, v in site.params.items()}, **{k: v.clone() for k, v in site._core.state.items()}}
