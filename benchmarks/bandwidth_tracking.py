"""How well the bandwidth monitor tracks the link.

1. Step test, for real: saturating traffic over TCP through the link emulator, rate stepped
   50 -> 5 -> 50 Mbit/s; seconds until the estimate is within ±20% of the new rate (goal: 2 s).
2. Every trace in ../shared/traces, trace-driven: a saturating sender's transfers (256 KiB frames)
   are computed from the trace and fed to the monitor; per trace, the median |error| and, after
   each lasting rate change (>= 30%, held >= 3 s), the time until the estimate is within ±20%.
3. A few uplink traces replayed for real through the emulator (``--real N``, 30 s each).

    python benchmarks/bandwidth_tracking.py [--real 2]
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
from _common import RESULTS, pyplot, save, table  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
FRAME = 256 * 1024


# ---------------------------------------------------------------- trace-driven
def simulate(points: list[tuple[float, float]], duration: float | None = None) -> dict:
    from splitinfer.transport.bandwidth import BandwidthMonitor
    from splitinfer.transport.netem import RateSchedule

    sched = RateSchedule(points, loop=False)
    end = duration or (points[-1][0] - points[0][0])
    t = 0.0
    mon = BandwidthMonitor(clock=lambda: t)
    times, est, true = [], [], []
    while t < end:
        start, left = t, FRAME * 8 / 1e6  # Mbit
        while left > 1e-12 and t < end + 600:
            r, nxt = sched.rate_at(t), max(sched.next_change(t), t + 1e-6)
            if r <= 0:
                t = nxt
                continue
            dt = min(left / r, nxt - t)
            left -= r * dt
            t += dt
        if t > end:
            break
        mon.add_transfer(FRAME, t - start, at=t)
        times.append(t)
        est.append(mon.raw_mbps())
        true.append(sched.rate_at(t))
    times_a, est_a, true_a = np.array(times), np.array(est), np.array(true)
    ok = true_a > 0.05
    err = np.abs(est_a[ok] - true_a[ok]) / true_a[ok]
    # Lasting changes: the mean rate over the next 3 s differs from the previous 3 s by >= 30%, and
    # the next 3 s are steady (every 0.1 s within ±25% of their mean). Settle: first estimate
    # within ±20% of that new mean.
    settles: list[float] = []
    frame_s: list[float] = []
    grid = np.arange(0, end, 0.1)
    rates = np.array([sched.rate_at(float(g)) for g in grid])
    w = 30  # 3 s of 0.1 s steps
    i = w
    while i + w <= len(grid):
        before, after = rates[i - w:i].mean(), rates[i:i + w]
        m = after.mean()
        if before > 0.05 and m > 0.05 and abs(m - before) / before >= 0.3 and np.all(np.abs(after - m) <= 0.25 * m):
            ts = grid[i]
            sel = (times_a >= ts) & (times_a < ts + 3)
            within = np.abs(est_a[sel] - m) <= 0.2 * m
            settles.append(float(times_a[sel][np.argmax(within)] - ts) if within.any() else float("inf"))
            frame_s.append(FRAME * 8 / 1e6 / m)  # one transfer at the new rate: no sample comes sooner
            i += w
        else:
            i += 1
    return {"samples": len(times), "median_abs_err": float(np.median(err)) if err.size else None,
            "changes": len(settles), "settle_median_s": statistics.median(settles) if settles else None,
            "settle_p90_s": sorted(settles)[int(0.9 * (len(settles) - 1))] if settles else None,
            "settled_within_2s": float(np.mean([s <= 2 for s in settles])) if settles else None,
            "settled_within_2s_or_2_transfers": float(np.mean([s <= max(2.0, 2 * f) for s, f in zip(settles, frame_s)]))
            if settles else None}


# ---------------------------------------------------------------- real, through the emulator
async def answer(ch):
    from splitinfer.transport import wire

    while True:
        m = await ch.recv()
        await ch.send(wire.Result(m.request_id, {}, timings=wire.ServerTimings(recv_ms=m.info.seconds * 1e3)))


async def run_real(emu_kwargs: dict, schedule, seconds: float) -> list[tuple[float, float, float]]:
    """Saturate the emulated link for ``seconds``; ``schedule(emu, t)`` may change it. Returns
    (t, estimate, set rate) per sample."""
    from splitinfer.transport import wire
    from splitinfer.transport.bandwidth import BandwidthMonitor
    from splitinfer.transport.netem import LinkEmulator
    from splitinfer.transport.tcp import TcpChannel, TcpServer

    x = np.zeros(FRAME // 4, np.float32)
    out = []
    async with await TcpServer.start(answer) as srv:
        async with LinkEmulator(("127.0.0.1", srv.port), **emu_kwargs) as emu:
            async with await TcpChannel.connect("127.0.0.1", emu.port) as ch:
                mon = BandwidthMonitor()
                t0 = time.monotonic()
                for i in range(2):
                    await ch.send(wire.InferRequest(i, "h", "c", {"x": x}))
                i = 2
                while (t := time.monotonic() - t0) < seconds:
                    schedule(emu, t)
                    r = await ch.recv()
                    mon.add_transfer(FRAME, r.timings.recv_ms / 1e3)
                    out.append((time.monotonic() - t0, mon.raw_mbps(), emu.rate_mbps()))
                    await ch.send(wire.InferRequest(i, "h", "c", {"x": x}))
                    i += 1
    return out


def settle(samples, at: float, rate: float, until: float) -> float:
    for t, est, _ in samples:
        if at <= t < until and abs(est - rate) <= 0.2 * rate:
            return t - at
    return float("inf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", type=int, default=2, help="uplink traces to replay for real (30 s each)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    result: dict = {}

    # 1. step test
    steps = []
    for _ in range(args.rounds):
        def sched(emu, t):
            emu.set_rate(50 if t < 4 else 5 if t < 9 else 50)

        s = asyncio.run(run_real({"rate_mbps": 50}, sched, 14))
        steps.append({"down_s": settle(s, 4, 5, 9), "up_s": settle(s, 9, 50, 14)})
    result["step"] = steps
    table("step test through the emulator: seconds to within ±20% (goal 2 s)",
          ["round", "50 -> 5 Mbit/s", "5 -> 50 Mbit/s"],
          [[i + 1, s["down_s"], s["up_s"]] for i, s in enumerate(steps)])

    # 2. all traces, trace-driven
    rows, per = [], {}
    if TRACES.is_dir():
        from splitinfer.transport.netem import load_trace

        for p in sorted(TRACES.glob("*.csv")):
            r = simulate(load_trace(p))
            per[p.stem] = r
            rows.append([p.stem[:48], r["samples"], f"{100 * (r['median_abs_err'] or 0):.1f}%", r["changes"],
                         "-" if r["settle_median_s"] is None else f"{r['settle_median_s']:.2f}",
                         "-" if r["settle_p90_s"] is None else f"{r['settle_p90_s']:.2f}",
                         "-" if r["settled_within_2s"] is None else f"{100 * r['settled_within_2s']:.0f}%",
                         "-" if r["settled_within_2s"] is None else f"{100 * r['settled_within_2s_or_2_transfers']:.0f}%"])
        table("trace-driven tracking, saturating 256 KiB transfers",
              ["trace", "samples", "median |err|", "changes", "settle median s", "settle p90 s", "within 2 s",
               "within max(2 s, 2 transfers)"], rows)
        vals = [r["settled_within_2s"] for r in per.values() if r["settled_within_2s"] is not None]
        print(f"all traces: median |err| {100 * statistics.median([r['median_abs_err'] for r in per.values()]):.1f}%, "
              f"changes settled within 2 s: median over traces {100 * statistics.median(vals):.0f}%")
        result["traces"] = per
        # 3. a few uplink traces for real
        real = {}
        for p in [q for q in sorted(TRACES.glob("*up*.csv"))][: args.real]:
            pts = load_trace(p)
            s = asyncio.run(run_real({"trace": pts}, lambda emu, t: None, 30))
            errs = [abs(e - r) / r for _, e, r in s if r > 0.05]
            real[p.stem] = {"samples": len(s), "median_abs_err": float(np.median(errs)) if errs else None}
        if real:
            table("uplink traces replayed through the emulator (30 s, saturating)", ["trace", "samples", "median |err|"],
                  [[k, v["samples"], f"{100 * (v['median_abs_err'] or 0):.1f}%"] for k, v in real.items()])
        result["real_replay"] = real
    else:
        print(f"{TRACES} not found: trace results skipped")
    print(f"wrote {save('bandwidth_tracking', result)}")
    _plot(result)


def _plot(result: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    traces = result.get("traces") or {}
    if not traces:
        return
    names = list(traces)
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    ax.bar(range(len(names)), [100 * (traces[n]["median_abs_err"] or 0) for n in names])
    ax.set_xticks(range(len(names)), [n[:28] for n in names], rotation=75, fontsize=7)
    ax.set_ylabel("median |estimate - rate| / rate (%)")
    ax.set_title("bandwidth monitor tracking error per trace (trace-driven, saturating sender)")
    fig.tight_layout()
    fig.savefig(RESULTS / "bandwidth_tracking.png")
    plt.close(fig)


if __name__ == "__main__":
    main()
