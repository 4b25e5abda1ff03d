"""How much any controller could gain on these traces: the hindsight oracle's own gain over the
best static strategy, computed from the traces alone (no processes, seconds to run).

For each uplink trace and frame (at ``--fps`` for ``--seconds``), the all-cloud latency is the
time to serialise one ``--frame-kb`` JPEG through the trace's rate from the frame's start, plus
``--fixed-ms`` (encode, RTT, cloud compute, reply: measured in edge_traces.py), hedged as the
agent does (1.3x the prediction + 30 ms, then the device's own time); the all-edge latency is
the device's time. The oracle takes the better per frame. Reported per device time: the
geometric mean over traces of best static / oracle (the ceiling for best static / adaptive, since
an adaptive controller can at most match the oracle), and each trace's value.

    python benchmarks/oracle_ceiling.py [--seconds 20] [--fps 2] [--frame-kb 43] [--fixed-ms 60]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import pyplot, save, table  # noqa: E402
from edge_traces import TRACES, uplink_traces  # noqa: E402


def serialise_ms(schedule, start_s: float, nbytes: float, give_up_s: float = 30.0) -> float:
    """Time (ms) to push ``nbytes`` through the step-function ``schedule`` from ``start_s``."""
    t, left = start_s, nbytes * 8 / 1e6  # megabits
    while left > 1e-12 and t - start_s < give_up_s:
        rate = schedule.rate_at(t)
        step = min(schedule.next_change(t), start_s + give_up_s) - t
        if rate > 0 and rate * step >= left:
            return (t + left / rate - start_s) * 1e3
        left -= rate * step
        t += step
    return give_up_s * 1e3


def main() -> None:
    from splitinfer.transport.netem import RateSchedule, load_trace

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--fps", type=float, default=2.0)
    ap.add_argument("--frame-kb", type=float, default=43.0, help="all-cloud JPEG frame (640x640 road scene: 43 KB)")
    ap.add_argument("--fixed-ms", type=float, default=60.0, help="encode + RTT + cloud compute + reply")
    ap.add_argument("--edge-ms", default="100,150,200,270,400,540", help="device times to try")
    args = ap.parse_args()
    if not TRACES.is_dir():
        sys.exit(f"{TRACES} not found")
    traces = uplink_traces(100)
    results: dict = {"args": vars(args), "edge_ms": {}}
    rows = []
    for edge_ms in [float(x) for x in args.edge_ms.split(",")]:
        per = {}
        for path in traces:
            sched = RateSchedule(load_trace(path))
            cloud, oracle = [], []
            for k in range(int(args.seconds * args.fps)):
                net = serialise_ms(sched, k / args.fps, args.frame_kb * 1e3) + args.fixed_ms
                # the agent's prediction: the rate over the last 2 s (what its monitor would have seen)
                t = k / args.fps
                seen = statistics.mean(sched.rate_at(max(t - 0.1 * j, 0.0)) for j in range(20))
                expected = args.fixed_ms + args.frame_kb * 8 / max(seen, 1e-3)
                hedged = min(net, min(1.3 * expected + 30, 3000) + edge_ms)
                cloud.append(hedged)
                oracle.append(min(hedged, edge_ms))
            best = min(statistics.mean(cloud), edge_ms)
            per[path.stem] = best / statistics.mean(oracle)
        geo = math.exp(statistics.mean(math.log(v) for v in per.values()))
        results["edge_ms"][str(edge_ms)] = {"geomean_oracle_gain": geo, "max": max(per.values()), "traces": per}
        rows.append([f"{edge_ms:g}", f"{geo:.3f}", f"{max(per.values()):.2f}",
                     " ".join(f"{v:.2f}" for v in per.values())])
    table(f"oracle / best static on {len(traces)} uplink traces, {args.seconds:g} s at {args.fps:g} fps, "
          f"{args.frame_kb:g} KB frames", ["edge ms", "geomean gain", "best trace", "per trace"], rows)
    print(f"wrote {save('oracle_ceiling', results)}")
    plt = pyplot()
    if plt is not None:
        from _common import RESULTS

        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        xs = [float(x) for x in results["edge_ms"]]
        ax.plot(xs, [v["geomean_oracle_gain"] for v in results["edge_ms"].values()], "o-", label="geomean")
        ax.plot(xs, [v["max"] for v in results["edge_ms"].values()], "s--", label="best trace")
        ax.axhline(1.15, color="grey", lw=0.8, ls=":", label="issue 5 goal for adaptive")
        ax.set_xlabel("device time for the whole model (ms)")
        ax.set_ylabel("oracle gain over best static")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "oracle_ceiling.png")
        plt.close(fig)


if __name__ == "__main__":
    main()
