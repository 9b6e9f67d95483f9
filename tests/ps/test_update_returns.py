"""The update's return: the PS times every copy of an update to its delivery and reports the
latest complete one in the next PUSH's ACK (ps/returns.py, docs/POLICIES.md "The update's return")."""

from __future__ import annotations

import asyncio

import torch

from netsense.compression import make_codec
from netsense.ps.returns import UpdateReturn, UpdateReturns
from netsense.transport.auth import load_secret
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.worker.client import Identity, PSClient
from netsense.worker.netthread import NetThread

FP32 = make_codec("fp32")


def test_a_version_is_reported_once_closed_and_every_copy_delivered() -> None:
    r = UpdateReturns()
    r.written(3, 1000, at=10.0)
    r.written(3, 1200, at=10.1)
    r.delivered(3, at=10.4)
    r.close(3)
    assert r.latest is None  # one copy still on its way
    r.delivered(3, at=10.9)
    assert r.latest == UpdateReturn(3, 1200, 10.9 - 10.0)  # first write to last delivery, largest copy


def test_copies_delivered_before_the_close_complete_at_the_close() -> None:
    r = UpdateReturns()
    r.written(1, 500, at=1.0)
    r.delivered(1, at=1.25)
    assert r.latest is None  # another copy could still be written
    r.close(1)
    assert r.latest == UpdateReturn(1, 500, 0.25)


def test_an_older_version_never_replaces_a_newer_and_stale_ones_are_dropped() -> None:
    r = UpdateReturns()
    r.written(1, 500, at=1.0)  # never delivered (its worker left)
    r.written(2, 500, at=2.0)
    r.delivered(2, at=2.5)
    r.close(2)
    assert r.latest == UpdateReturn(2, 500, 0.5)
    r.delivered(1, at=9.0)  # dropped when 2 closed: nothing to record
    assert r.latest == UpdateReturn(2, 500, 0.5)


def test_each_ack_reports_a_newer_complete_update_once(ps) -> None:  # type: ignore[no-untyped-def]
    """Two workers on loopback: an update's return is complete once the next update is applied
    (every worker took its copy, and acknowledged it on the packets of its next push), so the push
    that applies update s + 1 hears of update s in its ACK, and the other connection at its next
    push unless it heard of a newer one first; every report is one copy's size, and no connection
    hears of one update twice."""
    net = NetThread("test-workers")
    conf = client_configuration(TransportSettings(), ca=str(ps.certs.ca), server_name="127.0.0.1")
    clients = [PSClient("127.0.0.1", ps.port, conf, Identity(f"w{r}", r, load_secret(ps.certs.secret))) for r in range(2)]
    n = 1 << 16

    async def step(client: PSClient, step: int) -> tuple[tuple[int, float] | None, int]:
        pull = asyncio.ensure_future(client.pull(step, step + 1))
        await client.push(step, 1, 1, {"w": FP32.encode(torch.full((n,), float(step + 1)))})
        report = client.take_delivered()
        params = await pull
        return report, len(params.tensors["w"].parts[0])

    async def scenario() -> list[list[tuple[tuple[int, float] | None, int]]]:
        for c in clients:
            await c.connect()
        await clients[0].init({"w": FP32.encode(torch.zeros(n))}, {"name": "sgd", "lr": 0.1}, world_size=2)
        for c in clients:
            await c.pull(-1, 0)
        out = []
        for s in range(3):
            out.append(list(await asyncio.gather(*(step(c, s) for c in clients))))
        return out

    try:
        steps = net.run(scenario())
    finally:
        for c in clients:
            net.run(c.close())
        net.close()
    assert all(report is None for report, _ in steps[0])  # no update returned before step 0's push
    assert all(any(report is not None for report, _ in step) for step in steps[1:])  # the applying push's
    size = steps[1][0][1]  # one copy's tensor bytes; the message adds its framing
    for worker in range(2):
        reports = [s[worker][0] for s in steps if s[worker][0] is not None]
        assert 1 <= len(reports) <= 2 and len(set(reports)) == len(reports)  # updates 1 and 2 at most, once
        assert all(size < nbytes < size + 1024 and 0 < seconds < 5 for nbytes, seconds in reports)
