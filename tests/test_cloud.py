"""The cloud service over real loopback sockets: hello checks, inference that matches the whole
model, batching under concurrency, deadlines, busy, bad input answered while others are served,
HTTP health and Prometheus metrics, WebRTC, clean start/stop, and the command."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import arun

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

import aiohttp  # noqa: E402

from splitinfer import ChannelClosed  # noqa: E402
from splitinfer.cloud import CloudService  # noqa: E402
from splitinfer.splitter import Plan  # noqa: E402
from splitinfer.splitter.profiler import make_session, random_feeds  # noqa: E402
from splitinfer.transport import TcpChannel, wire  # noqa: E402


def service(plan_dir, **kw):
    kw.setdefault("listen", ("127.0.0.1", 0))
    kw.setdefault("http", ("127.0.0.1", 0))
    kw.setdefault("advertise", False)
    return CloudService([plan_dir], **kw)


async def connect(svc, plan, token=None, protocol=wire.PROTOCOL_VERSION):
    ch = await TcpChannel.connect("127.0.0.1", svc.port)
    await ch.send(wire.Hello(plan.hash, "test-cam", token=token, protocol=protocol))
    reply = await asyncio.wait_for(ch.recv(), 10)
    return ch, reply


def cut_for(plan, cid, seed=0):
    """The cut tensors candidate ``cid`` sends for a seeded input, and the whole model's outputs."""
    cand = plan.candidate(cid)
    feeds = random_feeds(plan.inputs, seed=seed)
    eout = {}
    if cand.edge:
        e = make_session(str(plan.file(cand.edge)))
        eout = dict(zip(cand.edge.outputs, e.run(list(cand.edge.outputs), feeds)))
    whole = make_session(str(plan.model_file))
    want = dict(zip(plan.output_names, whole.run(list(plan.output_names), feeds)))
    return cand.cut_feed(feeds, eout), want


async def infer(ch, plan, cid, tensors, rid=1, **kw):
    await ch.send(wire.InferRequest(rid, plan.hash, cid, tensors, **kw))
    return await asyncio.wait_for(ch.recv(), 30)


def test_hello_is_checked(yolo_plan, tmp_path):
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan, tokens={"s3cret"}) as svc:
            for kwargs, reason in (({"token": "s3cret", "protocol": 99}, "version"), ({"token": "nope"}, "token"),
                                   ({}, "token")):
                ch, reply = await connect(svc, plan, **kwargs)
                assert isinstance(reply, wire.Refusal) and reply.reason == reason, reply
                with pytest.raises(ChannelClosed):
                    await asyncio.wait_for(ch.recv(), 5)
                await ch.aclose()
            ch = await TcpChannel.connect("127.0.0.1", svc.port)
            await ch.send(wire.Hello("f" * 64, "cam", token="s3cret"))
            reply = await ch.recv()
            assert isinstance(reply, wire.Refusal) and reply.reason == "plan" and "not served" in reply.message
            await ch.aclose()
            ch, reply = await connect(svc, plan, token="s3cret")
            assert isinstance(reply, wire.Welcome)
            await ch.aclose()
            text = svc.metrics.exposition().decode()
            assert "splitinfer_requests_total{" not in text  # nothing was computed for the refused
            assert 'splitinfer_errors_total{code="refused_token"} 2.0' in text
    arun(main())


def test_every_cloud_candidate_matches_the_whole_model(yolo_plan):
    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan) as svc:
            ch, _ = await connect(svc, plan)
            for cand in plan.candidates:
                if cand.cloud is None:
                    continue
                cut, want = cut_for(plan, cand.id)
                r = await infer(ch, plan, cand.id, cut)
                assert isinstance(r, wire.Result), r
                for k, v in want.items():
                    np.testing.assert_allclose(r.outputs[k], v, atol=1e-4)
                t = r.timings
                assert t.compute_ms > 0 and t.queue_ms >= 0 and t.recv_ms >= 0 and t.batch_size == 1
                # and with a lossy codec both ways, within the codec's bound
                r = await infer(ch, plan, cand.id, cut, rid=2, codec="fp16", result_codec="fp16")
                for k, v in want.items():
                    assert np.abs(r.outputs[k] - v).max() <= 2 ** -11 * np.abs(v).max() * 8 + 1e-3
            await ch.aclose()
    arun(main())


def test_batches_form_under_concurrency_and_rows_go_back_to_their_senders(yolo_plan):
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id  # all-cloud

    async def client(svc, seed):
        ch, _ = await connect(svc, plan)
        cut, want = cut_for(plan, cid, seed)
        r = await infer(ch, plan, cid, cut, rid=seed)
        await ch.aclose()
        np.testing.assert_allclose(r.outputs[plan.output_names[0]], want[plan.output_names[0]], atol=1e-4)
        return r.timings.batch_size

    async def main():
        async with service(yolo_plan, max_batch_size=8, max_queue_delay_ms=200) as svc:
            sizes = await asyncio.gather(*(client(svc, s) for s in range(6)))
        return sizes
    sizes = arun(main())
    assert max(sizes) > 1, sizes


