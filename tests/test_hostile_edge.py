"""The edge against a hostile or misconfigured cloud and a failing camera (issue 10's table):
a reply that does not fit the plan is a fallback with its reason, never a result; TLS problems
are named; a source that fails ends the stream with its error; signals end the process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zstandard

from conftest import arun

from splitinfer.errors import SourceError
from splitinfer.edge import EdgeAgent
from splitinfer.splitter import Plan
from splitinfer.splitter.profiler import random_feeds
from splitinfer.transport import TcpServer, wire
from splitinfer.codecs import Encoded


def fake_cloud(reply):
    """A cloud that welcomes everyone and answers each request with ``reply(request)``."""
    async def handler(ch):
        hello = await ch.recv()
        assert isinstance(hello, wire.Hello)
        await ch.send(wire.Welcome("s"))
        while True:
            msg = await ch.recv(tensors=False)
            if isinstance(msg, wire.InferRequest):
                await ch.send(reply(msg))
            elif isinstance(msg, wire.Ping):
                await ch.send(wire.Pong(msg.seq, msg.sent_at))

    return TcpServer.start(handler, "127.0.0.1", 0)


def bad_replies(plan):
    out = plan.outputs[0]
    bomb_side = 8192
    bomb = Encoded("float32", (bomb_side * bomb_side,), "int8+zstd",  # 24 KB that decompress to 64 MiB
                   zstandard.ZstdCompressor().compress(bytes(bomb_side * bomb_side)),
                   {"axis": -1, "scale": np.ones(1, np.float32).tobytes(), "min": np.zeros(1, np.float32).tobytes()})
    huge = Encoded("float32", (1 << 30,), "int8+zstd", b"\x28\xb5\x2f\xfd" + bytes(20),  # declares 4 GiB
                   {"axis": -1, "scale": np.ones(1, np.float32).tobytes(), "min": np.zeros(1, np.float32).tobytes()})
    return {
        "wrong shape": lambda r: wire.Result(r.request_id, {out.name: np.zeros((1, 2), np.float32)}),
        "no outputs": lambda r: wire.Result(r.request_id, {}),
        "wrong name": lambda r: wire.Result(r.request_id, {"other": np.zeros(out.shape, np.float32)}),
        "wrong dtype": lambda r: wire.Result(r.request_id, {out.name: np.zeros(out.shape, np.float64)}),
        "decompression bomb": lambda r: wire.Result(r.request_id, {out.name: bomb}, codec="int8+zstd"),
        "over the decode cap": lambda r: wire.Result(r.request_id, {out.name: huge}, codec="int8+zstd"),
    }


@pytest.mark.parametrize("kind", ["wrong shape", "no outputs", "wrong name", "wrong dtype", "decompression bomb",
                                  "over the decode cap"])
def test_a_reply_that_does_not_fit_the_plan_is_a_fallback(yolo_plan, kind):
    plan = Plan.load(yolo_plan)

    async def main():
        server = await fake_cloud(bad_replies(plan)[kind])
        try:
            async with EdgeAgent(plan, f"tcp://127.0.0.1:{server.port}", candidate="cloud") as agent:
                assert agent.connected
                t0 = time.monotonic()
                r = await agent.infer(random_feeds(plan.inputs, seed=0))
                return r, time.monotonic() - t0
        finally:
            await server.aclose()

    r, took = arun(main())
    assert r.fallback and r.cloud_segment == "edge", r
    assert "bad reply from the cloud" in r.fallback_reason, r.fallback_reason
    assert r.outputs[plan.outputs[0].name].shape == plan.outputs[0].shape
    assert took < 5


def test_tls_with_an_untrusted_certificate_is_named_and_cafile_fixes_it(yolo_plan, tls_files, tmp_path):
    from splitinfer.cloud import CloudService

    plan = Plan.load(yolo_plan)

    async def main():
        async with CloudService([yolo_plan], listen=("127.0.0.1", 0), http=None, advertise=False,
                                tls_cert=str(tls_files["cert"]), tls_key=str(tls_files["key"])) as svc:
            url = f"tls://127.0.0.1:{svc.port}"
            async with EdgeAgent(plan, url, connect_timeout_s=3) as agent:
                assert not agent.connected
                r = await agent.infer(random_feeds(plan.inputs))
                why = r.conditions["cloud_error"]
                assert "certificate" in why and "--cafile" in why, r.conditions
            async with EdgeAgent(plan, url, connect_timeout_s=3, candidate="cloud") as agent:
                r = await agent.infer(random_feeds(plan.inputs))
                assert r.fallback and "certificate" in r.fallback_reason, r
            async with EdgeAgent(plan, url, cafile=str(tls_files["ca"]), candidate="cloud") as agent:
                assert agent.connected
                r = await agent.infer(random_feeds(plan.inputs))
                assert not r.fallback and r.placement == "cloud"
            return svc.port

    port = arun(main())
    # the command line: --cafile exists, and a missing one is exit 2 naming it
    p = subprocess.run([sys.executable, "-m", "splitinfer", "edge", "run", str(yolo_plan), "--cloud",
                        f"tls://127.0.0.1:{port}", "--cafile", str(tmp_path / "missing.pem"), "--frames", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--cafile" in p.stderr, p.stderr


def test_an_advertisement_cannot_turn_tls_off(yolo_plan, tls_files, monkeypatch):
    """zeroconf says tls=0, but the agent was given a CA: it speaks TLS (and so fails against a
    plain server instead of sending its token in clear)."""
    from splitinfer.transport import discovery

    plan = Plan.load(yolo_plan)
    seen = []

    async def main():
        async def handler(ch):
            seen.append("connected")
            await ch.recv()

        server = await TcpServer.start(handler, "127.0.0.1", 0)

        async def fake_discover(**kw):  # what a spoofed advertisement would say
            return [discovery.Service("evil", "127.0.0.1", server.port, wire.PROTOCOL_VERSION, (plan.hash,), tls=False)]

        monkeypatch.setattr(discovery, "discover", fake_discover)
        try:
            async with EdgeAgent(plan, "auto", token="secret", cafile=str(tls_files["ca"]),
                                 connect_timeout_s=2) as agent:
                assert not agent.connected
                return agent.last_error
        finally:
            await server.aclose()

    err = arun(main())
    assert err and "tls://" in err, err


def test_a_failing_frame_source_ends_the_stream_with_its_error(yolo_plan):
    plan = Plan.load(yolo_plan)

    def camera():
        for k in range(3):
            yield random_feeds(plan.inputs, seed=k)
        raise OSError("camera unplugged")

    async def main():
        got = []
        async with EdgeAgent(plan, None) as agent:
            with pytest.raises(SourceError, match="camera unplugged"):
                async for r in agent.stream(camera()):
                    got.append(r.index)
        return got

    assert arun(main(), timeout=60) == [0, 1, 2]


@pytest.mark.parametrize("source", ["missing.mp4", "text"])
def test_edge_run_with_a_bad_source_is_exit_2(yolo_plan, tmp_path, source):
    if source == "text":
        path = tmp_path / "notes.mp4"
        path.write_text("not a video\n")
        source = str(path)
    p = subprocess.run([sys.executable, "-m", "splitinfer", "edge", "run", str(yolo_plan), "--cloud", "none",
                        "--source", source], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and source.split("/")[-1] in p.stderr, p.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_edge_run(yolo_plan, tmp_path, sig):
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "splitinfer", "edge", "run", str(yolo_plan), "--cloud", "none",
                             "--source", "synthetic", "--frames", "100000", "--fps", "20", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "ready" in line:
                break
        deadline = time.monotonic() + 60
        while (not out.exists() or not out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a file another process writes: no event to wait on
        proc.send_signal(sig)
        assert proc.wait(20) == 0
        assert len(out.read_text().splitlines()) >= 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_with_a_missing_or_bad_source_or_model_is_exit_2(tmp_path):
    pytest.importorskip("supervision")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage" * 10)
    text = tmp_path / "clip.mp4"
    text.write_text("not a video\n")
    for args, named in ((["--source", str(tmp_path / "missing.mp4")], "missing.mp4"),
                        (["--model", str(bad)], "bad.onnx")):
        p = subprocess.run([sys.executable, "-m", "splitinfer", "demo", "--headless", "--frames", "5", *args],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        assert named in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_demo_with_a_text_file_as_video_is_exit_2(tmp_path):
    pytest.importorskip("supervision")
    text = tmp_path / "clip.mp4"
    text.write_text("not a video\n")
    p = subprocess.run([sys.executable, "-m", "splitinfer", "demo", "--headless", "--frames", "5",
                        "--source", str(text), "--bandwidth", "20mbit"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**__import__("os").environ, "SPLITINFER_CACHE": str(tmp_path / "cache")})
    assert p.returncode == 2, p.stderr[-2000:]
    assert "clip.mp4" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_stream_source_errors_are_not_swallowed_by_asyncio(yolo_plan):
    """An async source that raises also ends the stream (and the loop is not left with a task)."""
    plan = Plan.load(yolo_plan)

    async def camera():
        yield random_feeds(plan.inputs)
        raise RuntimeError("decoder crashed")

    async def main():
        async with EdgeAgent(plan, None) as agent:
            with pytest.raises(SourceError, match="decoder crashed"):
                async for _ in agent.stream(camera()):
                    pass
        await asyncio.sleep(0)

    arun(main(), timeout=60)


def test_a_pinned_candidate_respects_the_breaker(yolo_plan):
    """A frozen cloud (welcome, then silence): pinned frames wait for their hedge until the breaker
    opens (a few failures), then run locally at once instead of each waiting (up to 3 s before)."""
    plan = Plan.load(yolo_plan)

    async def main():
        async def frozen(ch):
            await ch.recv()
            await ch.send(wire.Welcome("s"))
            while True:
                await ch.recv(tensors=False)

        server = await TcpServer.start(frozen, "127.0.0.1", 0)
        try:
            async with EdgeAgent(plan, f"tcp://127.0.0.1:{server.port}", candidate="cloud") as agent:
                return [await agent.infer(random_feeds(plan.inputs, seed=k)) for k in range(6)]
        finally:
            await server.aclose()

    rs = arun(main())
    assert all(r.fallback for r in rs)
    late = [r for r in rs if r.fallback_reason.startswith("cloud later than")]
    opened = [r for r in rs if r.fallback_reason == "circuit open"]
    assert late and rs[0] in late
    assert len(opened) >= 2 and rs[-1] in opened, [r.fallback_reason for r in rs]
    assert max(r.timings["total_ms"] for r in opened) < min(r.timings["total_ms"] for r in late)
