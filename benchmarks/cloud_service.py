"""The cloud service under load, over real TCP on loopback, service in its own process.

For the YOLO-style n model at 640 (the deepest split candidate's cloud segment, fp32 cut):
throughput and client-side P50/P99 latency with 1, 4, 16 and 64 concurrent closed-loop clients,
batching on (max batch 8, 2 ms) and off (max batch 1), side by side; the service's own overhead
per request (frame received -> result sent, minus the segment's compute, from its Prometheus
histograms) at 1 client; and its memory with many clients connected.

    python benchmarks/cloud_service.py [--seconds 8] [--size 640] [--idle 256]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, pyplot, save, table  # noqa: E402


LOCAL_FALLBACK_S = 0.1  # how long a client is away after "busy" (an edge finishing the frame locally)


def start_service(plan: Path, batch: int) -> tuple[subprocess.Popen, int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "splitinfer", "cloud", "serve", str(plan), "--listen",
                             "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-advertise", "--max-batch-size", str(batch)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    text = ""
    while "serving" not in text:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the service did not start")
        text += line
    port = int(re.search(r"edge: tcp://127.0.0.1:(\d+)", text).group(1))  # type: ignore[union-attr]
    http = re.search(r"http: (http://\S+)", text).group(1)  # type: ignore[union-attr]
    return proc, port, http


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def scrape(http: str) -> dict[str, float]:
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as s:
        async with s.get(f"{http}/metrics") as r:
            text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name.endswith(("_sum", "_count")) and not smp.labels.get("le"):
                out[smp.name] = out.get(smp.name, 0.0) + smp.value
    return out


async def load(port: int, plan, cid: str, cut: dict, clients: int, seconds: float) -> dict:
    from splitinfer.transport import TcpChannel, wire

    lat: list[float] = []
    batches: list[int] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def client(k: int) -> None:
        nonlocal errors
        ch = await TcpChannel.connect("127.0.0.1", port)
        await ch.send(wire.Hello(plan.hash, f"bench-{k}"))
        await ch.recv()
        i = 0
        while time.monotonic() < stop:
            t = time.perf_counter()
            await ch.send(wire.InferRequest(i, plan.hash, cid, cut))
            r = await ch.recv()
            if isinstance(r, wire.Result):
                lat.append((time.perf_counter() - t) * 1e3)
                batches.append(r.timings.batch_size)
            else:  # busy: an edge would finish this frame itself; that takes it a while
                errors += 1
                await asyncio.sleep(LOCAL_FALLBACK_S)
            i += 1
        await ch.aclose()

    t0 = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(clients)))
    dt = time.monotonic() - t0
    return {"clients": clients, "throughput": len(lat) / dt, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "mean_batch": float(np.mean(batches)), "errors": errors,
            "requests": len(lat)}


async def idle_clients(port: int, plan, n: int) -> list:
    from splitinfer.transport import TcpChannel, wire

    chans = []
    for k in range(n):
        ch = await TcpChannel.connect("127.0.0.1", port)
        await ch.send(wire.Hello(plan.hash, f"idle-{k}"))
        await ch.recv()
        chans.append(ch)
    return chans


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--idle", type=int, default=256)
    args = ap.parse_args()
    from splitinfer.models import build
    from splitinfer.splitter import Plan, split_model
    from splitinfer.splitter.profiler import make_session, random_feeds

    counts = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model, x = build("yolo-n", (1, 3, args.size, args.size))
        split_model(model, Path(tmp) / "plan", example_input=x, verify=False, report=False, budget_s=0.2)
        plan = Plan.load(Path(tmp) / "plan")
        cand = [c for c in plan.candidates if c.kind == "split"][-1]
        feeds = random_feeds(plan.inputs)
        e = make_session(str(plan.file(cand.edge)))
        cut = cand.cut_feed(feeds, dict(zip(cand.edge.outputs, e.run(list(cand.edge.outputs), feeds))))
        results: dict = {"candidate": cand.id, "cut_bytes": cand.cut_bytes, "runs": []}
        rows = []
        for clients in counts:  # batching on and off side by side for each client count
            pair = {}
            for label, batch in (("on", 8), ("off", 1)):
                proc, port, http = start_service(Path(tmp) / "plan", batch)
                try:
                    r = asyncio.run(load(port, plan, cand.id, cut, clients, args.seconds))
                    r["batching"] = label
                    r["service_rss_mb"] = rss_mb(proc.pid)
                    if clients == 1:  # server-side overhead, from its own histograms
                        m = asyncio.run(scrape(http))
                        n = m.get("splitinfer_request_seconds_count", 0) or 1
                        r["service_overhead_ms"] = 1e3 * (m["splitinfer_request_seconds_sum"]
                                                          - m["splitinfer_compute_seconds_sum"]) / n
                        r["compute_ms"] = 1e3 * m["splitinfer_compute_seconds_sum"] / n
                finally:
                    proc.terminate()
                    proc.wait(30)
                pair[label] = r
                results["runs"].append(r)
            ratio = pair["on"]["throughput"] / pair["off"]["throughput"]
            for label in ("on", "off"):
                r = pair[label]
                rows.append([clients, label, f"{r['throughput']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                             f"{r['mean_batch']:.2f}", r["errors"], f"{ratio:.2f}" if label == "on" else ""])
        table(f"cloud service, YOLO-n {args.size} candidate {cand.id} ({cand.cut_bytes / 1024:.0f} KiB fp32 cut), "
              f"{args.seconds:g} s per run", ["clients", "batching", "req/s", "P50 ms", "P99 ms", "mean batch",
                                              "busy", "throughput on/off"], rows)
        for one in [r for r in results["runs"] if r["clients"] == 1]:
            print(f"service overhead per request at 1 client, batching {one['batching']} (received -> sent, minus "
                  f"compute): {one['service_overhead_ms']:.2f} ms (compute {one['compute_ms']:.1f} ms; goal < 1 ms)")
        # memory with many idle clients connected
        proc, port, http = start_service(Path(tmp) / "plan", 8)
        try:
            before = rss_mb(proc.pid)

            async def idle() -> float:
                chans = await idle_clients(port, plan, args.idle)
                await asyncio.sleep(0.5)
                after = rss_mb(proc.pid)
                for ch in chans:
                    await ch.aclose()
                return after
            after = asyncio.run(idle())
        finally:
            proc.terminate()
            proc.wait(30)
        results["memory"] = {"idle_clients": args.idle, "rss_before_mb": before, "rss_after_mb": after,
                             "kb_per_client": (after - before) * 1024 / args.idle}
        print(f"memory: {before:.0f} MB with no clients, {after:.0f} MB with {args.idle} connected "
              f"({results['memory']['kb_per_client']:.0f} KB per client)")
    print(f"wrote {save('cloud_service', results)}")
    _plot(results)


def _plot(results: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for label in ("on", "off"):
        runs = [r for r in results["runs"] if r["batching"] == label]
        c = [r["clients"] for r in runs]
        axes[0].plot(c, [r["throughput"] for r in runs], "o-", label=f"batching {label}")
        axes[1].plot(c, [r["p99_ms"] for r in runs], "o-", label=f"batching {label}")
    for ax, y in zip(axes, ("requests/s", "P99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "cloud_service.png")
    plt.close(fig)


if __name__ == "__main__":
    main()
