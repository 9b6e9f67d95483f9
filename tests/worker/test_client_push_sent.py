"""PSClient.push(sent=): the future resolves once the PUSH's bytes have left, no later than its ACK;
pipelined pushes pace on it (worker/overlap.py)."""

from __future__ import annotations

import asyncio

import torch

from netsense.compression import make_codec
from netsense.transport.auth import load_secret
from netsense.transport.sensing.aioquic_private import stream_unsent
from netsense.transport.tls import TransportSettings, client_configuration
from netsense.worker.client import Identity, PSClient
from netsense.worker.netthread import NetThread

FP32 = make_codec("fp32")


def test_sent_resolves_when_the_bytes_are_out_before_the_ack(ps) -> None:  # type: ignore[no-untyped-def]
    net = NetThread("test-worker")
    client = PSClient(
        "127.0.0.1", ps.port, client_configuration(TransportSettings(), ca=str(ps.certs.ca), server_name="127.0.0.1"),
        Identity("w0", 0, load_secret(ps.certs.secret)),
    )  # fmt: skip

    async def scenario() -> tuple[bool, bool, bool]:
        await client.connect()
        await client.init({"w": FP32.encode(torch.zeros(1 << 20))}, {"name": "sgd", "lr": 0.1})
        assert client.conn is not None
        sid = client.conn.quic.get_next_available_stream_id()
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        quic = client.conn.quic
        sent.add_done_callback(lambda _: at_sent.append(stream_unsent(quic, sid)))  # must be all out by then
        push = asyncio.ensure_future(client.push(0, 1, 1, {"w": FP32.encode(torch.ones(1 << 20))}, sent=sent))
        await asyncio.sleep(0)
        unsent_at_first = stream_unsent(client.conn.quic, sid)  # 4 MiB cannot all leave at once
        await sent
        order = not push.done() or push.result() == 1  # sent first, or both in the same iteration
        await push
        return unsent_at_first, order, stream_unsent(client.conn.quic, sid)

    at_sent: list[bool] = []
    try:
        unsent_at_first, order, unsent_after = net.run(scenario())
        assert unsent_at_first and order and not unsent_after and at_sent == [False]
        assert ps.server.store.version == 1
    finally:
        net.run(client.close())
        net.close()
