"""The device's load is in the prediction: at a frame rate the device cannot keep with the whole
model, frames go to a cloud that is slower per frame but does not queue on the device; at a rate
it can keep, the device is used. The device's queue is what a hedge is weighed against, and
optional work (hedges, races) is refused while the queue is full."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from conftest import arun

pytest.importorskip("aiohttp")

from splitinfer.cloud import CloudService  # noqa: E402
from splitinfer.edge import EdgeAgent  # noqa: E402
from splitinfer.errors import SplitinferError  # noqa: E402
from splitinfer.edge.device import Device  # noqa: E402
from splitinfer.splitter import Plan  # noqa: E402
from splitinfer.splitter.profiler import random_feeds  # noqa: E402
from splitinfer.transport import LinkEmulator  # noqa: E402

SLOW = 30.0  # the device: this many times slower than this machine


@pytest.mark.parametrize("frames_per_device_run,expect", [
    (3.0, "cloud"),
    (0.4, "edge"),
])
def test_a_device_that_cannot_keep_the_frame_rate_hands_frames_to_the_cloud(yolo_plan, frames_per_device_run,
                                                                            expect):
    """A cloud frame takes ~2.5x the device's whole-model time E. At three frames per E the device
    cannot keep up (each frame falls further behind) while the cloud, ten frames in flight, can:
    frames go to the cloud. At a frame every 2.5 E the device keeps up and is faster: the edge.
    (The slowed device takes SLOW x its session's fastest run, which falls as the session runs
    more: on CI's cores the agent's E came out 0.63x the probe's, and at two frames per probed E
    the device nearly kept up. The rates leave room for that both ways.)"""
    plan = Plan.load(yolo_plan)
    fs = [random_feeds(plan.inputs, seed=k) for k in range(4)]
    edge = [c.id for c in plan.candidates].index("edge")

    async def main():
        async with EdgeAgent(plan, None, emulate_slowdown=SLOW) as probe:  # E on this machine now
            for k in range(12):  # the median of the last three runs, after its fastest has settled
                await probe.infer(fs[k % 4])
            e_ms = probe.controller.edge_ms()[edge]
        async with CloudService([yolo_plan], listen=("127.0.0.1", 0), http=None, advertise=False) as svc:
            async with LinkEmulator(("127.0.0.1", svc.port), rate_mbps=50, delay_ms=1.2 * e_ms) as emu:
                async with EdgeAgent(plan, f"tcp://127.0.0.1:{emu.port}", emulate_slowdown=SLOW, codec="int8+lz4",
                                     max_inflight=10) as ag:
                    t0 = time.monotonic()
                    out = []
                    fps = 1e3 * frames_per_device_run / e_ms
                    async for r in ag.stream((fs[k % 4] for k in range(10_000)), fps=fps):
                        out.append((time.monotonic() - t0, r))
                        if out[-1][0] > 6.0:
                            break
                    return out, e_ms
    out, e_ms = arun(main(), timeout=90)
    late = [r for t, r in out if t > 2.0 and not r.explore]
    where = [("edge" if r.placement == "edge" else "cloud") for r in late]
    share = where.count(expect) / len(where)
    trail = "".join(p[0] for p in where)
    assert share >= 0.7, (e_ms, trail, [round(r.timings["total_ms"]) for r in late][:8],
                          [{k: round(v) for k, v in r.conditions["predicted_ms"].items()} for r in late][:4],
                          [r.conditions.get("device_wait_ms") for r in late][:4])


def test_the_device_queue_counts_what_is_ahead():
    clock = [0.0]
    dev = Device(max_jobs=2, clock=lambda: clock[0])
    gate = asyncio.Event()

    async def main():
        started = asyncio.Event()

        def slow():
            started.set()
            while not gate.is_set():
                time.sleep(0.001)
            return 1

        a = asyncio.ensure_future(dev.call(slow, 100.0))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(dev.call(lambda: 2, 40.0))
        while dev.jobs < 2 or dev._jobs[0][2] is None:
            await asyncio.sleep(0.001)
        clock[0] += 0.03  # the running job is 30 ms in
        waited = dev.wait_ms()
        room = dev.has_room()
        gate.set()
        return waited, room, await a, await b, dev.jobs
    waited, room, a, b, jobs = asyncio.run(main())
    dev.shutdown()
    assert waited == pytest.approx(70.0 + 40.0)
    assert not room and (a, b, jobs) == (1, 2, 0)


def test_a_hedge_waits_for_a_busy_device_to_be_worth_it(yolo_plan):
    """A late frame on a busy device: the device starts it only when it would finish sooner than
    the cloud is expected to; on an idle fast device at once; on an idle device that would be done
    before the camera's next frame, at once (it delays nobody)."""
    plan = Plan.load(yolo_plan)
    ag = EdgeAgent(plan, "tcp://127.0.0.1:9", warmup=False)
    rc = ag.remote
    assert rc.should_hedge(elapsed_ms=80, network_ms=50, local_ms=5)  # idle, 5 ms away: yes
    assert not rc.should_hedge(elapsed_ms=80, network_ms=50, local_ms=300)  # 300 ms away, 30 ms late: no
    assert rc.should_hedge(elapsed_ms=400, network_ms=50, local_ms=300)  # 350 ms late now: yes
    assert rc.should_hedge(elapsed_ms=2900, network_ms=2800, local_ms=300)  # the deadline: must
    # free: the device idle and done 100 ms before the camera's next frame: at once, though 30 ms late
    assert rc.should_hedge(elapsed_ms=80, network_ms=50, local_ms=300, free_ms=400)
    assert not rc.should_hedge(elapsed_ms=80, network_ms=50, local_ms=300, free_ms=250)  # it would delay the next
    ag.device._jobs[999] = (9.0, 20.0, None)  # a newer frame's edge segment queued: not free any more
    assert not rc.should_hedge(elapsed_ms=80, network_ms=50, local_ms=300, priority=8, free_ms=400)
    ag.device._jobs.clear()
    ag.device._jobs.update({k: (0.0, 500.0, None) for k in range(1000, 1003)})  # a full queue of older frames
    assert not rc.should_hedge(elapsed_ms=400, network_ms=50, local_ms=5, priority=7)
    ag.device._jobs.clear()
    ag.device.shutdown()


