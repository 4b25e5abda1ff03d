"""WebRTC: two real aiortc peers on loopback, signalling over a real aiohttp server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import arun

pytest.importorskip("aiortc")
aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

from splitinfer import ChannelClosed, ChannelError  # noqa: E402
from splitinfer.transport import wire  # noqa: E402
from splitinfer.transport.webrtc import WebRtcAcceptor, WebRtcChannel  # noqa: E402


@pytest.fixture(autouse=True)
def loopback_ice(monkeypatch):
    # aioice leaves out loopback addresses; these peers only have loopback.
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


async def echo(ch):
    while True:
        m = await ch.recv()
        await ch.send(wire.Result(m.request_id, m.tensors, timings=wire.ServerTimings(recv_ms=m.info.seconds * 1e3)))


async def start_signalling(acceptor):
    app = web.Application()
    app.router.add_post("/offer", acceptor.aiohttp_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/offer"


def test_round_trip_small_and_chunked_frames():
    async def main():
        acceptor = WebRtcAcceptor(echo)
        runner, url = await start_signalling(acceptor)
        try:
            ch = await WebRtcChannel.connect(url)
            small = np.arange(10, dtype=np.float32)
            big = np.random.default_rng(0).random((1, 64, 80, 80), dtype=np.float32)  # 1.6 MB: 7 chunks
            for i, x in enumerate((small, big, small)):
                await ch.send(wire.InferRequest(i, "h", "c", {"x": x}))
            for i, x in enumerate((small, big, small)):
                r = await asyncio.wait_for(ch.recv(), 20)
                assert r.request_id == i and np.array_equal(r.outputs["x"], x)
            assert r.info.nbytes > 0 and acceptor.connections == 1
            await ch.aclose()
            with pytest.raises(ChannelClosed):
                await ch.send(wire.Ping(1, 0.0))
        finally:
            await acceptor.aclose()
            await runner.cleanup()
    arun(main(), timeout=60)


def test_bad_offer_and_unreachable_signalling():
    async def main():
        acceptor = WebRtcAcceptor(echo)
        runner, url = await start_signalling(acceptor)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(url, json={"sdp": 1}) as resp:
                    assert resp.status == 400 and "offer" in (await resp.json())["error"]
        finally:
            await acceptor.aclose()
            await runner.cleanup()
        with pytest.raises(ChannelError, match="cannot open a WebRTC data channel"):
            await WebRtcChannel.connect(url, timeout=3)
    arun(main(), timeout=30)
