"""Issue 10's figure: the cloud service (and the edge) under hostile peers, each attack with a
well-behaved client measured while it runs.

The service is the real command (`splitinfer cloud serve`, its own process, a token set) on
the demo's detector split into a plan; attackers are coroutines in this process on loopback.
Per attack class: peak RSS of the service over its idle RSS, the good client's P50 and max
latency (one all-cloud frame at a time), whether the service still answers afterwards. The edge
row runs `splitinfer edge run` against a fake cloud that answers every frame with a
decompression bomb: the edge's peak RSS and per-frame latency.

Goals: peak RSS <= idle + 256 MiB, the good client's max latency <= 1 s + its compute, 0 crashes.

    python benchmarks/hostile_clients.py [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save, table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssPeak:
    """Samples a process's RSS every 10 ms in a thread; ``peak`` since the last ``reset``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_mib(self.pid))

    def reset(self) -> float:
        self.peak = rss_mib(self.pid)
        return self.peak

    def stop(self) -> None:
        self._stop.set()


def make_plan(tmp: Path) -> Path:
    from splitinfer.splitter import split_model

    out = tmp / "plan"
    split_model(str(ROOT / "demos/traffic_camera/weights/detector.onnx"), out, profile=False, report=False)
    return out


# ------------------------------------------------------------------ attacks

def zstd_zeros(n: int) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(bytes(n))


def bomb_frame(plan: Any, cid: str, n: int = 4, mib: int = 256) -> bytes:
    from splitinfer.transport import wire
    from splitinfer.codecs import Encoded

    side = int(np.sqrt(mib << 20))
    payload = zstd_zeros(side * side)
    q = {"axis": 1, "scale": np.ones(1, np.float32).tobytes(), "min": np.zeros(1, np.float32).tobytes()}
    tensors = {f"t{k}": Encoded("float32", (1, 1, side, side), "int8+zstd", payload, q) for k in range(n)}
    return wire.encode_bytes(wire.InferRequest(7, plan.hash, cid, tensors, codec="int8+zstd"))


def jpeg_frame(plan: Any) -> bytes:
    from PIL import Image

    from splitinfer.transport import wire
    from splitinfer.codecs import Encoded

    buf = io.BytesIO()
    Image.new("RGB", (8000, 8000), (90, 120, 150)).save(buf, format="JPEG", quality=50)
    enc = Encoded("float32", (1, 3, 8000, 8000), "jpeg", buf.getvalue())
    return wire.encode_bytes(wire.InferRequest(8, plan.hash, "cloud", {plan.inputs[0].name: enc}, codec="jpeg"))


def rows_frame(plan: Any) -> bytes:
    from splitinfer.transport import wire

    cand = next(c for c in plan.candidates if c.cloud is not None and c.cloud.batch_dynamic and c.edge is not None)
    tensors = {t.name: np.zeros((300, *t.shape[1:]), t.dtype) for t in cand.cut}
    return wire.encode_bytes(wire.InferRequest(9, plan.hash, cand.id, tensors, codec="int8+lz4"))


def hello_frame(plan: Any) -> bytes:
    from splitinfer.transport import wire

    return wire.encode_bytes(wire.Hello(plan.hash, "attacker", token=TOKEN))


async def raw_conn(port: int, payload: bytes, *, hello: bytes | None = None, hold_s: float = 0.0) -> None:
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, asyncio.TimeoutError):
        return
    try:
        if hello is not None:
            w.write(struct.pack(">I", len(hello)) + hello)
            await w.drain()
            await asyncio.wait_for(r.read(4096), 5)
        w.write(payload)
        await w.drain()
        await asyncio.wait_for(r.read(1 << 16), hold_s or 5)
        if hold_s:
            await asyncio.sleep(hold_s)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