def test_the_way_to_the_devices_thread_and_back_is_the_candidates_own_cost(yolo_plan):
    """A frame whose segment runs on the device's thread pays for getting there and back beyond
    the queue ahead of it (a thread woken under a CPU quota: ~20 ms a frame at 0.06 core). That
    is the candidate's own cost, and its prediction learns it: it was taken out with the queue's
    wait, and the split and edge candidates were predicted ~25 ms short of what they took (30
    trace windows), chosen over a cloud that was faster. Here the device's thread starts every
    job 60 ms late, with nothing queued ahead."""
    plan = Plan.load(yolo_plan)
    hop_s = 0.06

    async def main():
        async with EdgeAgent(plan, None) as ag:
            real = ag.device.call

            async def late_thread(fn, expect_ms, priority=math.inf, **kw):
                def late():
                    time.sleep(hop_s)  # not the segment's run: its own time is measured inside fn
                    return fn()
                return await real(late, expect_ms, priority, **kw)

            ag.device.call = late_thread
            return [await ag.infer(random_feeds(plan.inputs, seed=k)) for k in range(10)]
    out = arun(main(), timeout=60)
    assert all(r.candidate == "edge" for r in out)
    tail = out[-4:]
    misses = [r.timings["total_ms"] - r.predicted_ms for r in tail]
    assert all(abs(m) < hop_s * 1e3 / 2 for m in misses), (misses, [r.timings for r in tail])


def test_older_frames_go_first_on_the_device():
    """A late frame's hedge (frame 2) goes ahead of a newer frame's edge segment (frame 5) queued
    before it: results leave in order, so frame 5 would wait for frame 2 anyway."""
    dev = Device(max_jobs=3)
    gate = threading.Event()
    order = []

    async def main():
        running = asyncio.ensure_future(dev.call(lambda: gate.wait(5) and order.append("running"), 50.0, 0))
        while not dev.jobs or dev._jobs[next(iter(dev._jobs))][2] is None:
            await asyncio.sleep(0.001)
        newer = asyncio.ensure_future(dev.call(lambda: order.append(5), 30.0, 5))
        await asyncio.sleep(0.01)
        older = asyncio.ensure_future(dev.call(lambda: order.append(2), 20.0, 2))
        await asyncio.sleep(0.01)
        ahead_of_3 = dev.wait_ms(priority=3)  # the running job and frame 2's, not frame 5's
        gate.set()
        await asyncio.gather(running, newer, older)
        return ahead_of_3
    ahead = asyncio.run(main())
    dev.shutdown()
    assert order == ["running", 2, 5]
    assert 20.0 <= ahead <= 70.0


