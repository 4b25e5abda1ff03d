"""Split overhead: edge + cloud segments back to back in one process against the whole model
(onnxruntime, 1 thread, ORT_ENABLE_ALL, YOLO-style n at 640), measured side by side in rounds;
and the wall time of `splitinfer split` on that model, profiling and verification included.

Goals (issue 2): median ratio <= 1.03; split wall time <= 60 s.

    python benchmarks/split_overhead.py [--rounds 30] [--size 640]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save, table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--size", type=int, default=640)
    args = ap.parse_args()

    from splitinfer.splitter import Plan
    from splitinfer.splitter.profiler import make_session, random_feeds

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "splitinfer", "split", "ref:yolo-n", "-o", str(out),
                               "--input-shape", f"input=1,3,{args.size},{args.size}", "--json"],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            sys.exit(proc.stderr)
        plan = Plan.load(out)
        feeds = random_feeds(plan.inputs)
        whole = make_session(str(plan.model_file), threads=1)
        rows, results = [], []
        for cand in plan.candidates:
            edge = make_session(str(plan.file(cand.edge)), threads=1) if cand.edge else None
            cloud = make_session(str(plan.file(cand.cloud)), threads=1) if cand.cloud else None

            def split_run() -> None:
                eout = {}
                if edge is not None:
                    eout = dict(zip(cand.edge.outputs, edge.run(list(cand.edge.outputs), feeds)))
                cut = cand.cut_feed(feeds, eout)
                if cloud is not None:
                    cloud.run(None, cut)

            def whole_run() -> None:
                whole.run(None, feeds)

            for _ in range(3):
                whole_run()
                split_run()
            tw, ts, ratios = [], [], []
            for r in range(args.rounds):
                order = (whole_run, split_run) if r % 2 == 0 else (split_run, whole_run)
                times = {}
                for fn in order:
                    t = time.perf_counter()
                    fn()
                    times[fn] = (time.perf_counter() - t) * 1e3
                tw.append(times[whole_run])
                ts.append(times[split_run])
                ratios.append(times[split_run] / times[whole_run])
            res = {"candidate": cand.id, "cut": [t.name for t in cand.cut], "whole_ms": statistics.median(tw),
                   "split_ms": statistics.median(ts), "ratio_of_medians": statistics.median(ts) / statistics.median(tw),
                   "median_paired_ratio": statistics.median(ratios)}
            results.append(res)
            rows.append([cand.id, ", ".join(res["cut"])[:40], res["whole_ms"], res["split_ms"],
                         res["ratio_of_medians"], res["median_paired_ratio"]])
    table(f"split overhead, YOLO-style n at {args.size}, onnxruntime 1 thread, {args.rounds} paired rounds",
          ["candidate", "cut", "whole ms", "edge+cloud ms", "ratio of medians", "median paired ratio"], rows)
    worst = max(r["median_paired_ratio"] for r in results)
    print(f"worst median paired ratio: {worst:.3f} (goal <= 1.03)")
    print(f"`splitinfer split ref:yolo-n` at {args.size}: {wall:.1f} s wall (goal <= 60 s)")
    path = save("split_overhead", {"size": args.size, "rounds": args.rounds, "split_wall_s": wall,
                                    "worst_median_paired_ratio": worst, "candidates": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
