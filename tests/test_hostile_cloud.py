"""The cloud under hostile clients (issue 10's table, one test per row): every frame is checked
before it costs memory or compute, every connection and buffer is bounded in size and time,
tokens guard everything but health, and a shutdown answers everyone."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import arun, make_model

pytest.importorskip("aiohttp")

import aiohttp  # noqa: E402
import zstandard  # noqa: E402

from splitinfer.cloud import CloudService  # noqa: E402
from splitinfer.errors import FieldError, LimitError, SplitinferError  # noqa: E402
from splitinfer.splitter import Plan, split_model  # noqa: E402
from splitinfer.transport import TcpChannel, wire  # noqa: E402
from splitinfer.codecs import Encoded  # noqa: E402


def service(plan_dir, **kw):
    kw.setdefault("listen", ("127.0.0.1", 0))
    kw.setdefault("http", ("127.0.0.1", 0))
    kw.setdefault("advertise", False)
    return CloudService([plan_dir], **kw)


async def hello(svc, plan, token=None):
    ch = await TcpChannel.connect("127.0.0.1", svc.port)
    await ch.send(wire.Hello(plan.hash, "cam", token=token))
    reply = await asyncio.wait_for(ch.recv(), 10)
    assert isinstance(reply, wire.Welcome), reply
    return ch


def zstd_zeros(nbytes: int) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(bytes(nbytes))


def bomb(plan, cid: str, n: int = 4, mib: int = 16) -> wire.InferRequest:
    """An infer frame of a few KB whose tensors declare ``n`` x ``mib`` MiB of int8 zeros."""
    side = int(np.sqrt(mib << 20))
    payload = zstd_zeros(side * side)
    q = {"axis": 1, "scale": np.ones(1, np.float32).tobytes(), "min": np.zeros(1, np.float32).tobytes()}
    tensors = {f"t{k}": Encoded("float32", (1, 1, side, side), "int8+zstd", payload, q) for k in range(n)}
    return wire.InferRequest(1, plan.hash, cid, tensors, codec="int8+zstd")


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True when the server closed (or reset) the connection within ``seconds``."""
    try:
        while await asyncio.wait_for(reader.read(1 << 16), seconds):
            pass
        return True
    except ConnectionError:
        return True
    except asyncio.TimeoutError:
        return False


@pytest.fixture
def count_decodes(monkeypatch):
    """Counts payload decodes in the service (the real decoder runs; this only counts calls)."""
    from splitinfer.cloud import service as service_module

    calls = []
    real = service_module.wire.decode_tensors

    def counting(tensors):
        calls.append(sum(int(np.prod(e.shape)) for e in tensors.values()))
        return real(tensors)

    monkeypatch.setattr(service_module.wire, "decode_tensors", counting)
    return calls


def test_an_infer_frame_before_hello_is_refused_undecoded(yolo_plan, count_decodes):
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan) as svc:
            ch = await TcpChannel.connect("127.0.0.1", svc.port)
            await ch.send(bomb(plan, "cloud"))  # 4 x 16 MiB declared, a few KB on the wire
            reply = await asyncio.wait_for(ch.recv(), 10)
            assert isinstance(reply, wire.Refusal) and reply.reason == "protocol", reply
            assert "expected a hello" in reply.message
            await ch.aclose()

    arun(main())
    assert count_decodes == []


def test_tensor_headers_are_checked_against_the_cut_before_decompressing(yolo_plan, count_decodes):
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan) as svc:
            ch = await hello(svc, plan)
            await ch.send(bomb(plan, "cloud"))
            err = await asyncio.wait_for(ch.recv(), 10)
            assert isinstance(err, wire.Error) and err.code == "shape", err
            await ch.aclose()

    arun(main())
    assert count_decodes == []