def test_busy_when_the_queue_is_full_and_deadlines(yolo_plan):
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id
    cut, _ = cut_for(plan, cid)

    async def main():
        async with service(yolo_plan, max_batch_size=1, max_queue=1, max_queue_delay_ms=0) as svc:
            ch, _ = await connect(svc, plan)
            for i in range(12):
                await ch.send(wire.InferRequest(i, plan.hash, cid, cut))
            replies = [await asyncio.wait_for(ch.recv(), 30) for _ in range(12)]
            codes = [r.code if isinstance(r, wire.Error) else "ok" for r in replies]
            assert "busy" in codes and "ok" in codes, codes
            assert sorted(r.request_id for r in replies) == list(range(12))  # every request answered once
            r = await infer(ch, plan, cid, cut, rid=99, deadline_ms=0.0)
            assert isinstance(r, wire.Error) and r.code == "deadline" and r.request_id == 99
            r = await infer(ch, plan, cid, cut, rid=100, deadline_ms=10_000.0)
            assert isinstance(r, wire.Result)
            await ch.aclose()
    arun(main())


def test_bad_input_is_answered_and_others_keep_being_served(yolo_plan):
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id
    cut, _ = cut_for(plan, cid)
    name = next(iter(cut))

    async def main():
        async with service(yolo_plan) as svc:
            ch, _ = await connect(svc, plan)
            other, _ = await connect(svc, plan)
            cases = [
                (wire.InferRequest(1, plan.hash, cid, {name: cut[name][..., :-1]}), "shape", "expected float32"),
                (wire.InferRequest(2, plan.hash, cid, {name: cut[name].astype(np.float64)}), "shape", "got float64"),
                (wire.InferRequest(3, plan.hash, "c99", cut), "unknown_candidate", "no candidate 'c99'"),
                (wire.InferRequest(4, plan.hash, "edge", {}), "bad_request", "runs entirely on the edge"),
                (wire.InferRequest(5, "0" * 64, cid, cut), "unknown_plan", "this connection's hello"),
                (wire.InferRequest(6, plan.hash, cid, {"zzz": cut[name]}), "shape", "missing"),
            ]
            for msg, code, text in cases:
                await ch.send(msg)
                r = await asyncio.wait_for(ch.recv(), 10)
                assert isinstance(r, wire.Error) and r.code == code and text in r.message, (r, code)
                assert r.request_id == msg.request_id
            # a frame that is not msgpack: an error frame, the connection stays
            ch._p.transport.write(struct.pack(">I", 6) + b"\x00\x00\x00\x02\xc1\xc1")
            r = await asyncio.wait_for(ch.recv(), 10)
            assert isinstance(r, wire.Error) and r.code == "protocol"
            assert isinstance(await infer(ch, plan, cid, cut, rid=7), wire.Result)
            # broken framing: that connection is closed, the other one still works
            ch._p.transport.write(struct.pack(">I", 1 << 31))
            with pytest.raises(Exception):
                await asyncio.wait_for(ch.recv(), 10)
            assert isinstance(await infer(other, plan, cid, cut, rid=8), wire.Result)
            await other.aclose()
            text = svc.metrics.exposition().decode()
            assert 'splitinfer_errors_total{code="shape"} 3.0' in text, text
    arun(main())


def test_http_health_metrics_and_plans(yolo_plan):
    from prometheus_client.parser import text_string_to_metric_families

    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id
    cut, _ = cut_for(plan, cid)

    async def main():
        async with service(yolo_plan) as svc:
            ch, _ = await connect(svc, plan)
            await infer(ch, plan, cid, cut)
            base = svc.addresses["http"]
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 200
                async with http.get(f"{base}/readyz") as r:
                    assert r.status == 200 and (await r.json())["ready"]
                async with http.get(f"{base}/v1/plans") as r:
                    plans = (await r.json())["plans"]
                    assert plans[0]["plan_hash"] == plan.hash
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
            await ch.aclose()
            return text
    text = arun(main())
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"splitinfer_requests", "splitinfer_errors", "splitinfer_request_seconds", "splitinfer_batch_size",
            "splitinfer_queue_depth", "splitinfer_sessions_loaded", "splitinfer_connections"} <= set(fams)
    reqs = [s for s in fams["splitinfer_requests"].samples if s.name == "splitinfer_requests_total"]
    assert sum(s.value for s in reqs) == 1
    assert any(s.value >= 1 for s in fams["splitinfer_sessions_loaded"].samples)


def test_webrtc_path_to_the_cloud(yolo_plan, monkeypatch):
    pytest.importorskip("aiortc")
    import aioice.ice

    from splitinfer.transport.webrtc import WebRtcChannel

    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[-2].id
    cut, want = cut_for(plan, cid)

    async def main():
        async with service(yolo_plan) as svc:
            ch = await WebRtcChannel.connect(svc.addresses["webrtc"])
            await ch.send(wire.Hello(plan.hash, "rtc-cam"))
            assert isinstance(await asyncio.wait_for(ch.recv(), 10), wire.Welcome)
            r = await infer(ch, plan, cid, cut)
            await ch.aclose()
            return r
    r = arun(main())
    np.testing.assert_allclose(r.outputs[plan.output_names[0]], want[plan.output_names[0]], atol=1e-4)


