"""Goodput of the transport: the wire format over TCP on loopback against a raw socket sending
the same bytes; through the link emulator at 20 Mbit/s against the set rate (goal >= 90%); and
WebRTC data channels on loopback. Frames are YOLO-sized cut tensors (1.6 MB fp32).

    python benchmarks/transport_goodput.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save, table  # noqa: E402

FRAME = np.random.default_rng(0).random((1, 64, 80, 80), dtype=np.float32)  # 1.6 MB


async def wire_goodput(port: int, seconds: float, connect) -> float:
    """MB/s of InferRequest frames sent back to back; the receiver acks each with a tiny frame."""
    from splitinfer.transport import wire

    ch = await connect(port)
    sent, t0, i = 0, time.monotonic(), 0
    inflight = 0
    while time.monotonic() - t0 < seconds:
        info = await ch.send(wire.InferRequest(i, "h", "c", {"x": FRAME}))
        sent += info.nbytes
        i += 1
        inflight += 1
        if inflight >= 3:  # keep the pipe full but bounded
            await ch.recv()
            inflight -= 1
    for _ in range(inflight):
        await ch.recv()
    dt = time.monotonic() - t0
    await ch.aclose()
    return sent / dt / 1e6


async def ack(ch) -> None:
    from splitinfer.transport import wire

    while True:
        m = await ch.recv()
        await ch.send(wire.Result(m.request_id, {}))


async def raw_goodput(port: int, seconds: float) -> float:
    data = FRAME.tobytes()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    sent, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        w.write(data)
        await w.drain()
        sent += len(data)
    w.write_eof()
    await r.read()
    dt = time.monotonic() - t0
    w.close()
    return sent / dt / 1e6


async def sink(r, w) -> None:
    while await r.read(1 << 20):
        pass
    w.close()


async def main_async(seconds: float, rounds: int) -> dict:
    from splitinfer.transport.netem import LinkEmulator
    from splitinfer.transport.tcp import TcpChannel, TcpServer

    out: dict = {"tcp_wire_MBps": [], "tcp_raw_MBps": [], "emulated_20mbit_Mbps": [], "webrtc_MBps": []}
    srv = await TcpServer.start(ack)
    raw = await asyncio.start_server(sink, "127.0.0.1", 0)
    raw_port = raw.sockets[0].getsockname()[1]

    async def tcp_connect(port):
        return await TcpChannel.connect("127.0.0.1", port)

    for _ in range(rounds):  # interleaved, side by side
        out["tcp_wire_MBps"].append(await wire_goodput(srv.port, seconds, tcp_connect))
        out["tcp_raw_MBps"].append(await raw_goodput(raw_port, seconds))
    async with LinkEmulator(("127.0.0.1", srv.port), rate_mbps=20) as emu:
        for _ in range(rounds):
            out["emulated_20mbit_Mbps"].append(await wire_goodput(emu.port, max(seconds, 4.0), tcp_connect) * 8)
    await srv.aclose()
    raw.close()
    try:
        import aioice.ice
        from aiohttp import web

        from splitinfer.transport.webrtc import WebRtcAcceptor, WebRtcChannel

        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # loopback-only peers
        acceptor = WebRtcAcceptor(ack)
        app = web.Application()
        app.router.add_post("/offer", acceptor.aiohttp_handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]

        async def rtc_connect(_port):
            return await WebRtcChannel.connect(f"http://127.0.0.1:{port}/offer")

        for _ in range(rounds):
            out["webrtc_MBps"].append(await wire_goodput(port, seconds, rtc_connect))
        await acceptor.aclose()
        await runner.cleanup()
    except ImportError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = asyncio.run(main_async(args.seconds, args.rounds))
    med = {k: statistics.median(v) for k, v in out.items() if v}
    rows = [["TCP, wire format (loopback)", f"{med['tcp_wire_MBps']:,.0f} MB/s", ""],
            ["TCP, raw socket, same bytes", f"{med['tcp_raw_MBps']:,.0f} MB/s",
             f"wire/raw = {med['tcp_wire_MBps'] / med['tcp_raw_MBps']:.2f}"],
            ["through netem at 20 Mbit/s", f"{med['emulated_20mbit_Mbps']:.2f} Mbit/s",
             f"{med['emulated_20mbit_Mbps'] / 20:.1%} of the set rate (goal >= 90%)"]]
    if "webrtc_MBps" in med:
        rows.append(["WebRTC data channel (loopback)", f"{med['webrtc_MBps']:.2f} MB/s", ""])
    table(f"goodput, 1.6 MB frames, median of {args.rounds} interleaved rounds", ["path", "goodput", "ratio"], rows)
    print(f"wrote {save('transport_goodput', {'runs': out, 'median': med})}")


if __name__ == "__main__":
    main()
