"""TCP and TLS channels over real loopback sockets, and the in-memory pair."""

from __future__ import annotations

import asyncio
import socket
import struct

import numpy as np
import pytest

from conftest import arun
from splitinfer import ChannelClosed, ChannelError, LimitError
from splitinfer.transport import wire
from splitinfer.transport.memory import memory_pair
from splitinfer.transport.tcp import TcpChannel, TcpServer, client_ssl_context, server_ssl_context
from splitinfer.transport.wire import InferRequest, Limits, Ping, Pong, Result, ServerTimings


async def echo(ch):
    while True:
        try:
            m = await ch.recv()
        except LimitError:
            raise
        except wire.ProtocolError as exc:  # content error: say so, keep serving
            await ch.send(wire.Error(None, "protocol", str(exc)))
            continue
        if isinstance(m, Ping):
            await ch.send(Pong(m.seq, m.sent_at, recv_ms=m.info.seconds * 1e3, nbytes=m.info.nbytes))
        else:
            await ch.send(Result(m.request_id, m.tensors, timings=ServerTimings(recv_ms=m.info.seconds * 1e3)))


def test_round_trips_many_frames_in_order():
    async def main():
        async with await TcpServer.start(echo) as srv:
            async with await TcpChannel.connect("127.0.0.1", srv.port) as ch:
                xs = [np.random.default_rng(i).random((1, 16, 40, 40), dtype=np.float32) for i in range(5)]
                for i, x in enumerate(xs):  # pipelined: send all, then read all
                    await ch.send(InferRequest(i, "h", "c1", {"x": x}))
                for i, x in enumerate(xs):
                    r = await ch.recv()
                    assert r.request_id == i and np.array_equal(r.outputs["x"], x)
                    assert r.info.nbytes > x.nbytes and r.info.end >= r.info.start
    arun(main())


def test_tls_round_trip_and_untrusted_server(tls_files):
    async def main():
        sctx = server_ssl_context(str(tls_files["cert"]), str(tls_files["key"]))
        async with await TcpServer.start(echo, ssl=sctx) as srv:
            cctx = client_ssl_context(str(tls_files["ca"]))
            async with await TcpChannel.connect("127.0.0.1", srv.port, ssl=cctx, server_hostname="localhost") as ch:
                x = np.arange(100_000, dtype=np.float32)
                await ch.send(InferRequest(1, "h", "c", {"x": x}))
                r = await ch.recv()
                assert np.array_equal(r.outputs["x"], x) and ch.peer.startswith("tls://")
            with pytest.raises(ChannelError, match="cannot connect to tls://"):
                await TcpChannel.connect("127.0.0.1", srv.port, ssl=client_ssl_context(None),
                                         server_hostname="localhost")
    arun(main())


def test_malformed_content_is_answered_and_the_connection_survives():
    async def main():
        async with await TcpServer.start(echo) as srv:
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            junk = b"\x00\x00\x00\x02\xc1\xc1"  # header length 2, then an invalid msgpack byte pair
            w.write(struct.pack(">I", len(junk)) + junk)
            n = struct.unpack(">I", await r.readexactly(4))[0]
            err = wire.decode(await r.readexactly(n))
            assert isinstance(err, wire.Error) and "not valid msgpack" in err.message
            good = wire.encode_bytes(Ping(1, 0.0))
            w.write(struct.pack(">I", len(good)) + good)
            n = struct.unpack(">I", await r.readexactly(4))[0]
            assert isinstance(wire.decode(await r.readexactly(n)), Pong)
            w.close()
    arun(main())


def test_broken_framing_closes_the_connection():
    async def main():
        limits = Limits(max_frame=1 << 20)
        async with await TcpServer.start(echo, limits=limits) as srv:
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(struct.pack(">I", 1 << 30))  # claims a 1 GiB frame
            assert await asyncio.wait_for(r.read(), 5) == b""  # closed, nothing sent back
            w.close()
            # the server still serves others
            async with await TcpChannel.connect("127.0.0.1", srv.port) as ch:
                await ch.send(Ping(2, 0.0))
                assert isinstance(await ch.recv(), Pong)
    arun(main())