def test_a_probe_ahead_of_a_frame_moves_that_frame_not_the_standing_choice(yolo_plan):
    """A probe on the uplink delays the next frame sent after it: that frame may go elsewhere, but
    the choice that hysteresis keeps is made without it (one probe used to move the next frames
    onto a device that could not keep up, until its queue showed it)."""
    from splitinfer.edge import Controller
    from splitinfer.splitter import CostModel

    cm = CostModel.from_plan(Plan.load(yolo_plan))
    c = Controller(cm, explore_every_s=1e9)
    edge = cm.ids.index("edge")
    for _ in range(3):
        c.observe_edge(edge, 400.0)  # a slow device: some remote candidate stands
    first = c.choose(1000.0, 30.0, now=0.0)
    standing = first.index
    assert not cm.local[standing]
    pred = first.predictions
    probe_ms = 2 * (pred[edge] - pred[standing])  # a probe that makes the edge the better for one frame
    detour = c.choose(1000.0, 30.0, now=1.0, transient_ms=probe_ms)
    assert detour.index == edge and not detour.explore
    assert c.current == standing  # the standing choice did not move...
    assert c.choose(1000.0, 30.0, now=1.01).index == standing  # ...so the next frame, the probe gone, is its


def test_a_device_that_cannot_keep_the_rate_is_charged_for_as_long_as_a_choice_is_kept(yolo_plan):
    """The backlog a candidate too slow for the frame rate builds is charged over the frames a choice
    is kept at least (the minimum dwell), not a fixed ten: at 37 fps the dwell holds 18 frames."""
    from splitinfer.edge import Controller
    from splitinfer.edge.controller import DeviceLoad
    from splitinfer.splitter import CostModel

    cm = CostModel.from_plan(Plan.load(yolo_plan))
    c = Controller(cm, min_dwell_s=0.5)
    n = len(cm.ids)
    edge = cm.ids.index("edge")
    dev = [0.0] * n
    dev[edge] = 42.0
    pred = [100.0] * n
    fast = c.load_ms(pred, DeviceLoad(0.0, dev, interval_ms=27.0, max_inflight=6))
    slow = c.load_ms(pred, DeviceLoad(0.0, dev, interval_ms=500.0, max_inflight=6))
    assert fast[edge] == pytest.approx((42.0 - 27.0) * (500.0 / 27.0) / 2)
    assert slow[edge] == 0.0  # keeps a 2 fps camera's rate easily
    slower = c.load_ms(pred, DeviceLoad(0.0, dev, interval_ms=40.0, max_inflight=6))
    assert slower[edge] == pytest.approx((42.0 - 40.0) * 12.5 / 2)  # 0.5 s at 40 ms: 12.5 frames
    dev[edge] = 120.0  # at 10 fps the dwell holds 5 frames: the floor, behind_frames, holds
    assert c.load_ms(pred, DeviceLoad(0.0, dev, interval_ms=100.0, max_inflight=6))[edge] == \
        pytest.approx(20.0 * c.behind_frames / 2)


def test_the_frame_rate_is_the_cameras_not_the_callers_pace(yolo_plan):
    """The frame interval the controller plans with comes from pacing (stream(fps=...), or fps=
    given), never from the gaps between calls: a caller that waits for each result sends the next
    frame when the last is done, so those gaps are the agent's own pace (at 20 ms a frame, the
    all-edge candidate's 100 ms was charged ~1 s of a backlog that could never build)."""
    plan = Plan.load(yolo_plan)
    fs = [random_feeds(plan.inputs, seed=k) for k in range(4)]

    async def main():
        async with EdgeAgent(plan, None) as ag:
            looped = [await ag.infer(f) for f in fs]
            paced = [r async for r in ag.stream(fs, fps=50)]
            after = await ag.infer(fs[0])
        async with EdgeAgent(plan, None, fps=8) as told:
            hinted = await told.infer(fs[0])
        return looped, paced, after, hinted
    looped, paced, after, hinted = arun(main(), timeout=60)
    assert all(r.conditions["frame_interval_ms"] is None for r in looped + [after])
    assert all(r.conditions["frame_interval_ms"] == pytest.approx(20.0) for r in paced)
    assert hinted.conditions["frame_interval_ms"] == pytest.approx(125.0)
    with pytest.raises(SplitinferError, match="fps"):
        EdgeAgent(plan, None, fps=0)