def test_jpeg_pixels_count_before_the_jpeg_is_decoded(yolo_plan, count_decodes):
    """An 8000x8000 JPEG is refused from its declared shape (the wire's cap counts JPEG pixels)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="JPEG")
    enc = Encoded("float32", (1, 3, 8000, 8000), "jpeg", buf.getvalue())
    frame = wire.encode_bytes(wire.InferRequest(1, "h", "cloud", {"input": enc}, codec="jpeg"))
    with pytest.raises(LimitError, match="decode to"):
        wire.decode(frame, limits=wire.Limits(max_decoded=64 << 20))
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan) as svc:
            ch = await hello(svc, plan)
            await ch.send(wire.InferRequest(1, plan.hash, "cloud", {plan.inputs[0].name: enc}, codec="jpeg"))
            err = await asyncio.wait_for(ch.recv(), 10)
            assert isinstance(err, wire.Error) and err.code in ("shape", "protocol"), err
            await ch.aclose()

    arun(main())
    assert count_decodes == []


def test_declared_lengths_do_not_allocate_and_stalled_frames_are_dropped(yolo_plan):
    """Connections that declare 64 MiB frames and send 8 bytes hold kilobytes, not gigabytes;
    before the hello a big frame closes the connection at once; mid-frame stalls time out."""
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan, frame_idle_s=0.5) as svc:
            # no hello: a 64 MiB length is over the pre-hello limit, the connection closes at once
            pre = []
            for _ in range(50):
                r, w = await asyncio.open_connection("127.0.0.1", svc.port)
                w.write(struct.pack(">I", 64 << 20) + bytes(8))
                pre.append((r, w))
            assert all(await asyncio.gather(*(closed_within(r, 5) for r, _ in pre)))
            # after a hello: the frame buffer grows with what arrived (64 KiB first), then stalls
            stalled = []
            for _ in range(50):
                ch = await hello(svc, plan)
                ch._p.transport.write(struct.pack(">I", 64 << 20) + bytes(8))
                stalled.append(ch)
            deadline = time.monotonic() + 5
            while svc._tcp.partial_bytes < 50 * 8 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert 0 < svc._tcp.partial_bytes <= 50 * (64 << 10), svc._tcp.partial_bytes
            for ch in stalled:  # dropped after frame_idle_s without a byte
                with pytest.raises(SplitinferError):  # the connection was closed under it
                    await asyncio.wait_for(ch.recv(), 5)
            assert svc._tcp.partial_bytes == 0
            good = await hello(svc, plan)  # and the service still serves
            await good.aclose()

    arun(main())


def test_max_connections_closes_the_excess_and_keeps_serving(yolo_plan):
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan, max_connections=4) as svc:
            held = [await hello(svc, plan) for _ in range(4)]
            extra = [await asyncio.open_connection("127.0.0.1", svc.port) for _ in range(3)]
            assert all(await asyncio.gather(*(closed_within(r, 5) for r, _ in extra)))
            assert svc._tcp.rejected >= 3
            await held.pop().aclose()
            deadline = time.monotonic() + 5
            while svc._tcp.connections >= 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            good = await hello(svc, plan)
            await good.aclose()
            for ch in held:
                await ch.aclose()

    arun(main())


def test_idle_connections_are_closed(yolo_plan):
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan, hello_timeout_s=0.5, idle_timeout_s=0.5) as svc:
            r, w = await asyncio.open_connection("127.0.0.1", svc.port)  # says nothing
            assert await closed_within(r, 5)
            ch = await hello(svc, plan)  # says hello, then nothing
            bye = await asyncio.wait_for(ch.recv(), 5)
            assert isinstance(bye, wire.Bye) and "idle" in bye.reason

    arun(main())


def test_rows_per_request_are_capped(yolo_plan, count_decodes):
    plan = Plan.load(yolo_plan)
    cand = next(c for c in plan.candidates if c.cloud is not None and c.cloud.batch_dynamic)

    async def main():
        async with service(yolo_plan, max_rows=4) as svc:
            ch = await hello(svc, plan)
            tensors = {t.name: np.zeros((300, *t.shape[1:]), t.dtype) for t in cand.cut}
            t0 = time.monotonic()
            await ch.send(wire.InferRequest(1, plan.hash, cand.id, tensors, codec="int8+lz4"))
            err = await asyncio.wait_for(ch.recv(), 10)
            assert isinstance(err, wire.Error) and err.code == "bad_request" and "max_rows" in err.message, err
            assert time.monotonic() - t0 < 2.0
            await ch.aclose()

    arun(main())
    assert count_decodes == []


def test_non_finite_deadlines_are_refused(yolo_plan):
    frame = wire.encode_bytes(wire.InferRequest(1, "h", "cloud", {}, deadline_ms=float("nan")))
    with pytest.raises(FieldError, match="deadline_ms"):
        wire.decode(frame)
    frame = wire.encode_bytes(wire.InferRequest(1, "h", "cloud", {}, deadline_ms=float("inf")))
    with pytest.raises(FieldError, match="deadline_ms"):
        wire.decode(frame)


def test_http_endpoints_need_the_token_except_health(yolo_plan, tmp_path):
    async def main():
        async with service(yolo_plan, tokens={"s3cret"}) as svc:
            base = svc.addresses["http"]
            async with aiohttp.ClientSession() as http:
                for path in ("/healthz", "/readyz"):
                    async with http.get(base + path) as r:
                        assert r.status == 200
                for path in ("/metrics", "/v1/plans"):
                    async with http.get(base + path) as r:
                        assert r.status == 401
                    async with http.get(base + path, headers={"Authorization": "Bearer nope"}) as r:
                        assert r.status == 401
                    async with http.get(base + path, headers={"Authorization": "Bearer s3cret"}) as r:
                        assert r.status == 200
                async with http.post(base + "/v1/webrtc/offer", json={"sdp": "v=0", "type": "offer"}) as r:
                    assert r.status == 401
                assert svc._webrtc is None or svc._webrtc.peers == 0

    arun(main())


def test_webrtc_peers_that_never_open_are_closed(yolo_plan):
    pytest.importorskip("aiortc")
    from aiortc import RTCPeerConnection

    async def main():
        async with service(yolo_plan) as svc:
            svc._webrtc.open_timeout_s = 0.5
            svc._webrtc.max_peers = 3
            base = svc.addresses["http"]
            clients = []
            statuses = []
            async with aiohttp.ClientSession() as http:
                for _ in range(5):
                    pc = RTCPeerConnection()
                    pc.createDataChannel("x")
                    await pc.setLocalDescription(await pc.createOffer())
                    clients.append(pc)
                    async with http.post(base + "/v1/webrtc/offer",
                                         json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r:
                        statuses.append(r.status)
            for pc in clients:  # the offers' owners vanish without connecting
                await pc.close()
            assert statuses.count(200) == 3 and statuses.count(503) == 2, statuses
            deadline = time.monotonic() + 10
            while svc._webrtc.peers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert svc._webrtc.peers == 0

    arun(main(), timeout=60)


def test_non_loopback_without_token_warns(yolo_plan, caplog):
    async def main():
        async with service(yolo_plan, listen=("0.0.0.0", 0), http=None):
            pass

    with caplog.at_level("WARNING"):
        arun(main())
    assert any("without a token" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- shutdown during a long batch

@pytest.fixture(scope="module")
def slow_plan(tmp_path_factory) -> Path:
    """A plan whose cloud segment takes about a second on this machine: MatMuls of 1024x1024."""
    n = 1024
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.random((n, n), dtype=np.float32) - 0.5) / n, f"W{k}") for k in range(12)]
    nodes, x = [], "x"
    for k in range(12):
        nodes.append(helper.make_node("MatMul", [x, f"W{k}"], [f"h{k}"], name=f"mm{k}"))
        x = f"h{k}"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n, n])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n, n])], inits)
    src = tmp_path_factory.mktemp("slow") / "slow.onnx"
    onnx.save(model, src)
    out = src.parent / "plan"
    split_model(src, out, profile=False, verify=False, report=False, max_candidates=2)
    return out


def test_sigterm_during_a_batch_longer_than_the_drain_exits_0_and_answers(slow_plan):
    """`cloud serve` stopped while a batch runs past the drain: exit 0, no traceback, the client
    gets its answer (a result or an error "shutdown") and a bye."""
    plan = Plan.load(slow_plan)
    proc = subprocess.Popen([sys.executable, "-m", "splitinfer", "cloud", "serve", str(slow_plan),
                             "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-advertise",
                             "--drain-s", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = metrics = None
        for line in proc.stdout:
            if m := re.match(r"edge: tcp://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
            if m := re.match(r"metrics: (\S+)", line):
                metrics = m.group(1)
            if line.startswith("serving"):
                break
        assert port and metrics, proc.stderr.read()

        async def queued(session: aiohttp.ClientSession) -> float:
            async with session.get(metrics) as resp:
                text = await resp.text()
            return sum(float(v) for v in re.findall(r"^splitinfer_queue_depth\{[^}]*\} (\S+)$", text, re.M))

        async def main():
            ch = await TcpChannel.connect("127.0.0.1", port)
            await ch.send(wire.Hello(plan.hash, "cam"))
            assert isinstance(await asyncio.wait_for(ch.recv(), 10), wire.Welcome)
            x = np.zeros(plan.inputs[0].shape, np.float32)
            for rid in range(1, 4):  # one runs, two wait behind it
                await ch.send(wire.InferRequest(rid, plan.hash, "cloud", {"x": x}, codec="raw"))
            async with aiohttp.ClientSession() as session:  # the server's own word that a batch runs
                while await queued(session) < 2:
                    await asyncio.sleep(0.02)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            got = []
            while True:
                msg = await asyncio.wait_for(ch.recv(), 20)
                got.append(msg)
                if isinstance(msg, wire.Bye):
                    break
            return got, time.monotonic() - t0

        try:
            got, took = arun(main(), timeout=60)
        except BaseException:
            proc.kill()
            proc.wait()
            print("server stderr:\n" + proc.stderr.read())  # shown by pytest with the failure
            raise
        answered = {m.request_id for m in got if isinstance(m, (wire.Result, wire.Error))}
        assert answered == {1, 2, 3}, got
        assert all(m.code == "shutdown" for m in got if isinstance(m, wire.Error)), got
        assert proc.wait(20) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err and "CancelledError" not in err, err
        assert took < 5  # the run in progress was terminated, not waited for
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_memory_is_freed_when_connections_close(yolo_plan):
    """A server's protocols and buffers are freed with their connection (no reference cycle)."""
    import gc
    import weakref

    from splitinfer.transport.tcp import _FrameProtocol

    refs = []
    real_init = _FrameProtocol.__init__

    def tracking(self, *a, **kw):
        real_init(self, *a, **kw)
        refs.append(weakref.ref(self))

    async def main():
        async def echo(ch):
            await ch.recv()

        from splitinfer.transport import TcpServer

        server = await TcpServer.start(echo, "127.0.0.1", 0)
        _FrameProtocol.__init__ = tracking
        try:
            for _ in range(5):
                r, w = await asyncio.open_connection("127.0.0.1", server.port)
                w.write(struct.pack(">I", 1 << 20) + bytes(1000))
                await w.drain()
                w.close()
                await closed_within(r, 5)
            deadline = time.monotonic() + 5
            while server.connections and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            _FrameProtocol.__init__ = real_init
        await server.aclose()

    gc.disable()
    try:
        arun(main())
        alive = [r for r in refs if r() is not None]
    finally:
        gc.enable()
    assert refs and not alive, f"{len(alive)} of {len(refs)} protocols still alive without the GC"


def test_wire_fuzz_short_run():
    """A short run of benchmarks/wire_fuzz.py's mutations: nothing but ProtocolError."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "wire_fuzz.py"), "--frames", "20000",
                          "--no-write"], capture_output=True, text=True, timeout=240, env={**os.environ})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "crashes 0" in out.stdout or '"crashes": 0' in out.stdout, out.stdout
