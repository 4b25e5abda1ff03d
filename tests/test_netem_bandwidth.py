"""The link emulator (real TCP through a userspace relay) and the bandwidth monitor fed by real
transfers through it, plus active probing while no data flows."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from conftest import SHARED, arun
from splitinfer.transport import wire
from splitinfer.transport import ActiveProber, BandwidthMonitor
from splitinfer.transport.netem import LinkEmulator, RateSchedule, load_trace, parse_rate
from splitinfer.transport.tcp import TcpChannel, TcpServer


async def answer(ch):
    """Reply to requests with an empty result carrying the receive timing, to pings with pongs."""
    while True:
        m = await ch.recv()
        if isinstance(m, wire.Ping):
            await ch.send(wire.Pong(m.seq, m.sent_at, recv_ms=m.info.seconds * 1e3, nbytes=m.info.nbytes))
        elif isinstance(m, wire.InferRequest):
            await ch.send(wire.Result(m.request_id, {}, timings=wire.ServerTimings(recv_ms=m.info.seconds * 1e3)))


async def goodput(emu_port: int, nbytes: int) -> float:
    """Mbit/s of one bulk transfer through the relay to a counting sink."""
    r, w = await asyncio.open_connection("127.0.0.1", emu_port)
    t = time.monotonic()
    w.write(b"x" * nbytes)
    await w.drain()
    w.write_eof()
    got = int(await r.read())
    w.close()
    return got * 8 / (time.monotonic() - t) / 1e6


async def count_sink(r, w):
    n = 0
    while d := await r.read(1 << 16):
        n += len(d)
    w.write(str(n).encode())
    await w.drain()
    w.close()


@pytest.mark.parametrize("text,mbps", [("20mbit", 20), ("500kbit", 0.5), ("1.5gbit", 1500), ("8", 8),
                                       ("8000bit", 0.008)])
def test_parse_rate(text, mbps):
    assert parse_rate(text) == pytest.approx(mbps)


def test_parse_rate_rejects():
    with pytest.raises(ValueError, match="20mbit"):
        parse_rate("fast")


def test_schedule_steps_speedup_and_loop():
    s = RateSchedule([(0, 10), (1, 0), (2, 5)], speedup=2.0)
    assert [s.rate_at(t) for t in (0.0, 0.6, 1.1, 1.6)] == [10, 0, 5, 10]  # period 3 trace-s = 1.5 wall-s


def test_rate_limit_is_accurate():
    async def main():
        sink = await asyncio.start_server(count_sink, "127.0.0.1", 0)
        async with LinkEmulator(("127.0.0.1", sink.sockets[0].getsockname()[1]), rate_mbps=8) as emu:
            mbps = await goodput(emu.port, 1_000_000)  # one second at 8 Mbit/s
        sink.close()
        assert 0.85 * 8 <= mbps <= 1.05 * 8
    arun(main())


def test_delay_outage_and_recovery():
    async def main():
        async with await TcpServer.start(answer) as srv:
            async with LinkEmulator(("127.0.0.1", srv.port), rate_mbps=50, delay_ms=40) as emu:
                async with await TcpChannel.connect("127.0.0.1", emu.port) as ch:
                    t = time.monotonic()
                    await ch.send(wire.Ping(1, 0.0))
                    await ch.recv()
                    rtt = time.monotonic() - t
                    assert 0.08 <= rtt < 0.3  # two one-way delays
                    emu.outage(0.6)
                    t = time.monotonic()
                    await ch.send(wire.Ping(2, 0.0))
                    await asyncio.wait_for(ch.recv(), 5)
                    assert time.monotonic() - t >= 0.6  # nothing crossed during the outage
                    assert not ch.closed
    arun(main())


async def saturate(ch, monitor, stop: asyncio.Event, size: int = 128 << 10) -> None:
    """Keep two requests in flight; feed the monitor from the receiver's first-to-last byte timing."""
    x = np.zeros(size // 4, np.float32)
    ids = iter(range(1 << 30))
    for _ in range(2):
        await ch.send(wire.InferRequest(next(ids), "h", "c", {"x": x}))
    while not stop.is_set():
        r = await ch.recv()
        monitor.add_transfer(size, r.timings.recv_ms / 1e3)
        await ch.send(wire.InferRequest(next(ids), "h", "c", {"x": x}))


async def wait_until(pred, timeout: float, tick: float = 0.02) -> float:
    """Seconds until ``pred()`` holds; fails the test after ``timeout``."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(tick)
    return time.monotonic() - t0


def test_monitor_follows_a_step_down_and_up_through_the_emulator():
    async def main():
        async with await TcpServer.start(answer) as srv:
            async with LinkEmulator(("127.0.0.1", srv.port), rate_mbps=50) as emu:
                async with await TcpChannel.connect("127.0.0.1", emu.port) as ch:
                    mon = BandwidthMonitor()
                    stop = asyncio.Event()
                    task = asyncio.create_task(saturate(ch, mon, stop))
                    near = lambda rate: (lambda: abs(mon.raw_mbps() - rate) <= 0.2 * rate)  # noqa: E731
                    await wait_until(near(50), 5)
                    emu.set_rate(5)
                    down = await wait_until(near(5), 4)
                    emu.set_rate(50)
                    up = await wait_until(near(50), 4)
                    stop.set()
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    return down, up
    down, up = arun(main())
    assert down < 4 and up < 4  # the figure (2 s) is measured in benchmarks/bandwidth_tracking.py


def test_monitor_ignores_tiny_frames_and_tracks_rtt():
    mon = BandwidthMonitor(min_sample_bytes=10_000)
    assert not mon.add_transfer(500, 0.0001)
    assert mon.raw_mbps() == mon.default_mbps
    for r in (40.0, 20.0, 30.0):
        mon.add_rtt(r)
    assert mon.min_rtt_ms() == 20.0 and 20 < mon.rtt_ms() < 40
    assert mon.estimate_mbps() == pytest.approx(mon.raw_mbps() * mon.safety)


def test_a_small_frame_the_link_spread_out_is_a_sample_and_a_quick_or_tiny_one_is_not():
    mon = BandwidthMonitor()
    assert not mon.add_transfer(18_000, 0.005)  # 18 KB in 5 ms: the timer's noise is a large share
    assert not mon.add_transfer(1_600, 0.05)  # two packets: one gap, whatever spread it
    assert mon.raw_mbps() == mon.default_mbps
    assert mon.add_transfer(18_000, 0.096)  # 18 KB over 96 ms: the link's 1.5 Mbit/s
    assert mon.raw_mbps() == pytest.approx(1.5)


def test_the_estimate_follows_a_fall_carried_only_by_small_paced_frames():
    """A camera sending ~18 KB JPEGs at 8 fps: no frame is a bulk transfer, yet when the link
    falls from 4 to 1.5 Mbit/s each one takes ~100 ms on it, and the estimate follows."""
    async def frames(ch, mon, stop):
        x = np.zeros(18_000 // 4, np.float32)
        k = 0
        while not stop.is_set():
            due = time.monotonic() + 0.125
            await ch.send(wire.InferRequest(k, "h", "c", {"x": x}))
            r = await ch.recv()
            mon.add_transfer(18_000, r.timings.recv_ms / 1e3)
            k += 1
            await asyncio.sleep(max(due - time.monotonic(), 0.0))  # the camera's frame rate

    async def main():
        async with await TcpServer.start(answer) as srv:
            async with LinkEmulator(("127.0.0.1", srv.port), rate_mbps=4) as emu:
                async with await TcpChannel.connect("127.0.0.1", emu.port) as ch:
                    mon = BandwidthMonitor()
                    stop = asyncio.Event()
                    task = asyncio.create_task(frames(ch, mon, stop))
                    near = lambda rate: (lambda: abs(mon.raw_mbps() - rate) <= 0.25 * rate)  # noqa: E731
                    await wait_until(near(4), 5)
                    emu.set_rate(1.5)
                    down = await wait_until(near(1.5), 5)
                    stop.set()
                    await asyncio.gather(task, return_exceptions=True)
                    return down
    assert arun(main()) < 3


def test_base_rtt_is_the_minimum_of_the_last_ten_seconds():
    """The base RTT is read on every frame: a sliding minimum, the same as min() over the window."""
    import random

    mon = BandwidthMonitor()
    assert mon.min_rtt_ms() == 0.0  # nothing yet: the smoothed RTT's 0
    rng = random.Random(3)
    seen: list[tuple[float, float]] = []
    for k in range(400):
        at, ms = k * 0.1, rng.uniform(5.0, 80.0) if k % 50 else 1.0  # a rare low one, then it ages out
        mon.add_rtt(ms, at=at)
        seen.append((at, ms))
        assert mon.min_rtt_ms() == min(r for t, r in seen if t >= at - 10.0), k
    mon.add_rtt(-1.0, at=41.0)  # refused, as a NaN is
    mon.add_rtt(float("nan"), at=41.0)
    assert mon.min_rtt_ms() == min(r for t, r in seen if t >= 39.9 - 10.0)


def test_synthetic_step_is_tracked_within_two_seconds_of_transfer_time():
    mon = BandwidthMonitor()
    t = 0.0

    def feed(rate, seconds):
        nonlocal t
        end = t + seconds
        while t < end:
            size = 200_000
            dur = size * 8 / (rate * 1e6)
            mon.add_transfer(size, dur, at=t)
            t += dur
        return mon.estimate_mbps()

    feed(50, 5)
    assert abs(feed(5, 2) - 5) <= 1.0
    assert abs(feed(50, 2) - 50) <= 10.0


def test_active_probing_notices_bandwidth_coming_back():
    async def main():
        async with await TcpServer.start(answer) as srv:
            async with LinkEmulator(("127.0.0.1", srv.port), rate_mbps=2) as emu:
                async with await TcpChannel.connect("127.0.0.1", emu.port) as ch:
                    mon = BandwidthMonitor()
                    prober = ActiveProber(mon, ch.send)
                    prober.want_more = True  # the caller's word: a faster link would matter

                    async def reader():
                        while True:
                            m = await ch.recv()
                            if isinstance(m, wire.Pong):
                                prober.on_pong(m)

                    tasks = [asyncio.create_task(prober.run()), asyncio.create_task(reader())]
                    await wait_until(lambda: mon.samples >= 2 and abs(mon.raw_mbps() - 2) < 0.6, 10)
                    emu.set_rate(20)
                    t = await wait_until(lambda: mon.raw_mbps() > 12, 10)
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    # bounded: no more than ~share of the link, plus the minimum probe size
                    return t, prober.sent_bytes, emu.up.bytes
    t, sent, crossed = arun(main(), timeout=40)
    assert t < 8 and sent >= crossed * 0.9


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="../shared/traces is not present")
def test_real_traces_load():
    traces = sorted((SHARED / "traces").glob("*.csv"))
    assert len(traces) >= 10
    for p in traces:
        rows = load_trace(p)
        assert rows[0][0] <= rows[-1][0] and all(r >= 0 for _, r in rows)


def test_restart_schedule_replays_the_trace_from_its_start():
    async def main():
        async with LinkEmulator(("127.0.0.1", 9), trace=[(0.0, 10.0), (0.2, 1.0)]) as emu:
            while emu.rate_mbps() != 1.0:  # the trace moved on (bounded by arun's timeout)
                await asyncio.sleep(0.02)
            emu.restart_schedule()
            return emu.rate_mbps()
    assert arun(main(), timeout=10) == 10.0


def test_an_unanswered_probe_bounds_the_rate():
    now = [100.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    sent = []

    async def send(ping):
        sent.append(ping)

    prober = ActiveProber(mon, send)
    assert prober.rate_bound_mbps() == float("inf")
    arun(prober.probe())
    now[0] += 2.0  # two seconds and no pong: the link carried less than the probe in that time
    bound = prober.rate_bound_mbps()
    assert bound == pytest.approx(sent[0].padding * 8 / 2.0 / 1e6, rel=0.01)
    assert bound < mon.estimate_mbps()


def probe_an_idle_link(prober, mon, now, mbps, seconds, rtt_s=0.03, sizes=None, times=None):
    """Run ``prober`` against a simulated idle link of ``mbps`` for ``seconds`` (``now``: the shared
    fake clock, in a list); each probe is answered after its bytes crossed and an RTT. The bytes
    sent (each probe's size appended to ``sizes``, the time it went to ``times``)."""
    pending = []  # (answer at, pong)

    async def send(ping):
        if sizes is not None:
            sizes.append(ping.padding)
        if times is not None:
            times.append(now[0])
        seconds_on_link = ping.padding * 8 / (mbps * 1e6)
        pending.append((now[0] + seconds_on_link + rtt_s,
                        wire.Pong(ping.seq, now[0], recv_ms=seconds_on_link * 1e3, nbytes=ping.padding)))

    prober.send = send

    async def main():
        end = now[0] + seconds
        while now[0] < end:
            for item in [p for p in pending if p[0] <= now[0]]:
                pending.remove(item)
                prober.on_pong(item[1])
            if prober.due(now[0]):
                await prober.probe()
            now[0] += 0.05
    before = prober.sent_bytes
    asyncio.run(main())
    return prober.sent_bytes - before


@pytest.mark.parametrize("mbps", [0.5, 1.0, 5.0])
def test_probes_take_a_share_of_the_link_only_while_a_faster_link_would_matter(mbps):
    """A camera on the edge pays for every probe: while a faster link would change the choice,
    probes (ramps included) stay within ``share`` of the link; otherwise one probe every
    ``max_interval_s``. (Before: a 48 KB probe every 2 s whatever the rate, 20 % of a 1 Mbit/s
    link and 77 % of a 0.5 Mbit/s one, on an agent that could not use the cloud.)"""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    mon.add_transfer(int(mbps * 1e6 / 8), 1.0, at=0.0)  # the link was measured: mbps
    prober = ActiveProber(mon, None)
    link_bytes = mbps * 1e6 / 8
    prober.want_more = True  # the caller's word: a faster link would matter
    wanted = probe_an_idle_link(prober, mon, now, mbps, 300.0)
    # a ramp is for a link a probe cannot time; on these a 48 KB probe takes 79-790 ms: none
    assert prober.ramps == 0 and prober.sent >= 1
    # within the share over the run (a ramp's bytes are repaid by its rest), and one probe on top
    # where the share alone would space them further apart than max_interval_s
    assert wanted <= max(prober.share * link_bytes * 300.0, prober.min_probe_bytes * 300.0 / prober.max_interval_s) \
        + prober.max_probe_bytes, wanted
    prober.want_more = False
    quiet = probe_an_idle_link(prober, mon, now, mbps, 300.0)
    assert quiet <= (300.0 / prober.max_interval_s + 1) * prober.probe_size(), quiet
    assert quiet >= 20 * prober.floor_bytes()  # still probing: a link that came back is found
    assert abs(mon.raw_mbps() - mbps) < 0.2 * mbps  # and the estimate stays true


def test_a_callers_budget_caps_the_probes_below_the_share():
    """An edge agent caps its probes at a share of what its frames would cost in the cloud: on a
    5 Mbit/s link, 10 % of the link is 62 KB/s, more than a 2-fps camera's 43 KB frames (86 KB/s)
    are worth probing for; with a budget of 8.6 KB/s the probes, the first ramp included, stay
    within it over five minutes."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    mon.add_transfer(625_000, 1.0, at=0.0)
    prober = ActiveProber(mon, None)
    prober.budget_bps = 8600.0
    sent = probe_an_idle_link(prober, mon, now, 5.0, 300.0)
    assert prober.ramps == 0  # measured at 5 Mbit/s, where a 48 KB probe (79 ms) times the link
    assert sent <= prober.budget_bps * 300.0 + 8 * prober.min_probe_bytes, sent  # the first ramp's bytes on top
    assert sent >= prober.budget_bps * 300.0 * 0.5  # and it does probe: the budget is spent, not hoarded


def test_a_link_a_probe_can_time_is_not_ramped_on():
    """A ramp finds a link too fast for a probe to time; at 0.8 Mbit/s a 48 KB probe takes ~0.5 s
    and measures it: no ramp goes, whether the first probe timed the link or, as here, the
    estimate already says so (a ramp of 48 + 96 + 192 KB there, repaid at the share, held the
    steady probes off for ~30 s while the call was close), and the steady probes keep the share's
    pace."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    mon.add_transfer(100_000, 1.0, at=0.0)
    sizes = []
    prober = ActiveProber(mon, None)
    prober.want_more = True  # the caller's word: the call is close
    probe_an_idle_link(prober, mon, now, 0.8, 60.0, sizes=sizes)
    assert prober.ramps == 0 and not prober.ramping
    # steady probes only, of 60 ms of the rate (the monitor's 8 KB floor; 48 KB took 0.5 s)
    assert set(sizes) == {prober.floor_bytes()} and prober.floor_bytes() < prober.min_probe_bytes, sizes
    # at the share: 10 % of 0.8 Mbit/s is 10 KB/s, an 8 KB probe every ~0.8 s (not one every 10 s)
    assert len(sizes) >= 50, len(sizes)


def test_no_ramp_starts_beside_frames_that_time_a_link_which_fell_since_the_last_probe():
    """The last probe crossed a 50 Mbit/s link in 8 ms; since then the link fell to 1.5 Mbit/s
    and 18 KB frames, each ~100 ms on it, time it eight times a second. A ramp is for a link a
    probe cannot time: none starts (one did, and its 48 KB probe held the frame behind it ~260 ms
    on the demo's trace), no steady probe goes while the frames keep the estimate fresh, and the
    next probe is sized by the frames' rate (60 ms of it: 11 KB, not 48)."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    prober = ActiveProber(mon, None)
    prober.on_pong(wire.Pong(1, 0.0, recv_ms=7.8, nbytes=prober.min_probe_bytes))
    prober.want_more = True  # a faster link would matter
    due = []
    for k in range(80):
        now[0] = 1.0 + k * 0.125
        mon.add_transfer(18_000, 0.096)
        now[0] += 0.06
        due.append(prober.due(now[0]))
    assert mon.raw_mbps() == pytest.approx(1.5, rel=0.05)
    assert not any(due) and not prober.ramping
    # and a probe is sized by what the frames timed, not by the last probe's 50 Mbit/s (375 KB)
    assert prober.probe_size() == prober.floor_bytes() == int(1.5e6 / 8 * prober.probe_ms / 1e3)


def _after_probing(mbps, seconds, budget_bps):
    """A prober that has probed an idle link of ``mbps`` for ``seconds`` under ``budget_bps``
    (its debt outstanding, as on an agent running on the device), and its fake clock."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    mon.add_transfer(int(mbps * 1e6 / 8), 1.0, at=0.0)
    prober = ActiveProber(mon, None)
    prober.want_more, prober.budget_bps = True, budget_bps  # an agent's word: a faster link would matter
    probe_an_idle_link(prober, mon, now, mbps, seconds)
    return prober, mon, now


@pytest.mark.parametrize("mbps", [100.0, 2000.0])
def test_on_a_fast_link_that_no_faster_rate_would_help_probes_are_small(mbps):
    """On loopback (or 100 Mbit/s), the cloud already chosen and a faster link no help, a steady
    probe went every ``max_interval_s`` at 60 ms of the rate, capped at 2 MB: ~300 KB of uplink a
    frame at 2 fps beside the frames' own. It need only find a slower link: ``min_probe_bytes``
    does, and the estimate stays what the link does."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    mon.add_transfer(int(mbps * 1e6 / 8 * 0.1), 0.1, at=0.0)  # the link was measured: mbps
    prober = ActiveProber(mon, None)
    prober.want_more = False
    sizes = []
    probe_an_idle_link(prober, mon, now, mbps, 60.0, sizes=sizes)
    assert len(sizes) >= 5 and set(sizes) == {prober.min_probe_bytes}, sizes
    assert prober.probe_size() > 10 * prober.min_probe_bytes  # what a probe would have been
    assert mon.raw_mbps() > 0.8 * mbps
    # the link fell to 20 Mbit/s: the small probes time it
    probe_an_idle_link(prober, mon, now, 20.0, 60.0)
    assert mon.raw_mbps() < 0.5 * mbps
    assert mon.raw_mbps() == pytest.approx(20.0, rel=0.3)


@pytest.mark.parametrize("mbps", [4.0, 2000.0])
def test_a_new_link_is_measured_at_once_then_probes_wait_for_the_callers_word(mbps):
    """Connected before its first frame (a benchmark's pre-roll, a camera not yet streaming), an
    agent's prober ramped, then sent 2 MB steady probes every 0.5 s on loopback (~12 MB before the
    first frame: ~224 KB of probes a frame over a 40-s run) and ramped again every
    ``ramp_every_s``. Now: one ramp measures the link, then one small probe every
    ``max_interval_s`` until the caller says a faster link would matter."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    prober = ActiveProber(mon, None)
    sizes = []
    probe_an_idle_link(prober, mon, now, mbps, 60.0, sizes=sizes)
    assert prober.ramps == 1 and abs(mon.raw_mbps() - mbps) < 0.3 * mbps  # measured at once
    ramp = 1 if mbps < 10 else 7  # a slow link's first probe timed it; a fast one's ramp doubled to 2 MB
    assert sizes[ramp:] == [prober.floor_bytes()] * len(sizes[ramp:]) and len(sizes) - ramp <= 60 / prober.max_interval_s + 1, sizes
    prober.want_more = True  # the caller's word: steady probes at the share of the rate again
    probe_an_idle_link(prober, mon, now, mbps, 10.0, sizes=sizes)
    assert max(sizes[-3:]) == prober.probe_size() > prober.min_probe_bytes or mbps < 10


@pytest.mark.parametrize("busy_at_s", [0.0, 0.12])
def test_a_ramp_waits_while_the_callers_requests_are_on_the_link(busy_at_s):
    """A ramp's probes double to 2 MB back to back; at connect they went out beside the first
    frames (an edge's first frames on loopback were hedged on the device now and then). Now a ramp
    neither starts nor goes on while ``busy`` says a request is waiting (here for 3 s, from the
    start or from the ramp's third round), no probe is over ``min_probe_bytes`` meanwhile, and once
    it clears the ramp measures the link as before."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    prober = ActiveProber(mon, None, busy=lambda: busy_at_s <= now[0] < busy_at_s + 3.0)
    sizes, times = [], []
    probe_an_idle_link(prober, mon, now, 2000.0, 8.0, sizes=sizes, times=times)
    during = [n for n, t in zip(sizes, times) if busy_at_s <= t < busy_at_s + 3.0]
    before = [n for n, t in zip(sizes, times) if t < busy_at_s]
    assert all(n <= prober.min_probe_bytes for n in during), (sizes, times)
    assert len(before) == (3 if busy_at_s else 0)  # (the ramp was under way when the request came)
    assert prober.ramps == 1 and max(sizes) == prober.max_probe_bytes  # it went on afterwards
    assert min(t for n, t in zip(sizes, times) if n == prober.max_probe_bytes) >= busy_at_s + 3.0
    assert abs(mon.raw_mbps() - 2000.0) < 0.3 * 2000.0


def test_a_ramp_held_off_by_requests_that_never_clear_ends_and_probes_go_on():
    """A pipeline that always has a request waiting (frames back to back) would hold a ramp off for
    ever, and no probe would go at all; after ``max_interval_s`` the ramp ends and the steady
    probes (48 KB while busy) go on."""
    now = [0.0]
    mon = BandwidthMonitor(clock=lambda: now[0])
    prober = ActiveProber(mon, None, busy=lambda: now[0] >= 0.12)
    sizes, times = [], []
    probe_an_idle_link(prober, mon, now, 2000.0, 30.0, sizes=sizes, times=times)
    assert prober.ramps == 1 and not prober.ramping
    later = [n for n, t in zip(sizes, times) if t > prober.max_interval_s]
    assert later and all(n == prober.floor_bytes() for n in later), (sizes, times)


def test_a_link_that_comes_back_after_an_outage_is_found_within_seconds():
    """A late frame during a 1-s outage sets a ceiling of 0.2 Mbit/s on a 4 Mbit/s link; the
    link is back at once. The budget (300 B/s, a tenth of a 1.5 KB bottleneck's frames at 2 fps)
    would space probes ~160 s apart, and before, the ceiling held until the next probe every
    ``max_interval_s`` (10 s); a recovery probe finds the link within ~1 s."""
    prober, mon, now = _after_probing(4.0, 25.0, budget_bps=300.0)  # its last probe 5 s ago
    mon.add_ceiling(0.2, at=now[0])
    assert mon.raw_mbps() == pytest.approx(0.2)
    probe_an_idle_link(prober, mon, now, 4.0, 2.0)
    assert mon.raw_mbps() > 3.0
    assert prober.recovery_probes == 1


def test_a_fall_that_stays_costs_a_few_recovery_probes():
    """The link really fell (4 -> 0.2 Mbit/s): recovery probes back off (1, 2, 4, 8 s) and stop once
    the fall is what the estimate remembers (``recall_s``); while a faster link would not matter,
    none are sent."""
    prober, mon, now = _after_probing(4.0, 30.0, budget_bps=300.0)
    mon.add_transfer(25_000, 1.0, at=now[0])  # a timed sample at 0.2 Mbit/s: the fall
    probe_an_idle_link(prober, mon, now, 0.2, 40.0)
    assert 1 <= prober.recovery_probes <= 4, prober.recovery_probes
    before = prober.recovery_probes
    probe_an_idle_link(prober, mon, now, 0.2, 60.0)
    assert prober.recovery_probes == before
    quiet, q_mon, q_now = _after_probing(4.0, 30.0, budget_bps=300.0)
    quiet.want_more = False
    q_mon.add_ceiling(0.2, at=q_now[0])
    probe_an_idle_link(quiet, q_mon, q_now, 4.0, 5.0)
    assert quiet.recovery_probes == 0