def test_a_candidates_device_time_follows_the_device_as_other_segments_time_it(yolo_plan):
    """The whole model timed while the device was stalled (twice its usual time) does not stand as
    its time while frames go to a split cut: the split cut's segment, timed since at the usual
    speed, says the device is fast again, and the whole model's time follows (it stood until the
    next exploration: ~10 s of frames on the slower split cut at 8 fps)."""
    from splitinfer.edge import Controller
    from splitinfer.splitter import CostModel

    cm = CostModel.from_plan(Plan.load(yolo_plan), edge_slowdown=100.0)  # a small device
    c = Controller(cm, explore_every_s=1e9)
    edge = cm.ids.index("edge")
    split = max((i for i in range(len(cm.ids)) if not cm.local[i]), key=lambda i: cm.edge_ms[i])
    assert cm.edge_ms[split] > 0.5  # long enough to time the device
    usual = 3.0  # the device is 3x the profile
    for k in range(3):
        c.observe_edge(edge, usual * cm.edge_ms[edge], now=float(k))
    assert c.edge_ms(now=3.0)[edge] == pytest.approx(usual * cm.edge_ms[edge])
    for k in range(3):
        c.observe_edge(edge, 2 * usual * cm.edge_ms[edge], now=3.0 + k)  # a stall
    stalled = c.edge_ms(now=6.0)[edge]
    assert stalled == pytest.approx(2 * usual * cm.edge_ms[edge])
    for k in range(8):  # the split cut's segment at the usual speed
        c.observe_edge(split, usual * cm.edge_ms[split], now=6.0 + 0.125 * k)
    now = 7.0
    assert c.edge_ms(now=now)[edge] < 0.75 * stalled
    assert c.edge_ms(now=now)[edge] == pytest.approx(usual * cm.edge_ms[edge], rel=0.25)
    assert c.edge_ms(now=now)[split] == pytest.approx(usual * cm.edge_ms[split])  # its own time, unscaled
    # the other way round: the device slowed down while the split cut ran, the whole model's time too
    for k in range(3):
        c.observe_edge(split, 2 * usual * cm.edge_ms[split], now=8.0 + 0.125 * k)
    assert c.edge_ms(now=9.0)[edge] > 1.4 * usual * cm.edge_ms[edge]


def test_a_segment_whose_times_swing_does_not_move_another_candidates_device_time(yolo_plan):
    """Under a CPU quota a segment shorter than the quota's period runs at full speed when the
    period has quota left and waits for the next period when not: its times swing 30x from frame
    to frame, and say nothing of how slow the device is. The whole model's time (steady) is not
    scaled by them (it was predicted at 43-96 ms against ~250 on the demo's 0.06-core device, and
    chosen)."""
    from splitinfer.edge import Controller
    from splitinfer.splitter import CostModel

    cm = CostModel.from_plan(Plan.load(yolo_plan), edge_slowdown=100.0)
    c = Controller(cm, explore_every_s=1e9)
    edge = cm.ids.index("edge")
    split = min((i for i in range(len(cm.ids)) if not cm.local[i] and cm.edge_ms[i] > 0.5),
                key=lambda i: cm.edge_ms[i])
    usual = 3.0
    for k in range(5):
        c.observe_edge(edge, usual * cm.edge_ms[edge] * (1 + 0.02 * (k % 2)), now=float(k))
    steady = c.edge_ms(now=5.0)[edge]
    for k, speed in enumerate([0.1, 3.0] * 6 + [0.1, 3.0, 0.1]):  # full speed, then a period's wait
        c.observe_edge(split, speed * usual * cm.edge_ms[split], now=5.0 + 0.5 * k)
        assert c.edge_ms(now=5.0 + 0.5 * k)[edge] == pytest.approx(steady, rel=0.1), k


