"""Fast links are found: on loopback and behind a 100 Mbit/s emulated link, a slowed device hands
its frames to the cloud within a few seconds (the estimate once sat at its 5 Mbit/s prior
forever: transfers too fast to time were ignored, and probes were sized by that prior). Also the
monitor's lower bounds and the prober's ramp on their own."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import _export, arun

pytest.importorskip("aiohttp")

from splitinfer.cloud import CloudService  # noqa: E402
from splitinfer.edge import EdgeAgent  # noqa: E402
from splitinfer.splitter import Plan  # noqa: E402
from splitinfer.splitter.profiler import random_feeds  # noqa: E402
from splitinfer.transport import ActiveProber, BandwidthMonitor, LinkEmulator  # noqa: E402
from splitinfer.transport.wire import Pong  # noqa: E402

SLOW = 30.0  # the device: this many times slower than this machine


@pytest.fixture(scope="module")
def plan128(tmp_path_factory):
    """At 128x128 the input is ~100 KB as fp16: at the 5 Mbit/s prior the device looks faster."""
    from splitinfer.splitter import split_model

    d = tmp_path_factory.mktemp("fast")
    out = d / "yolo128"
    split_model(_export("yolo-n", (1, 3, 128, 128), d / "yolo128.onnx"), out, budget_s=0.05)
    return out


@pytest.mark.parametrize("rate_mbps", [None, 100.0], ids=["loopback", "100mbit"])
def test_a_fast_link_is_discovered_and_the_cloud_is_chosen(plan128, rate_mbps):
    yolo_plan = plan128
    plan = Plan.load(yolo_plan)
    fs = [random_feeds(plan.inputs, seed=k) for k in range(4)]

    async def main():
        async with CloudService([yolo_plan], listen=("127.0.0.1", 0), http=None, advertise=False) as svc:
            emu = LinkEmulator(("127.0.0.1", svc.port), rate_mbps=rate_mbps) if rate_mbps else None
            if emu is not None:
                await emu.start()
            try:
                port = emu.port if emu is not None else svc.port
                async with EdgeAgent(plan, f"tcp://127.0.0.1:{port}", emulate_slowdown=SLOW) as ag:
                    t0 = time.monotonic()
                    log = []
                    async for r in ag.stream((fs[k % 4] for k in range(10_000)), fps=10):
                        log.append((time.monotonic() - t0, r))
                        if log[-1][0] > 5.0:
                            break
                    return log, ag.monitor.estimate_mbps(), ag.controller.edge_ms()
            finally:
                if emu is not None:
                    await emu.aclose()

    log, mbps, edge_ms = arun(main(), timeout=90)
    i = [c.id for c in plan.candidates].index("edge")
    late = [r for t, r in log if t > 3.0 and not r.explore]
    remote = [r for r in late if r.placement in ("cloud", "split")]
    assert len(remote) >= 0.8 * len(late), ([(round(t, 2), r.candidate, r.placement) for t, r in log], mbps)
    assert mbps > 20, mbps  # not the 5 Mbit/s prior
    # and it was worth it: the cloud answers faster than this device computes
    assert sorted(r.timings["total_ms"] for r in remote)[len(remote) // 2] < edge_ms[i]


def test_a_transfer_too_fast_to_time_is_a_lower_bound():
    now = [0.0]
    m = BandwidthMonitor(clock=lambda: now[0])
    assert m.add_transfer(400_000, 0.0005)  # 400 KB in 0.5 ms: at least 400 KB per 2 ms
    assert m.raw_mbps() == pytest.approx(400_000 * 8 / m.min_sample_s / 1e6)
    now[0] = 1.0
    m.add_transfer(100_000, 0.1)  # a timed transfer is what the link does now: 8 Mbit/s
    assert m.raw_mbps() == pytest.approx(8.0)
    m.add_transfer(100_000, 0.0001)
    now[0] = 1.0 + m.floor_ttl_s + 0.1  # a bound that is not renewed expires
    assert m.raw_mbps() == pytest.approx(8.0)


def test_before_any_timed_sample_an_expired_lower_bound_still_stands_over_the_prior():
    """On loopback nothing is slow enough to time: the probes only ever give lower bounds. One
    that expires must not hand the estimate back to the prior (the cloud's prediction rose from
    ~36 to ~58 ms every few seconds and a split cut was taken instead); a bound below the prior
    says nothing against it; a timed sample or an upper bound still moves it."""
    now = [0.0]
    m = BandwidthMonitor(clock=lambda: now[0])
    assert m.add_transfer(37_000, 0.0001) == "floor"  # 37 KB too fast to time: at least 148 Mbit/s
    bound = 37_000 * 8 / m.min_sample_s / 1e6
    now[0] = m.floor_ttl_s + 5.0
    assert m.lower_bound_mbps() is None and m.raw_mbps() == pytest.approx(bound)
    m.add_ceiling(20.0, now[0])  # a small frame came back late: the link carried at most 20 Mbit/s
    assert m.raw_mbps() == pytest.approx(20.0)
    low = BandwidthMonitor(clock=lambda: now[0])
    low.add_floor(0.5, 0.0)  # the link carried at least 0.5 Mbit/s: the 5 Mbit/s prior stands
    assert low.raw_mbps() == pytest.approx(low.default_mbps)
    now[0] += 1.0
    assert m.add_transfer(100_000, 0.1) == "sample"  # timed: 8 Mbit/s is what the link does now
    now[0] += m.ceiling_ttl_s + m.floor_ttl_s + 1.0
    assert m.raw_mbps() == pytest.approx(8.0)


def test_a_small_late_transfer_is_an_upper_bound():
    """A frame too small to be a throughput sample that came back late: the time its bytes took to
    arrive caps the estimate until a timed sample says what the link does, or the cap ages out."""
    now = [0.0]
    m = BandwidthMonitor(clock=lambda: now[0])
    m.add_transfer(400_000, 0.064)  # 50 Mbit/s
    assert not m.add_transfer(4_300, 0.172)  # a 4.3 KB frame: no sample...
    assert m.raw_mbps() == pytest.approx(50.0)
    m.add_ceiling(4_300 * 8 / 0.172 / 1e6)  # ...but late, its bytes arriving over 172 ms: 0.2 Mbit/s at most
    assert m.raw_mbps() == pytest.approx(0.2)
    m.add_ceiling(80.0)  # a bound above the estimate changes nothing
    assert m.raw_mbps() == pytest.approx(50.0)
    m.add_ceiling(0.2)
    now[0] = m.ceiling_ttl_s + 0.1  # not renewed: it expires
    assert m.raw_mbps() == pytest.approx(50.0)
    m.add_ceiling(0.2)
    m.add_transfer(100_000, 0.1)  # a timed transfer is what the link does now: 8 Mbit/s
    assert 0.2 < m.raw_mbps() < 50.0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        m.add_ceiling(bad)  # ignored
    assert 0.2 < m.raw_mbps() < 50.0


def test_the_prober_ramps_up_until_the_rate_stops_growing():
    """Slow start: back-to-back probes, each twice the last, while a faster link would matter;
    they stop when the measured rate stops growing, and rest before another ramp."""
    now = [0.0]
    link_mbps = 40.0
    m = BandwidthMonitor(clock=lambda: now[0])
    sizes = []

    async def send(ping):
        sizes.append(ping.padding)

    prober = ActiveProber(m, send)

    async def main():
        for _ in range(12):
            if not prober.due(now[0]):
                break
            await prober.probe()
            size = sizes[-1]
            seconds = size * 8 / (link_mbps * 1e6)
            now[0] += seconds + 0.01
            prober.on_pong(Pong(prober._seq, now[0] - seconds - 0.01, recv_ms=seconds * 1e3, nbytes=size))
    asyncio.run(main())
    assert sizes[:3] == [prober.min_probe_bytes, 2 * prober.min_probe_bytes, 4 * prober.min_probe_bytes]
    assert not prober.ramping and prober.ramps == 1
    assert len(sizes) <= 4  # the rate stopped growing at once: two rounds more, then it rests
    assert m.raw_mbps() == pytest.approx(link_mbps, rel=0.05)
    assert not prober.due(now[0])  # resting (and not idle long enough for a steady probe)


def test_overdue_frames_bound_the_rate(yolo_plan):
    """A 400 KB frame unanswered 0.5 s after it was sent, with 100 ms allowed for the RTT and the
    cloud: the link carried less than 400 KB in 0.4 s, whatever the estimate said."""
    from splitinfer.edge import EdgeAgent
    from splitinfer.edge.remote import _Sent

    ag = EdgeAgent(Plan.load(yolo_plan), "tcp://127.0.0.1:9", warmup=False)
    rc = ag.remote
    assert rc.rate_bound_mbps(now=10.0) == float("inf")
    rc._inflight[1] = _Sent(10.0, 400_000, 0, 100.0)
    assert rc.rate_bound_mbps(now=10.05) == float("inf")  # not overdue yet
    assert rc.rate_bound_mbps(now=10.5) == pytest.approx(400_000 * 8 / 0.4 / 1e6)
    rc._inflight[2] = _Sent(10.2, 100_000, 0, 100.0)  # a second frame behind it: 500 KB since 10.0
    assert rc.rate_bound_mbps(now=10.5) == pytest.approx(min(400_000 * 8 / 0.4, 500_000 * 8 / 0.4) / 1e6)
    assert rc.inflight_bytes == 500_000
    # a result coming back over the same link: its bytes are part of what the link had to carry
    rc._inflight[1] = _Sent(10.0, 400_000, 100_000, 100.0)
    assert rc.rate_bound_mbps(now=10.5) == pytest.approx(500_000 * 8 / 0.4 / 1e6)
    rc._inflight[1] = _Sent(10.0, 400_000, 100_000, 100.0, late=True)  # the device finished it first
    assert rc.rate_bound_mbps(now=10.5) == pytest.approx(500_000 * 8 / 0.4 / 1e6 / 2)
    assert rc.rate_bound_mbps(now=10.0 + 7.0) == float("inf")  # unanswered past two deadlines: forgotten
    ag.device.shutdown()


def test_a_probe_ahead_of_a_frame_is_part_of_what_the_link_carried(yolo_plan):
    """A 1.6 KB frame sent just after a 48 KB probe on a 1 Mbit/s link is answered ~0.4 s later:
    while it waits, its silence says the link carried less than probe and frame together, not
    less than the frame alone (0.03 Mbit/s, which collapsed the estimate at every probe). A probe
    answered before the frame was sent, or sent after it, is not in its way."""
    from splitinfer.edge import EdgeAgent
    from splitinfer.edge.remote import _Sent

    ag = EdgeAgent(Plan.load(yolo_plan), "tcp://127.0.0.1:9", warmup=False)
    rc = ag.remote
    rc._inflight[1] = _Sent(10.0, 1600, 0, 20.0)
    now = 10.3
    alone = 1600 * 8 / 0.28 / 1e6
    assert rc.rate_bound_mbps(now=now) == pytest.approx(alone)
    in_way = [(now - 9.99, 48 * 1024, None)]  # sent 10 ms before the frame, not answered
    assert rc.rate_bound_mbps(now=now, probes=in_way) == pytest.approx((48 * 1024 + 1600) * 8 / 0.28 / 1e6)
    assert rc.rate_bound_mbps(now=now, probes=in_way) > 1.0  # a 1 Mbit/s link is not ruled out
    answered_before = [(now - 9.5, 48 * 1024, now - 9.9)]
    sent_after = [(now - 10.1, 48 * 1024, None)]
    assert rc.rate_bound_mbps(now=now, probes=answered_before) == pytest.approx(alone)
    assert rc.rate_bound_mbps(now=now, probes=sent_after) == pytest.approx(alone)
    answered_since = [(now - 9.99, 48 * 1024, now - 10.2)]  # through the link while the frame waited
    assert rc.rate_bound_mbps(now=now, probes=answered_since) == pytest.approx((48 * 1024 + 1600) * 8 / 0.28 / 1e6)
    ag.device.shutdown()


def test_the_prober_remembers_what_it_sent_and_when_it_was_answered():
    from splitinfer.transport import ActiveProber, BandwidthMonitor
    from splitinfer.transport.wire import Pong

    now = [100.0]
    m = BandwidthMonitor(clock=lambda: now[0])
    sent = []

    async def send(ping):
        sent.append(ping)

    prober = ActiveProber(m, send)
    asyncio.run(prober.probe())
    now[0] = 100.5
    assert prober.recent_sends() == [(pytest.approx(0.5), prober.floor_bytes(), None)]
    prober.on_pong(Pong(sent[0].seq, sent[0].sent_at, recv_ms=400.0, nbytes=sent[0].padding))
    now[0] = 101.0
    assert prober.recent_sends() == [(pytest.approx(1.0), sent[0].padding, pytest.approx(0.5))]


def test_bytes_sent_long_enough_ago_are_through_the_link():
    """What is still ahead of a new frame: the link drains what was sent first in, first out at its
    rate; a probe whose answer is still on the way back is no longer in the way."""
    from splitinfer.transport.bandwidth import queued_bytes

    per_s = 1e6 / 8  # 1 Mbit/s
    assert queued_bytes([], 1.0) == 0.0
    assert queued_bytes([(0.0, 1000)], 1.0) == 1000.0
    assert queued_bytes([(1.0, int(per_s))], 1.0) == 0.0  # through, answered or not
    assert queued_bytes([(1.0, int(2 * per_s))], 1.0) == pytest.approx(per_s)
    # the older send is through after 1 s; the newer one (0.5 s ago) waited for it: half of it is left
    assert queued_bytes([(0.5, int(per_s)), (2.0, int(per_s))], 1.0) == pytest.approx(per_s / 2)


def test_a_probe_too_small_to_time_that_came_back_soon_is_a_lower_bound():
    """An 8 KB floor probe crosses a 3-6 Mbit/s link in 11-22 ms: too short to time at the receiver,
    too small to be a lower bound there. It came back 30 ms after its send, 10 ms over the base RTT:
    its bytes crossed at least that fast (at most min_timed_s is claimed). Ignored, the estimate of
    an agent on a small bottleneck cut stayed at 0.15 Mbit/s for ~19 s while the link did ~3."""
    now = [100.0]
    m = BandwidthMonitor(clock=lambda: now[0])
    m.add_transfer(64_000, 64_000 * 8 / 0.15e6)  # timed at 0.15 Mbit/s (an outage)
    m.add_rtt(20.0)  # the base RTT
    assert m.raw_mbps() == pytest.approx(0.15)
    sent = []

    async def send(ping):
        sent.append(ping)

    prober = ActiveProber(m, send)
    prober.want_more = False  # probes of the floor's size
    asyncio.run(prober.probe())
    n = sent[0].padding
    assert m.min_timed_bytes <= n < m.min_sample_bytes
    now[0] += 0.030
    prober.on_pong(Pong(sent[0].seq, sent[0].sent_at, recv_ms=12.0, nbytes=n))
    # crossing <= 30 - 20 ms, claimed at no less than min_timed_s
    assert m.raw_mbps() == pytest.approx(n * 8 / m.min_timed_s / 1e6)
    now[0] += m.floor_ttl_s + 0.1  # not renewed: it expires, the timed samples stand
    assert m.raw_mbps() == pytest.approx(0.15)
    # one held in a queue came back late: the bound is what the whole round trip allows
    asyncio.run(prober.probe())
    now[0] += 0.120
    prober.on_pong(Pong(sent[1].seq, sent[1].sent_at, recv_ms=5.0, nbytes=sent[1].padding))
    assert sent[1].padding == n
    assert m.min_rtt_ms() == pytest.approx(18.0)  # the first probe's round trip, less its 12 ms at the receiver
    assert m.raw_mbps() == pytest.approx(n * 8 / (0.120 - 0.018) / 1e6)
    # what the frames' conditions log of these probes: both bounds, each as the monitor took it
    said = prober.take_answered()
    assert [(p["taken"], p["bytes"]) for p in said] == [("bound", n), ("bound", n)]
    assert said[1]["mbps"] == pytest.approx(n * 8 / (0.120 - 0.018) / 1e6, rel=1e-3)
    assert said[1]["round_trip_ms"] == pytest.approx(120.0)
    assert prober.take_answered() == []  # each is said once


def test_every_answered_probe_is_logged_as_what_the_monitor_took_it_for():
    """A timed probe is a sample, one too fast to time a floor, one under the smallest timed size
    ignored: the agent's per-frame conditions say which, so an estimate that sat still can be told
    from probes that said nothing."""
    now = [10.0]
    m = BandwidthMonitor(clock=lambda: now[0])
    prober = ActiveProber(m, lambda ping: asyncio.sleep(0))
    cases = [(64_000, 51.2, "sample"), (64_000, 1.0, "floor"), (1_000, 30.0, "ignored")]
    for seq, (n, recv_ms, _) in enumerate(cases):
        now[0] += 0.1
        prober.on_pong(Pong(seq, now[0] - recv_ms / 1e3 - 0.01, recv_ms=recv_ms, nbytes=n))
    said = prober.take_answered()
    assert [p["taken"] for p in said] == [c for *_, c in cases]
    assert said[0]["mbps"] == pytest.approx(10.0)  # 64 KB in 51.2 ms
    assert said[1]["mbps"] == pytest.approx(64_000 * 8 / m.min_sample_s / 1e6)
    assert said[2]["mbps"] == 0.0
    for seq in range(40):  # bounded, whoever reads it: the last 32
        prober.on_pong(Pong(100 + seq, now[0], recv_ms=1.0, nbytes=100))
    assert len(prober.take_answered()) == 32