def test_oversized_send_is_refused_locally():
    async def main():
        async with await TcpServer.start(echo) as srv:
            async with await TcpChannel.connect("127.0.0.1", srv.port, limits=Limits(max_frame=1000)) as ch:
                with pytest.raises(LimitError, match="over the limit 1000"):
                    await ch.send(InferRequest(1, "h", "c", {"x": np.zeros(1000, np.float32)}))
    arun(main())


def test_peer_close_and_connect_errors():
    async def main():
        async def close_at_once(ch):
            await ch.aclose()

        async with await TcpServer.start(close_at_once) as srv:
            ch = await TcpChannel.connect("127.0.0.1", srv.port)
            with pytest.raises(ChannelClosed):
                await asyncio.wait_for(ch.recv(), 5)
            assert ch.closed
            await ch.aclose()
            await ch.aclose()  # safe twice
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with pytest.raises(ChannelError, match=f"cannot connect to tcp://127.0.0.1:{port}"):
            await TcpChannel.connect("127.0.0.1", port)
    arun(main())


def test_server_close_leaves_no_connection_or_task():
    async def main():
        before = asyncio.all_tasks()
        srv = await TcpServer.start(echo)
        chans = [await TcpChannel.connect("127.0.0.1", srv.port) for _ in range(5)]
        for c in chans:
            await c.send(Ping(0, 0.0))
            await c.recv()
        assert srv.connections == 5
        await srv.aclose()
        assert srv.connections == 0
        for c in chans:
            with pytest.raises(ChannelClosed):
                await asyncio.wait_for(c.recv(), 5)
        assert asyncio.all_tasks() == before
    arun(main())


def test_memory_pair_uses_the_wire_format():
    async def main():
        a, b = memory_pair()
        await a.send(InferRequest(1, "h", "c", {"x": np.ones(3, np.float32)}, codec="fp16"))
        m = await b.recv()
        assert m.tensors["x"].dtype == np.float32 and m.info.nbytes > 0
        await a.aclose()
        with pytest.raises(ChannelClosed):
            await b.recv()
    arun(main())


def test_content_error_through_memory_pair():
    async def main():
        a, b = memory_pair()
        await a.send(wire.Hello("h", "c", protocol=1))
        m = await b.recv()
        assert m.client_id == "c"
        await a._outbox.put((b"\x00\x00\x00\x00", wire.FrameInfo(4, 0, 0)))  # an empty header
        with pytest.raises(wire.ProtocolError):
            await b.recv()
        assert not b.closed
    arun(main())


def test_frames_that_arrived_before_a_clean_close_are_delivered_before_it():
    """A peer that sends its last frames (a result, a bye) and closes: the reader gets every frame
    that arrived whole, then ChannelClosed, even when it reads only after the close was seen."""
    async def say_and_close(ch):
        for i in range(3):
            await ch.send(Result(i, {"x": np.full(50_000, i, np.float32)}))
        await ch.send(wire.Bye("shutdown"))
        await ch.aclose()

    async def main():
        async with await TcpServer.start(say_and_close) as srv:
            ch = await TcpChannel.connect("127.0.0.1", srv.port)
            await asyncio.wait_for(asyncio.shield(ch._p.lost), 10)  # the close has arrived; nothing read yet
            got = [await ch.recv() for _ in range(4)]
            assert [m.request_id for m in got[:3]] == [0, 1, 2] and isinstance(got[3], wire.Bye)
            assert np.array_equal(got[2].outputs["x"], np.full(50_000, 2, np.float32))
            with pytest.raises(ChannelClosed):
                await ch.recv()
            await ch.aclose()
    arun(main())