def test_a_segment_timed_often_fades_to_its_own_usual_time_in_the_exploration_view(yolo_plan):
    """The exploration's view fades a stale device time; a segment timed often fades to its own
    usual time, not to the profile x a device scale that a short segment's swinging times set
    (on the 0.06-core device the whole model looked ~2x as fast as it ever ran)."""
    from splitinfer.edge import Controller
    from splitinfer.splitter import CostModel

    cm = CostModel.from_plan(Plan.load(yolo_plan), edge_slowdown=100.0)
    c = Controller(cm, explore_every_s=1e9)
    edge = cm.ids.index("edge")
    split = min((i for i in range(len(cm.ids)) if not cm.local[i] and cm.edge_ms[i] > 0.5),
                key=lambda i: cm.edge_ms[i])
    for k in range(c.device.own_usual_after):
        c.observe_edge(edge, 3.0 * cm.edge_ms[edge], now=float(k))
    t = float(c.device.own_usual_after)
    for k in range(20):  # then only the split cut, at the profile's speed: the device's scale falls to ~1
        c.observe_edge(split, cm.edge_ms[split], now=t + 0.5 * k)
    later = t + 60.0  # the whole model's own time long stale
    assert c.edge_ms(now=later, fade=True)[edge] == pytest.approx(3.0 * cm.edge_ms[edge], rel=0.1)
    # timed only a few times (start-up, perhaps in a bad moment): it fades to the device's scale
    c2 = Controller(cm, explore_every_s=1e9)
    for k in range(3):
        c2.observe_edge(edge, 3.0 * cm.edge_ms[edge], now=float(k))
    for k in range(20):
        c2.observe_edge(split, cm.edge_ms[split], now=3.0 + 0.5 * k)
    assert c2.edge_ms(now=70.0, fade=True)[edge] < 2.0 * cm.edge_ms[edge]


def test_a_close_candidate_that_cannot_be_raced_is_explored_for_real():
    """Exploring the whole model is a race with the all-cloud candidate; with frames on a split
    cut there is no race, and the whole model was never explored (its time from two slow runs
    stood for ~10 s of frames at 8 fps). Within the costly candidates' margin it is run for real."""
    from dataclasses import replace

    from splitinfer.edge import Controller
    from splitinfer.edge.controller import Choice
    from splitinfer.splitter import CostModel

    cm = CostModel(ids=("cloud", "b1", "edge"), edge_ms=(0.0, 30.0, 90.0), cloud_ms=(10.0, 8.0, 0.0),
                   up_bytes=(100_000, 2_000, 0), result_bytes=(1_000, 1_000, 0), local=(False, False, True))
    c = Controller(cm)
    close = Choice(2, "edge", 140.0, (150.0, 110.0, 140.0), explore=True, unexplored=1, faded=(150.0, 110.0, 118.0))
    far = replace(close, faded=(150.0, 110.0, 140.0))
    assert c.worth_running(close) and not c.worth_running(far)
    assert not c.worth_running(replace(close, explore=False))


def test_the_whole_model_does_not_take_the_exploration_turn_from_a_split_cut():
    """The whole model is explored by racing it against the all-cloud candidate. Seen as cheap
    from a split cut too, it took the exploration's turn there and was then not explored: the
    all-cloud candidate's turn came 5 s later (a cold start's two slow cloud frames held the
    frames on the slower split cut for ~11 s). From a split cut it is judged as a costly
    candidate, and the all-cloud candidate is explored."""
    from splitinfer.edge import Controller
    from splitinfer.splitter import CostModel

    cm = CostModel(ids=("edge", "b1", "cloud"), edge_ms=(120.0, 30.0, 0.0), cloud_ms=(0.0, 8.0, 10.0),
                   up_bytes=(0, 2_000, 100_000), result_bytes=(0, 1_000, 1_000), local=(True, False, False))

    def explored(cheap):
        c = Controller(cm)
        c.cheap_explore = cheap
        assert c.choose(8.0, 10.0, now=0.0).id == "b1"
        return [ch.id for ch in (c.choose(8.0, 10.0, now=0.5 * k) for k in range(1, 13)) if ch.explore]

    assert explored({0: None, 2: None})[:1] == ["edge"]  # as it was: the whole model's turn, which the agent dropped
    assert explored({0: {2}, 2: None})[:1] == ["cloud"]