def test_sessions_are_bounded_lru(yolo_plan):
    plan = Plan.load(yolo_plan)
    cloud_ids = [c.id for c in plan.candidates if c.cloud]

    async def main():
        async with service(yolo_plan, max_sessions=1) as svc:
            ch, _ = await connect(svc, plan)
            for i, cid in enumerate(cloud_ids * 2):
                cut, want = cut_for(plan, cid)
                r = await infer(ch, plan, cid, cut, rid=i)
                np.testing.assert_allclose(r.outputs[plan.output_names[0]], want[plan.output_names[0]], atol=1e-4)
            await ch.aclose()
            return svc.pool.loaded, svc.pool.evictions
    loaded, evictions = arun(main())
    assert loaded == 1 and evictions >= len(cloud_ids) - 1


def test_postprocess_yolo_returns_detections(yolo_plan):
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id
    cut, _ = cut_for(plan, cid)

    async def main():
        async with service(yolo_plan, postprocess="yolo") as svc:
            ch, _ = await connect(svc, plan)
            r = await infer(ch, plan, cid, cut)
            await ch.aclose()
            return r
    r = arun(main())
    assert set(r.outputs) == {"detections"} and r.outputs["detections"].shape[1] == 6


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_clean_start_and_stop_leave_nothing_behind(yolo_plan):
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id
    cut, _ = cut_for(plan, cid)

    async def cycle():
        svc = service(yolo_plan)
        await svc.start()
        chans = []
        for _ in range(3):
            ch, _ = await connect(svc, plan)
            await infer(ch, plan, cid, cut)
            chans.append(ch)
        await svc.stop()
        for ch in chans:  # the service said bye and closed them
            with pytest.raises(Exception):
                while True:
                    m = await asyncio.wait_for(ch.recv(), 5)
                    assert isinstance(m, wire.Bye)
            await ch.aclose()
        await svc.stop()  # safe twice
        assert svc.state == "stopped"

    arun(cycle())  # warm-up: imports and lazily created library threads
    threads, fds = threading.active_count(), _fds()
    arun(cycle())
    assert threading.active_count() == threads
    assert _fds() <= fds


def test_advertises_with_zeroconf(yolo_plan):
    from splitinfer.transport.discovery import discover

    plan = Plan.load(yolo_plan)

    async def main():
        async with service(yolo_plan, advertise=True, name="si-cloud-test") as svc:
            found = await discover(plan_hash=plan.hash, interfaces=["127.0.0.1"], timeout=8, first=True)
            return svc.port, found
    port, found = arun(main())
    assert any(s.port == port and s.name.startswith("si-cloud-test") for s in found), found


def test_cloud_serve_command(yolo_plan, tmp_path):
    plan = Plan.load(yolo_plan)
    tokens = tmp_path / "tokens"
    tokens.write_text("# edge tokens\nabc123\n")
    proc = subprocess.Popen([sys.executable, "-m", "splitinfer", "cloud", "serve", str(yolo_plan), "--listen",
                             "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-advertise", "--token-file", str(tokens)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any(ln.startswith("serving") for ln in lines):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            lines.append(line)
        port = int(re.search(r"edge: tcp://127.0.0.1:(\d+)", "".join(lines)).group(1))
        cid = plan.candidates[0].id
        cut, _ = cut_for(plan, cid)

        async def main():
            ch = await TcpChannel.connect("127.0.0.1", port)
            await ch.send(wire.Hello(plan.hash, "cam", token="abc123"))
            assert isinstance(await ch.recv(), wire.Welcome)
            r = await infer(ch, plan, cid, cut)
            await ch.aclose()
            return r
        assert isinstance(arun(main()), wire.Result)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "shutting down" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cloud_serve_with_a_bad_plan_exits_2(tmp_path):
    # (the warning for serving a non-loopback address without tokens: test_hostile_cloud.py)
    p = subprocess.run([sys.executable, "-m", "splitinfer", "cloud", "serve", str(tmp_path), "--no-advertise"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no manifest.json" in p.stderr


def test_a_lone_client_is_not_held_back_by_the_batching_delay(yolo_plan):
    plan = Plan.load(yolo_plan)
    cid = plan.candidates[0].id
    cut, _ = cut_for(plan, cid)

    async def main():
        async with service(yolo_plan, max_batch_size=8, max_queue_delay_ms=500) as svc:
            ch, _ = await connect(svc, plan)
            queues = []
            for i in range(5):
                r = await infer(ch, plan, cid, cut, rid=i)
                queues.append(r.timings.queue_ms)
            await ch.aclose()
            return queues
    queues = arun(main())
    assert max(queues) < 250, queues  # far below the 500 ms delay a fixed wait would add
