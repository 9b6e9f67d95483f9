"""Faults at a site: a bad local push, a local worker that dies, a relay that restarts."""

from __future__ import annotations

import threading

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import PeerError
from netsense.ps.server import ServerSettings
from netsense.relay import RelaySettings, start_relay
from netsense.transport.auth import load_secret
from netsense.transport.tls import CertPaths
from netsense.transport.wire import Push
from netsense.worker.connect import make_client
from netsense.worker.netthread import NetThread

from .relayhelp import Worker, connect, digits, params_of, relay, run_workers, start_ps

STEPS = 5


def _direct_one_worker(certs: CertPaths) -> dict[str, torch.Tensor]:
    ps = start_ps(certs)
    try:
        run_workers([Worker(0, 1, connect(certs, ps.port), STEPS, digits())])
        return params_of(ps)
    finally:
        ps.stop()


def test_bad_local_push_is_refused_and_poisons_nothing(certs: CertPaths) -> None:
    """NaN, a wrong shape, an unknown key, a step from the future: each refused by the relay with
    the PS's own error code, nothing recorded; the job then trains bit for bit as without them."""
    reference = _direct_one_worker(certs)
    ps = start_ps(certs)
    site = relay(certs, ps.port)
    net = NetThread("evil")
    gate = threading.Barrier(2)
    w0 = Worker(0, 1, connect(certs, site.ports[0]), STEPS, digits(), gate=gate)
    thread = threading.Thread(target=w0.run, daemon=True)
    try:
        thread.start()
        assert w0.started.wait(30) and w0.error is None
        shard = site.relay.shards[0]
        shapes = site.net.run(_read(lambda: {k: tuple(v.shape) for k, v in shard.site.params.items()}))
        key, shape = next(iter(shapes.items()))
        fp32 = make_codec("fp32")
        evil = make_client(connect(certs, site.ports[0]), "evil", 1)
        net.run(evil.connect())
        bad = {
            "non-finite": {key: fp32.encode(torch.full(shape, float("nan")))},
            "shape": {key: fp32.encode(torch.zeros(shape[0] + 1, *shape[1:]))},
            "key": {"no.such.key": fp32.encode(torch.zeros(3))},
        }
        for code, grads in bad.items():
            with pytest.raises(PeerError) as info:
                net.run(evil._request(Push(0, 8, len(shapes), grads), object))
            assert info.value.code == code, info.value
        with pytest.raises(PeerError) as info:
            net.run(evil._request(Push(3, 8, len(shapes), {key: fp32.encode(torch.zeros(shape))}), object))
        assert info.value.code == "stale"
        assert site.net.run(_read(lambda: dict(shard.site._core.pending))) == {}  # nothing recorded
        assert ps.call(lambda: ps.server.store.version) == 0
        net.run(evil.close())  # BYE: out of the site's barrier
        gate.wait(30)
        thread.join(60)
        assert w0.error is None, w0.error
        got = params_of(ps)
    finally:
        net.close()
        site.stop()
        ps.stop()
    for k in reference:
        assert torch.equal(got[k], reference[k]), k


def test_local_worker_killed_is_dropped_and_the_job_goes_on(certs: CertPaths) -> None:
    """A local worker dies without BYE after step 2: the relay's barrier timeout (1 s) drops it,
    the site pushes the survivor's gradient with its samples alone, the upstream never waits."""
    ps = start_ps(certs)
    site = relay(certs, ps.port, barrier_timeout_s=1.0, site_workers=2)
    upstream_live: list[list[str]] = []
    site_live: list[list[str]] = []

    def crash(w: Worker) -> None:
        assert w.opt is not None
        if w.opt.version == 2:
            w.crash = True

    def watch(w: Worker) -> None:
        upstream_live.append(ps.call(lambda: sorted(ps.server.store.live)))
        site_live.append(site.net.run(_read(lambda: sorted(site.relay.shards[0].site.live))))

    try:
        here = connect(certs, site.ports[0])
        workers = [Worker(0, 2, here, STEPS, digits(), hook=watch), Worker(1, 2, here, STEPS, digits(), hook=crash)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
    finally:
        site.stop()
        ps.stop()
    assert site_live[-1] == ["w0"]  # dropped by the relay's barrier timeout
    assert upstream_live == [["relay-a"]] * STEPS  # the upstream never dropped the site
    assert all(torch.isfinite(p).all() for p in workers[0].model.parameters())


def test_relay_restart_local_workers_reconnect(certs: CertPaths) -> None:
    """The relay stops after step 2 and a new one listens on the same port: the local workers
    reconnect as to a restarted PS, the new relay rejoins upstream as the same worker, and the job
    finishes with every replica equal to the PS."""
    ps = start_ps(certs)
    box = {"site": relay(certs, ps.port, site_workers=2)}
    port = box["site"].ports[0]
    restarted = threading.Event()

    def restart(w: Worker) -> None:
        assert w.opt is not None
        if w.rank == 0 and w.opt.version == 2 and not restarted.is_set():
            restarted.set()
            box["site"].stop()
            settings = RelaySettings(upstream=(connect(certs, ps.port),), site="a", server=ServerSettings(port=port), site_workers=2)
            box["site"] = start_relay(settings, cert=str(certs.cert), key=str(certs.key), secret=load_secret(certs.secret))

    try:
        workers = [Worker(r, 2, connect(certs, port), STEPS, digits(), hook=restart) for r in range(2)]
        run_workers(workers)
        got = params_of(ps)
    finally:
        box["site"].stop()
        ps.stop()
    assert restarted.is_set()
    assert sum(w.opt.reconnects for w in workers if w.opt is not None) >= 1  # type: ignore[attr-defined]
    for w in workers:
        for p, k in zip(w.model.parameters(), got):
            assert torch.equal(p.detach(), got[k])


async def _read(fn):  # type: ignore[no-untyped-def]
    return fn()


def test_upstream_restarts_empty_and_the_site_seeds_it(certs: CertPaths) -> None:
    """The PS restarts without a checkpoint after step 2 while rank 0 is behind the relay: the relay
    reconnects and seeds the new PS with the site's replica (as a direct rank 0 would), its workers
    are told to reconnect, resync at version 0 and train on."""
    box = {"ps": start_ps(certs)}
    port = box["ps"].port
    site = relay(certs, port, site_workers=2)
    restarted = threading.Event()

    def restart(w: Worker) -> None:
        assert w.opt is not None
        if w.rank == 0 and w.opt.version == 2 and not restarted.is_set():
            restarted.set()
            box["ps"].stop()
            box["ps"] = start_ps(certs, port=port)

    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits(), hook=restart) for r in range(2)]
        run_workers(workers, timeout=240)
        ps = box["ps"]
        assert ps.call(lambda: ps.server.store.version) == STEPS
        got = params_of(ps)
    finally:
        site.stop()
        box["ps"].stop()
    assert restarted.is_set()
    assert sum(w.opt.reconnects for w in workers if w.opt is not None) >= 2  # both were told to resync
    for w in workers:
        for p, k in zip(w.model.parameters(), got):
            assert torch.equal(p.detach(), got[k])