def test_a_frames_choice_gathers_the_controllers_evidence_once_per_view(yolo_plan):
    """On a 0.05-core device every ms of the choice's own CPU is ~20 ms of the frame's latency:
    adaptive frames that went to the cloud, as static-cloud ones did, took 12-15 ms longer
    (slow device, 5 and 20 Mbit/s). A frame's predictions (the standing view, the exploration's,
    the prober's faster links, the device's expected times) are all made from one snapshot of
    the evidence per view: the standing one for every frame, the exploration's too for an adaptive
    frame that looks for a candidate to explore (only then: it was ~60 us of every frame's CPU)."""
    from conftest import arun
    from splitinfer.cloud import CloudService
    from splitinfer.edge import EdgeAgent
    from splitinfer.splitter.profiler import random_feeds
    from splitinfer.transport import LinkEmulator

    plan = Plan.load(yolo_plan)

    async def main(candidate):
        async with CloudService([yolo_plan], listen=("127.0.0.1", 0), http=None, advertise=False) as svc:
            async with LinkEmulator(("127.0.0.1", svc.port), rate_mbps=50) as emu:
                async with EdgeAgent(plan, f"tcp://127.0.0.1:{emu.port}", candidate=candidate) as ag:
                    assert ag.connected and ag.link is not None and ag.link.prober is not None
                    views, edge_calls, looks = [], 0, []
                    take, edge_ms, due = ag.controller.evidence, ag.controller.edge_ms, ag.controller.exploration_due

                    def counted(*a, **k):
                        views.append(k.get("fade", a[1] if len(a) > 1 else False))
                        return take(*a, **k)

                    def counted_edge(*a, **k):
                        nonlocal edge_calls
                        edge_calls += 1
                        return edge_ms(*a, **k)

                    def counted_due(now):
                        looks.append(due(now))
                        return looks[-1]

                    ag.controller.evidence, ag.controller.edge_ms = counted, counted_edge
                    ag.controller.exploration_due = counted_due
                    ag.remote.hedge_margin_ms = 5000.0  # no hedge: its own look at the device is not the choice's
                    out = []
                    for k in range(6):
                        if k == 3:  # frames 3-5 look for a candidate to explore, 0-2 do not
                            ag.controller.explore_every_s = 0.0
                        out.append(await ag.infer(random_feeds(plan.inputs, seed=k)))
                    return out, views, edge_calls, looks

    out, views, edge_calls, looks = arun(main(None), timeout=90)
    assert looks == [False] * 3 + [True] * 3, looks
    assert len(out) == 6 and sorted(views) == [False] * 6 + [True] * 3, views
    assert edge_calls == len(views)  # the device's expected times come from the same snapshot
    out, views, edge_calls, looks = arun(main("cloud"), timeout=90)
    assert len(out) == 6 and views == [False] * 6 and edge_calls == len(views), (views, edge_calls)


def _long_model(path, nodes=400, side=256):
    """A chain of ``nodes`` matrix products: long enough at full speed that a stop mid-run shows."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((np.eye(side, dtype=np.float32) * 0.999), "w")
    names = ["x"] + [f"h{k}" for k in range(nodes - 1)] + ["y"]
    graph = helper.make_graph(
        [helper.make_node("MatMul", [names[k], "w"], [names[k + 1]]) for k in range(nodes)], "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [side, side])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_hedge_the_cloud_beat_stops_on_the_device(tmp_path):
    """A run cancelled while it is on the device (a hedge whose cloud reply came first) is stopped
    where it is, not run to the end: the frame behind it starts at once. Without the stop, the
    next job waited for the whole chain (the device is one thread)."""
    import numpy as np

    from splitinfer.edge.runtime import Abort, Aborted, OrtBackend

    path = str(tmp_path / "chain.onnx")
    _long_model(path)
    x = {"x": np.ones((256, 256), np.float32)}
    backend = OrtBackend(path, threads=1)
    backend.run(x)  # warm
    t = time.perf_counter()
    backend.run(x)
    full_s = time.perf_counter() - t

    stopped = Abort()
    stopped()
    with pytest.raises(Aborted):  # stopped before it started: it does not run
        backend.run(x, stopped)

    dev = Device(threads=1)
    dev._backends[path] = backend

    async def main():
        hedge = asyncio.ensure_future(dev.run(path, x, 1e3 * full_s, priority=1))
        while not dev.jobs or dev._jobs[next(iter(dev._jobs))][2] is None:  # on the device now
            await asyncio.sleep(0.001)
        nxt = asyncio.ensure_future(dev.call(lambda: time.perf_counter(), 1.0, priority=2))
        cancelled_at = time.perf_counter()
        hedge.cancel()
        started = await asyncio.wait_for(nxt, timeout=30)
        with pytest.raises(asyncio.CancelledError):
            await hedge
        return started - cancelled_at

    waited_s = asyncio.run(main())
    dev.shutdown()
    # the chain's remaining nodes were skipped: the next job started in a fraction of the run
    assert waited_s < full_s / 3, (waited_s, full_s)
