"""The headline benchmark: real uplink traces replayed through the link emulator, the edge agent
in a process slowed by a cgroup CPU quota (a Jetson-class stand-in), the cloud service at full
speed, both post-processing detections (boxes come back, not raw maps). On the same frames (a
moving road scene) and the same trace, compare: adaptive; all-edge;
all-cloud with JPEG input; every static cut (int8+lz4); and the hindsight oracle (per frame, the
best of the static strategies' recorded latencies for that frame).

Reports mean, P50, P99 latency, uplink bytes per frame and fallbacks per trace (table, JSON, plot)
and the ratios of issue 5: best static mean / adaptive mean, adaptive mean / oracle mean.

    python benchmarks/edge_traces.py [--traces 10] [--seconds 30] [--fps 2] [--quota 0.2] [--size 640]
        [--delay-ms 15] [--only NAME] [--strategies adaptive,cloud,...] [--records DIR]

Each strategy is a separate ``splitinfer edge run`` process against one cloud service; the trace
restarts at its first frame. At 2 fps every strategy that can keep up does (the throttled device
runs YOLO-n 640 in ~270 ms), so latencies compare like for like. benchmarks/oracle_ceiling.py
says how much any controller could gain on the same traces.

Needs root for the cgroup (v1 cpu controller); without it the edge runs at full speed and
``--emulate-slowdown`` stands in (said in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import subprocess
from collections import Counter
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, pyplot, save, table  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
CGROUP = Path("/sys/fs/cgroup/cpu/splitinfer-edge")


def setup_cgroup(quota: float) -> bool:
    try:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.cfs_period_us").write_text("10000")
        (CGROUP / "cpu.cfs_quota_us").write_text(str(int(10000 * quota)))
        return True
    except OSError:
        return False


def uplink_traces(k: int) -> list[Path]:
    ups = sorted(p for p in TRACES.glob("*.csv") if re.search(r"(\.up|_ul_|-up)", p.name))
    # prefer traces whose first minute varies (the interesting ones), then the rest
    def spread(p: Path) -> float:
        from splitinfer.transport.netem import load_trace

        r = [m for t, m in load_trace(p) if t - load_trace(p)[0][0] < 60]
        return statistics.pstdev(r) / (statistics.mean(r) + 1e-9) if r else 0.0

    return sorted(ups, key=spread, reverse=True)[:k]


async def run_strategy(plan_dir: Path, cloud_port: int, trace: Path, args, strategy: str, cgroup: bool,
                       out: Path) -> list[dict]:
    from splitinfer.transport.netem import LinkEmulator

    cmd = [sys.executable, "-m", "splitinfer", "edge", "run", str(plan_dir), "--source", "scene", "--frames",
           str(int(args.seconds * args.fps)), "--fps", str(args.fps), "--threads", "1", "--codec", "int8+lz4",
           "--input-codec", "jpeg", "--postprocess", "yolo", "--out", str(out), "--json"]
    if strategy != "adaptive":
        cmd += ["--candidate", strategy]
    if not cgroup:
        cmd += ["--emulate-slowdown", str(1 / args.quota)]
    async with LinkEmulator(("127.0.0.1", cloud_port), trace=trace, delay_ms=args.delay_ms) as emu:
        cmd[cmd.index("--source"):cmd.index("--source")] = ["--cloud", f"tcp://127.0.0.1:{emu.port}"]

        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            # Python's imports run at full speed (they are not what is measured); the CPU limit
            # starts before the agent loads and times its segments. The trace starts with the
            # first frame, not with the process (start-up differs per strategy).
            head = b""
            while b"edge: ready" not in head:
                line = await asyncio.wait_for(proc.stderr.readline(), 120)  # type: ignore[union-attr]
                if not line:
                    break
                if b"edge: starting" in line and cgroup:
                    (CGROUP / "cgroup.procs").write_text(str(proc.pid))
                head += line
            emu.restart_schedule()
            # a static cut that cannot keep up falls behind; stop it at twice the trace time
            _, err = await asyncio.wait_for(proc.communicate(), 2 * args.seconds + 20)
            err = head + err
            if proc.returncode:
                raise RuntimeError(f"{strategy}: edge run failed: {err.decode()[-500:]}")
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def stats(records: list[dict]) -> dict:
    lat = np.array([r["timings"]["total_ms"] for r in records])
    return {"mean_ms": float(lat.mean()), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "bytes_per_frame": float(np.mean([r["bytes_sent"] for r in records])),
            "fallbacks": int(sum(r["fallback"] for r in records)), "frames": len(records),
            "cuts": dict(Counter(r["candidate"] for r in records))}


def summarise(name: str, records: dict[str, list[dict]], statics: list[str], n: int) -> dict:
    """One trace's table row per strategy, the oracle, and the ratios of issue 5.

    A static cut that cannot keep up is stopped at twice the trace time: its figures cover the
    frames it finished (a lower bound: its later frames would have waited longer), it cannot be
    the best static, and the oracle takes the others for the frames it did not reach."""
    per: dict = {}
    for strategy, recs in records.items():
        per[strategy] = stats(recs) | {"finished": len(recs), "fell_behind": len(recs) < n}
    oracle = [min(records[s][k]["timings"]["total_ms"] for s in statics if len(records[s]) > k)
              for k in range(min(n, max(len(records[s]) for s in statics)))]
    per["oracle"] = {"mean_ms": float(np.mean(oracle)), "p50_ms": float(np.percentile(oracle, 50)),
                     "p99_ms": float(np.percentile(oracle, 99)), "bytes_per_frame": float("nan"),
                     "fallbacks": 0, "frames": len(oracle)}
    complete = [s for s in statics if not per[s]["fell_behind"]] or statics
    best_static = min(complete, key=lambda s: per[s]["mean_ms"])
    per["ratios"] = {"best_static": best_static,
                     "best_static_over_adaptive": per[best_static]["mean_ms"] / per["adaptive"]["mean_ms"],
                     "adaptive_over_oracle": per["adaptive"]["mean_ms"] / per["oracle"]["mean_ms"]}
    rows = [[s, f"{v['mean_ms']:.1f}", f"{v['p50_ms']:.1f}", f"{v['p99_ms']:.1f}",
             "-" if math.isnan(v["bytes_per_frame"]) else f"{v['bytes_per_frame'] / 1024:.1f}",
             v["fallbacks"], f"{v['frames']}{' (fell behind)' if v.get('fell_behind') else ''}",
             " ".join(f"{c}:{k}" for c, k in v.get("cuts", {}).items())]
            for s, v in per.items() if s != "ratios"]
    table(f"{name}: best static {best_static}; static/adaptive {per['ratios']['best_static_over_adaptive']:.2f}, "
          f"adaptive/oracle {per['ratios']['adaptive_over_oracle']:.2f}",
          ["strategy", "mean ms", "P50 ms", "P99 ms", "KiB/frame", "fallbacks", "frames", "cuts"], rows)
    return per


def from_records(directory: Path, n: int) -> dict:
    """Summaries from kept per-frame records (``--records`` of earlier runs), one per trace that
    has the adaptive run and at least one static."""
    out = {}
    for trace in uplink_traces(100):
        records = {p.name.split(".")[-2]: [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
                   for p in sorted(directory.glob(f"{trace.stem}.*.jsonl"))}
        records = {k: v for k, v in records.items() if v}
        statics = [s for s in ("cloud", "c1", "c2", "c3", "c4", "edge") if s in records]
        if "adaptive" in records and statics:
            out[trace.stem] = summarise(trace.stem, records, statics, n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", type=int, default=10, help="how many uplink traces (most variable first)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--fps", type=float, default=2.0)
    ap.add_argument("--quota", type=float, default=0.2, help="share of one CPU the edge gets")
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--delay-ms", type=float, default=15.0, help="one-way delay each way")
    ap.add_argument("--only", default=None, help="run just the traces whose name contains this")
    ap.add_argument("--strategies", default=None, help="comma-separated subset of adaptive,edge,cloud,c1,... (default all)")
    ap.add_argument("--records", type=Path, default=None, help="keep every run's per-frame records (JSONL) here")
    ap.add_argument("--from-records", type=Path, default=None,
                    help="run nothing: summarise the records kept in this directory by earlier runs")
    args = ap.parse_args()
    if not TRACES.is_dir():
        sys.exit(f"{TRACES} not found")
    if args.from_records:
        results = {"args": vars(args), "traces": from_records(args.from_records, int(args.seconds * args.fps))}
        finish(results)
        return
    cgroup = setup_cgroup(args.quota)
    print(f"edge: {'cgroup' if cgroup else 'emulated'} CPU limit {args.quota:g} of one core, 1 thread; "
          f"cloud: full speed; {args.seconds:g} s of each trace at {args.fps:g} fps")
    results: dict = {"args": vars(args), "cgroup": cgroup, "traces": {}}
    with tempfile.TemporaryDirectory() as tmp:
        plan_dir = Path(tmp) / "plan"
        subprocess.run([sys.executable, "-m", "splitinfer", "split", "ref:yolo-n", "-o", str(plan_dir),
                        "--input-shape", f"input=1,3,{args.size},{args.size}", "--json"], check=True,
                       capture_output=True)
        from splitinfer.splitter import Plan

        plan = Plan.load(plan_dir)
        cloud = subprocess.Popen([sys.executable, "-m", "splitinfer", "cloud", "serve", str(plan_dir), "--listen",
                                  "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-advertise", "--postprocess", "yolo"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            text = ""
            while "serving" not in text:
                text += cloud.stdout.readline()  # type: ignore[union-attr]
            port = int(re.search(r"edge: tcp://127.0.0.1:(\d+)", text).group(1))  # type: ignore[union-attr]
            statics = [c.id for c in plan.candidates]
            wanted = ["adaptive", *statics]
            if args.strategies:
                wanted = [s for s in wanted if s in args.strategies.split(",")]
                statics = [s for s in statics if s in wanted]
            traces = uplink_traces(args.traces if not args.only else 100)
            for trace in [t for t in traces if not args.only or args.only in t.name][: args.traces]:
                records: dict = {}
                for strategy in wanted:
                    keep = args.records or Path(tmp)
                    keep.mkdir(parents=True, exist_ok=True)
                    recs = asyncio.run(run_strategy(plan_dir, port, trace, args, strategy, cgroup,
                                                    keep / f"{trace.stem}.{strategy}.jsonl"))
                    records[strategy] = recs
                if statics:  # (adaptive alone: records only; --from-records joins them to earlier statics)
                    results["traces"][trace.stem] = summarise(trace.stem, records, statics,
                                                              int(args.seconds * args.fps))
        finally:
            cloud.terminate()
            cloud.wait(30)
    finish(results)


def finish(results: dict) -> None:
    """The summary over traces, the JSON and the plot."""
    r = [v["ratios"] for v in results["traces"].values()]
    if r:
        geo = math.exp(statistics.mean(math.log(x["best_static_over_adaptive"]) for x in r))
        ao = sorted(x["adaptive_over_oracle"] for x in r)
        results["summary"] = {"geomean_best_static_over_adaptive": geo,
                              "min_best_static_over_adaptive": min(x["best_static_over_adaptive"] for x in r),
                              "median_adaptive_over_oracle": statistics.median(ao), "worst_adaptive_over_oracle": ao[-1]}
        print("summary (goals: geomean >= 1.15, min >= 0.97, median adaptive/oracle <= 1.05, worst <= 1.15):")
        print(json.dumps(results["summary"], indent=2))
    print(f"wrote {save('edge_traces', results)}")
    _plot(results)


def _plot(results: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    traces = list(results["traces"])
    if not traces:
        return
    strategies = [s for s in results["traces"][traces[0]] if s != "ratios"]
    fig, ax = plt.subplots(figsize=(max(6, 2.5 * len(traces)), 4.5), dpi=100)
    width = 0.8 / len(strategies)
    for j, s in enumerate(strategies):
        ax.bar([i + j * width for i in range(len(traces))], [results["traces"][t][s]["mean_ms"] for t in traces],
               width, label=s)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(traces))], [t[:30] for t in traces], fontsize=8)
    ax.set_ylabel("mean latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("edge latency per strategy on real uplink traces")
    fig.tight_layout()
    fig.savefig(RESULTS / "edge_traces.png")
    plt.close(fig)


if __name__ == "__main__":
    main()
