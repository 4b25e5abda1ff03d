"""What the bandwidth probes cost the camera's uplink: every byte that crosses an emulated link
from an edge agent, pinned to the device or adapting, at a few fixed rates, against the bytes
its frames sent. A camera that runs on the device pays for each probe (its data plan, and on a
slow link the link itself) for nothing unless a faster link would change its choice.

The agent runs ``splitinfer edge run`` (YOLO-n 640, one thread, 2 fps, detections back) against
``cloud serve`` through :class:`~splitinfer.transport.netem.LinkEmulator`; the emulator counts the
uplink's bytes (frames, probes, the hello). Reported per (rate, strategy): the uplink's kbit/s and
share of the link, the probes' and the frames' bytes per frame, the cuts used, P50 latency.

    python benchmarks/probe_cost.py [--seconds 30] [--rates 0.5,1,5,20] [--strategies edge,adaptive]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cloud_serve, save, table  # noqa: E402

FPS = 2.0
DELAY_MS = 15.0


async def one(plan_dir: Path, cloud_port: int, rate: float, strategy: str, seconds: float, out: Path) -> dict:
    from splitinfer.transport.netem import LinkEmulator

    frames = int(seconds * FPS)
    async with LinkEmulator(("127.0.0.1", cloud_port), rate_mbps=rate, delay_ms=DELAY_MS) as emu:
        cmd = [sys.executable, "-m", "splitinfer", "edge", "run", str(plan_dir), "--source", "scene", "--frames",
               str(frames), "--fps", str(FPS), "--threads", "1", "--codec", "int8+lz4", "--postprocess", "yolo",
               "--out", str(out), "--json", "--cloud", f"tcp://127.0.0.1:{emu.port}"]
        if strategy != "adaptive":
            cmd += ["--candidate", strategy]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        stdout, err = await asyncio.wait_for(proc.communicate(), seconds + 180)
        if proc.returncode:
            raise RuntimeError(f"edge run ({strategy}, {rate} Mbit/s) failed: {err.decode()[-800:]}")
        up = emu.up.bytes if emu.up is not None else 0
    summary = json.loads(stdout)
    recs = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    # the run's own time on the link: its frames at the camera's pace (start-up is before the first)
    run_s = frames / FPS
    return {"rate_mbps": rate, "strategy": strategy, "frames": len(recs),
            "uplink_kbps": up * 8 / run_s / 1e3, "link_share": up * 8 / run_s / (rate * 1e6),
            "probe_bytes_per_frame": summary["probe_bytes"] / max(len(recs), 1),
            "frame_bytes_per_frame": summary["bytes_per_frame"],
            "uplink_bytes_per_frame": up / max(len(recs), 1),
            "cuts": dict(Counter(r["candidate"] for r in recs)),
            "p50_ms": summary["latency_ms"]["p50"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rates", default="0.5,1,5,20", help="Mbit/s, comma-separated")
    ap.add_argument("--strategies", default="edge,adaptive")
    args = ap.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        plan_dir = Path(tmp) / "plan"
        subprocess.run([sys.executable, "-m", "splitinfer", "split", "ref:yolo-n", "-o", str(plan_dir),
                        "--input-shape", "input=1,3,640,640", "--json"], check=True, capture_output=True)
        cloud, port = cloud_serve(plan_dir)
        try:
            for rate in (float(x) for x in args.rates.split(",")):
                for s in args.strategies.split(","):
                    rows.append(asyncio.run(one(plan_dir, port, rate, s, args.seconds, Path(tmp) / f"{s}.jsonl")))
        finally:
            cloud.terminate()
            cloud.wait(30)
    table("the uplink's bytes: frames and bandwidth probes (2 fps)",
          ["Mbit/s", "strategy", "uplink kbit/s", "share of link", "probe B/frame", "frame B/frame", "cuts",
           "P50 ms"],
          [[r["rate_mbps"], r["strategy"], f"{r['uplink_kbps']:.0f}", f"{r['link_share']:.1%}",
            f"{r['probe_bytes_per_frame']:.0f}", f"{r['frame_bytes_per_frame']:.0f}",
            " ".join(f"{c}:{k}" for c, k in r["cuts"].items()), f"{r['p50_ms']:.0f}"] for r in rows])
    save("probe_cost", {"args": vars(args), "fps": FPS, "delay_ms": DELAY_MS, "rows": rows})


if __name__ == "__main__":
    main()