async def offers(http_port: int, n: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async def one() -> None:
            try:
                async with s.post(f"http://127.0.0.1:{http_port}/v1/webrtc/offer",
                                  json={"sdp": "v=0\r\n", "type": "offer"}) as r:
                    await r.read()
            except aiohttp.ClientError:
                pass
        await asyncio.gather(*(one() for _ in range(n)))


def attacks(plan: Any, port: int, http_port: int) -> dict[str, Any]:
    framed = lambda b: struct.pack(">I", len(b)) + b  # noqa: E731
    bomb = framed(bomb_frame(plan, "cloud"))
    hello = hello_frame(plan)
    jpeg = framed(jpeg_frame(plan))
    rows = framed(rows_frame(plan))
    rng = np.random.default_rng(0)
    return {
        "bomb before hello (4 x 256 MiB in 33 KB) x 50": lambda: [raw_conn(port, bomb) for _ in range(50)],
        "bomb after hello x 50": lambda: [raw_conn(port, bomb, hello=hello) for _ in range(50)],
        "8000x8000 JPEG in 1 frame x 10": lambda: [raw_conn(port, jpeg, hello=hello) for _ in range(10)],
        "64 MiB length prefix + 8 B, no hello x 200":
            lambda: [raw_conn(port, struct.pack(">I", 64 << 20) + bytes(8), hold_s=3) for _ in range(200)],
        "hello, then stall mid-frame x 200":
            lambda: [raw_conn(port, struct.pack(">I", 64 << 20) + bytes(8), hello=hello, hold_s=3) for _ in range(200)],
        "300 rows in one request x 20": lambda: [raw_conn(port, rows, hello=hello) for _ in range(20)],
        "random bytes x 300": lambda: [raw_conn(port, rng.bytes(int(rng.integers(1, 4096)))) for _ in range(300)],
        "WebRTC offers without a token x 400": lambda: [offers(http_port, 400)],
        "connection flood x 1500 (no hello)": lambda: [raw_conn(port, b"", hold_s=3) for _ in range(1500)],
    }


async def good_client(port: int, plan: Any, stop: asyncio.Event, lat: list[float]) -> None:
    from splitinfer.transport import TcpChannel, wire

    ch = await TcpChannel.connect("127.0.0.1", port)
    await ch.send(wire.Hello(plan.hash, "good", token=TOKEN))
    assert isinstance(await asyncio.wait_for(ch.recv(), 10), wire.Welcome)
    x = np.random.default_rng(1).random(plan.inputs[0].shape, dtype=np.float32)
    rid = 0
    while not stop.is_set():
        rid += 1
        t0 = time.perf_counter()
        await ch.send(wire.InferRequest(rid, plan.hash, "cloud", {plan.inputs[0].name: x}, codec="jpeg"))
        reply = await asyncio.wait_for(ch.recv(), 30)
        if isinstance(reply, wire.Result):
            lat.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(0.05)
    await ch.aclose()


async def run_attack(name: str, make: Any, port: int, plan: Any, rss: RssPeak, seconds: float) -> dict[str, Any]:
    lat: list[float] = []
    stop = asyncio.Event()
    idle = rss.reset()
    good = asyncio.ensure_future(good_client(port, plan, stop, lat))
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        await asyncio.gather(*make(), return_exceptions=True)
    stop.set()
    up = True
    try:
        await asyncio.wait_for(good, 30)
    except Exception as exc:  # the good client lost its service: that is the failure this measures
        print(f"{name}: good client failed: {type(exc).__name__}: {exc}")
        up = False
    arr = np.array(lat) if lat else np.array([float("nan")])
    return {"attack": name, "idle_rss_mib": round(idle, 1), "peak_rss_mib": round(rss.peak, 1),
            "rss_over_idle_mib": round(rss.peak - idle, 1), "good_p50_ms": round(float(np.median(arr)), 1),
            "good_max_ms": round(float(arr.max()), 1), "good_frames": len(lat), "up": up}


async def compute_ms(port: int, plan: Any) -> float:
    lat: list[float] = []
    stop = asyncio.Event()
    task = asyncio.ensure_future(good_client(port, plan, stop, lat))
    await asyncio.sleep(3)
    stop.set()
    await task
    return float(np.median(lat[3:] or lat))


def start_service(plan_dir: Path, tmp: Path) -> tuple[subprocess.Popen[str], int, int]:
    (tmp / "tokens").write_text(TOKEN + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "splitinfer", "cloud", "serve", str(plan_dir), "--listen",
                             "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-advertise", "--token-file",
                             str(tmp / "tokens")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = http = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.match(r"edge: tcp://127\.0\.0\.1:(\d+)", line):
            port = int(m.group(1))
        if m := re.match(r"http: http://127\.0\.0\.1:(\d+)", line):
            http = int(m.group(1))
        if line.startswith("serving"):
            break
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, port, http


def edge_under_bombs(plan_dir: Path, tmp: Path, frames: int) -> dict[str, Any]:
    """`splitinfer edge run` pinned to the all-cloud candidate, against a cloud whose every reply
    is a 24 KB tensor that would decompress to 1 GiB."""
    from splitinfer.splitter import Plan
    from splitinfer.transport import TcpServer, wire
    from splitinfer.codecs import Encoded

    plan = Plan.load(plan_dir)
    side = 1 << 15
    bomb = Encoded("float32", (side * side,), "int8+zstd", zstd_zeros(side * side),
                   {"axis": -1, "scale": np.ones(1, np.float32).tobytes(), "min": np.zeros(1, np.float32).tobytes()})
    result: dict[str, Any] = {}

    async def main() -> None:
        async def handler(ch: Any) -> None:
            await ch.recv()
            await ch.send(wire.Welcome("s"))
            while True:
                msg = await ch.recv(tensors=False)
                if isinstance(msg, wire.InferRequest):
                    await ch.send(wire.Result(msg.request_id, {plan.outputs[0].name: bomb}, codec="int8+zstd"))
                elif isinstance(msg, wire.Ping):
                    await ch.send(wire.Pong(msg.seq, msg.sent_at))

        server = await TcpServer.start(handler, "127.0.0.1", 0)
        out = tmp / "edge.jsonl"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "splitinfer", "edge", "run", str(plan_dir), "--cloud", f"tcp://127.0.0.1:{server.port}",
            "--candidate", "cloud", "--input-codec", "jpeg", "--source", "scene", "--frames", str(frames),
            "--fps", "5", "--out", str(out), "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        rss = RssPeak(proc.pid)
        stdout, stderr = await proc.communicate()
        rss.stop()
        await server.aclose()
        recs = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
        lat = np.array([r["timings"]["total_ms"] for r in recs]) if recs else np.array([float("nan")])
        if proc.returncode:
            print(stderr.decode()[-2000:])
        result.update(attack=f"edge: every reply a 24 KB -> 1 GiB bomb x {frames} frames", exit=proc.returncode,
                      peak_rss_mib=round(rss.peak, 1), frames=len(recs),
                      fallbacks=sum(r["fallback"] for r in recs),
                      bad_reply=sum("bad reply" in (r["fallback_reason"] or "") for r in recs),
                      p50_ms=round(float(np.median(lat)), 1), max_ms=round(float(lat.max()), 1))

    asyncio.run(main())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0, help="each attack runs this long")
    ap.add_argument("--only", help="run attacks whose name contains this")
    args = ap.parse_args()
    from splitinfer.splitter import Plan

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plan_dir = make_plan(tmp)
        plan = Plan.load(plan_dir)
        proc, port, http = start_service(plan_dir, tmp)
        rss = RssPeak(proc.pid)
        rows: list[dict[str, Any]] = []
        try:
            compute = asyncio.run(compute_ms(port, plan))
            print(f"service pid {proc.pid}, idle RSS {rss_mib(proc.pid):.0f} MiB; good client alone: {compute:.1f} ms")
            for name, make in attacks(plan, port, http).items():
                if args.only and args.only not in name:
                    continue
                row = asyncio.run(run_attack(name, make, port, plan, rss, args.seconds))
                row["service_alive"] = proc.poll() is None
                rows.append(row)
                print(json.dumps(row))
        finally:
            rss.stop()
            proc.terminate()
            code = proc.wait(30)
        edge = edge_under_bombs(plan_dir, tmp, frames=20)
        print(json.dumps(edge))
    ok_rss = all(r["rss_over_idle_mib"] <= 256 for r in rows)
    ok_lat = all(r["good_max_ms"] <= 1000 + compute for r in rows)
    ok_up = all(r["up"] and r["service_alive"] for r in rows) and code == 0 and edge["exit"] == 0
    table("hostile clients vs `splitinfer cloud serve` (demo detector, 320x320; good client: all-cloud JPEG frames)",
          ["attack", "RSS idle MiB", "peak MiB", "over idle", "good P50 ms", "good max ms", "good frames", "up"],
          [[r["attack"], r["idle_rss_mib"], r["peak_rss_mib"], r["rss_over_idle_mib"], r["good_p50_ms"],
            r["good_max_ms"], r["good_frames"], "yes" if r["up"] and r["service_alive"] else "NO"] for r in rows])
    table("the edge against a hostile cloud", ["attack", "peak RSS MiB", "frames", "fallbacks (bad reply)",
                                               "P50 ms", "max ms", "exit"],
          [[edge["attack"], edge["peak_rss_mib"], edge["frames"], f"{edge['fallbacks']} ({edge['bad_reply']})",
            edge["p50_ms"], edge["max_ms"], edge["exit"]]])
    print(f"goals: peak RSS <= idle + 256 MiB: {'met' if ok_rss else 'NOT met'}; good client max <= 1 s + "
          f"{compute:.0f} ms compute: {'met' if ok_lat else 'NOT met'}; 0 crashes, service exit 0 on SIGTERM "
          f"({code}): {'met' if ok_up else 'NOT met'}")
    print(f"wrote {save('hostile_clients', {'seconds_per_attack': args.seconds, 'good_client_alone_ms': compute, 'service_exit': code, 'attacks': rows, 'edge': edge, 'goals': {'rss': ok_rss, 'latency': ok_lat, 'up': ok_up}})}")


if __name__ == "__main__":
    main()
