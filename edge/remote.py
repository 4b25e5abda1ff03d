"""The hedged remote call: send a frame's cut to the cloud, wait for the reply, and finish the
frame on the device instead when the cloud is late, failing or gone — the first result wins.

When to hedge: a frame waits for the cloud ``hedge_factor`` x its predicted network-and-cloud
time + ``hedge_margin_ms``; from then on the device starts the frame when the hedge is free (the
device is idle and would be done before the camera's next frame is due: it delays no other
frame, and the first result wins), or when it would finish sooner than the cloud is expected to
(a reply already L ms late is expected to take about L more) and its queue has room, or when it
must start to answer within the frame's deadline. A device busy with other frames thus does
not take on a hedge it would finish later than the cloud; an idle one does not sit out a link's
stall (a trace's 1-s outages: waiting until the reply was a device run late made those frames
0.7-1.1 s, where the free hedge has them by ~0.45 s). An exploring frame (``race``) starts on
the device at once, and a device that wins is not the cloud failing; the cloud's reply,
whenever it comes, is measured as usual. A hedge the cloud beat is stopped on the device where it
is: on a small device what was left of it is time the next frames need.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ChannelClosed, ChannelError
from ..splitter.plan import Candidate, Plan
from ..transport import wire
from ..transport.bandwidth import BandwidthMonitor
from ..codecs import Encoded
from .breaker import CircuitBreaker
from .controller import Controller
from .device import Device
from .link import CloudLink, consume
from .replies import BadReply, reply_outputs

__all__ = ["RemoteCall", "RACE_LOST", "DEADLINE_S"]

log = logging.getLogger(__name__)

RACE_LOST = "raced: the device was first"  # an exploring frame the device finished first (not a fault)
DEADLINE_S = 3.0  # the longest a frame waits for the cloud, whatever the prediction
_MIN_WAIT_S = 0.03  # the shortest a frame waits before the device may start on it too
_GIVE_UP_S = 2 * DEADLINE_S  # a frame unanswered this long no longer counts as in flight

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class _Sent:
    """A frame sent to the cloud and not yet answered."""

    at: float  # when it was sent (perf_counter)
    up: int  # its bytes on the uplink
    back: int  # the result's bytes the link is expected to carry back (0: a downlink of its own)
    rest_ms: float  # what its answer needs besides the link: the base RTT, the cloud's queue and compute
    late: bool = False  # the device finished it first: the link is slower than predicted, by how much unknown


@dataclass
class Outcome:
    outputs: Outputs
    sent: int  # bytes put on the wire
    reason: str | None  # None: the cloud answered; else why the frame was finished on the device
    network_ms: float = math.nan  # the cloud answered: from sending the request to its reply (see call)


class RemoteCall:
    """Sends frames to the cloud over ``link`` and hedges them on ``device``."""

    def __init__(self, plan: Plan, link: CloudLink, controller: Controller, monitor: BandwidthMonitor,
                 breaker: CircuitBreaker, device: Device, *, hedge_factor: float = 1.3,
                 hedge_margin_ms: float = 30.0, downlink_mbps: float | None = None) -> None:
        self.plan, self.link, self.controller, self.monitor = plan, link, controller, monitor
        self.breaker, self.device = breaker, device
        self.hedge_factor, self.hedge_margin_ms = hedge_factor, hedge_margin_ms
        # None: results come back over the uplink's rate, as the cost model assumes unless told
        self.downlink_mbps = downlink_mbps
        # sent to the cloud, not yet answered, by request id. A frame the device finished first stays
        # here until its reply (or its failure) lands: its bytes are still on the link, ahead of
        # every later frame, and its silence bounds the link's rate (rate_bound_mbps). A small
        # frame's transfer is no bandwidth sample, so a link that falls under small frames showed
        # nowhere else: at 0.2 Mbit/s, 4 KB frames were hedged 3-12 frames in a row before the
        # estimate, fed only by probes, fell enough (sessions 20-21).
        self._inflight: dict[int, _Sent] = {}
        self.hedges = 0  # hedges started on the device
        self.hedges_declined = 0  # hedge checks where the device would not have been sooner

    @property
    def inflight_bytes(self) -> int:
        """Bytes sent to the cloud and not yet answered."""
        return sum(f.up for f in self._inflight.values())

    def _unanswered(self, now: float) -> list[_Sent]:
        """The frames in flight, less any unanswered for longer than ``_GIVE_UP_S`` (by then the
        cloud has dropped it past its deadline, or the link is down, which the breaker and the
        reconnect handle): those are forgotten."""
        for rid in [r for r, f in self._inflight.items() if now - f.at > _GIVE_UP_S]:
            del self._inflight[rid]
        return sorted(self._inflight.values(), key=lambda f: f.at)

    def sends_in_flight(self) -> list[tuple[float, int]]:
        """(seconds since sent, bytes) of each frame not yet answered (see ``queued_bytes``)."""
        now = time.perf_counter()
        return [(now - f.at, f.up) for f in self._unanswered(now)]

    def rate_bound_mbps(self, now: float | None = None,
                        probes: Sequence[tuple[float, int, float | None]] = ()) -> float:
        """What overdue frames say of the link, as unanswered probes do: since the oldest frame in
        flight was sent, the link carried less than the bytes of the frames still unanswered, their
        results' way back included, once their RTT and cloud time are allowed for (inf while none is
        overdue). A link that drops under frames in flight is noticed while they are still on the
        wire, not when they land. (The results count because the cost model charges them to the
        same link unless told the downlink's rate: a frame waits for both.)

        ``probes``: (seconds since sent, bytes, seconds since answered or None) of the prober's last
        probes. One sent before a frame and not through the link when the oldest frame was sent is
        in that frame's way, its bytes part of what the link had to carry: without them a 1.6 KB
        frame behind a 48 KB probe on a 1 Mbit/s link said 0.14 Mbit/s, and the estimate's fall
        sent recovery probes, each holding the frames behind it again (demo detector, 0.22-core
        device: ~8 ms a frame over the bottleneck candidate pinned)."""
        now = time.perf_counter() if now is None else now
        items = self._unanswered(now)
        if not items:
            return math.inf
        first = items[0].at
        ahead = sorted((now - ago, n) for ago, n, done in probes if done is None or now - done > first)
        total, bound, late, k = 0, math.inf, False, 0
        for f in items:
            while k < len(ahead) and ahead[k][0] <= f.at:  # probes sent before this frame: in its way
                total += ahead[k][1]
                k += 1
            total += f.up + f.back
            late = late or f.late
            waited_s = now - first - f.rest_ms / 1e3
            if waited_s > _MIN_WAIT_S:
                # behind a frame known to be late the link is below the bound by an amount the
                # silence cannot tell: plan with half of it (as TCP halves on a loss); right after
                # a hedge the bound alone is loose (0.2 Mbit/s link, 4 KB up and 3 KB back, the
                # device done in 150 ms: 0.5 Mbit/s), and it rivalled a loaded device's frame
                bound = min(bound, total * 8 / waited_s / 1e6 / (2 if late else 1))
        return bound

    def first_hedge_s(self, network_ms: float) -> float:
        """When a frame first considers the device: its predicted network-and-cloud time with a
        margin, not a fixed long timeout."""
        return min(max((self.hedge_factor * network_ms + self.hedge_margin_ms) / 1e3, _MIN_WAIT_S), DEADLINE_S)

    def should_hedge(self, elapsed_ms: float, network_ms: float, local_ms: float,
                     priority: float = math.inf, free_ms: float = -math.inf) -> bool:
        """Whether the device starts a late frame now: the hedge is free (nothing on the device,
        and ``local_ms`` fits in the ``free_ms`` left before the camera's next frame is due), or
        it would finish sooner than the cloud is expected to, with room in its queue — or it must
        start now to answer by the deadline. ``priority`` is the frame's place in the device's
        queue (its index: older frames first)."""
        if self.device.jobs == 0 and local_ms <= free_ms:
            return True
        finish_ms = self.device.wait_ms(priority) + local_ms
        if elapsed_ms + finish_ms >= DEADLINE_S * 1e3:
            return True
        late_ms = max(elapsed_ms - network_ms, self.hedge_margin_ms)
        return self.device.has_room() and finish_ms < late_ms

    async def call(self, i: int, cand: Candidate, cut: Outputs, encoded: dict[str, Encoded], codec: str,
                   pred_ms: float, timings: dict[str, float], local: Callable[[], Awaitable[Outputs]],
                   local_ms: float, *, race: bool = False, priority: float = math.inf,
                   free_until: float = -math.inf, device_ms: float | None = None) -> Outcome:
        """Send ``encoded`` (the cut, encoded with ``codec``) as candidate ``i`` and wait for the
        cloud, hedging on the device with ``local`` (expected to take ``local_ms``). ``free_until``
        (``time.perf_counter()`` time): when the camera's next frame is due; until then an idle
        device's hedge delays no other frame. ``device_ms``: the part of ``pred_ms`` on the device
        (its edge segment and encoding), when the caller has it."""
        ch = self.link.channel
        if ch is None:
            return Outcome(await local(), 0, self.link.why_not())
        wire_bytes = sum(e.nbytes for e in encoded.values())
        self.controller.observe_bytes(i, wire_bytes)
        device_ms = self.controller.edge_ms()[i] if device_ms is None else device_ms
        network_ms = max(pred_ms - device_ms, 0.0)
        rid, fut = self.link.expect()
        fut.add_done_callback(consume)
        req = wire.InferRequest(rid, self.plan.hash, cand.id, encoded, codec=codec,
                                deadline_ms=DEADLINE_S * 1e3, result_codec="raw")
        sent_at = time.perf_counter()
        sent = False

        async def cloud() -> tuple[wire.Message, float]:
            nonlocal sent
            await ch.send(req)
            sent = True
            reply = await asyncio.shield(fut)  # a late reply still lands in fut (see _late_reply)
            return reply, time.perf_counter()

        remote = asyncio.ensure_future(cloud())
        remote.add_done_callback(consume)
        fallback: asyncio.Future[Outputs] | None = None
        rest_ms = 1.5 * (self.monitor.min_rtt_ms() + self.controller.cloud_ms()[i] + self.controller.queue_ms()) + 30.0
        back = int(self.controller.result_bytes()[i])
        if self.downlink_mbps is not None:  # the result comes back at a rate of its own
            rest_ms, back = rest_ms + back * 8 / (self.downlink_mbps * 1e3), 0
        self._inflight[rid] = _Sent(sent_at, wire_bytes, back, rest_ms)
        fut.add_done_callback(lambda _: self._inflight.pop(rid, None))  # answered, failed or given up on
        reason: str | None = None
        try:
            if race:
                fallback = asyncio.ensure_future(local())
            else:
                wait_s = self.first_hedge_s(network_ms)
                while fallback is None:
                    done, _ = await asyncio.wait({remote}, timeout=wait_s)
                    if done:
                        break
                    elapsed_ms = (time.perf_counter() - sent_at) * 1e3
                    free_ms = (free_until - time.perf_counter()) * 1e3
                    if self.should_hedge(elapsed_ms, network_ms, local_ms, priority, free_ms):
                        fallback = asyncio.ensure_future(local())
                        self.hedges += 1
                    else:
                        self.hedges_declined += 1
                        wait_s = max(min(local_ms, elapsed_ms) / 4e3, 0.01)
            if fallback is not None:
                fallback.add_done_callback(consume)
                done, _ = await asyncio.wait({remote, fallback}, return_when=asyncio.FIRST_COMPLETED)
                if remote not in done:
                    reason = RACE_LOST if race else f"cloud later than {(time.perf_counter() - sent_at) * 1e3:.0f} ms"
            if remote.done() and not remote.cancelled() and remote.exception() is not None:
                exc = remote.exception()
                reason = (f"connection lost: {exc}" if isinstance(exc, (ChannelClosed, ChannelError)) else
                          f"bad reply from the cloud: {exc}" if isinstance(exc, BadReply) else str(exc))
        except BaseException:
            self._inflight.pop(rid, None)
            raise
        if reason == RACE_LOST:
            def measured(task: "asyncio.Future[tuple[wire.Message, float]]") -> None:
                if not task.cancelled() and task.exception() is None:
                    reply, arrived = task.result()
                    if isinstance(reply, wire.Result):
                        self.observe_reply(i, reply, (arrived - sent_at) * 1e3, wire_bytes, {}, raced=True)

            remote.add_done_callback(measured)
            assert fallback is not None
            return Outcome(await fallback, wire_bytes, reason)
        if reason is not None:
            failed = remote.done() and not remote.cancelled() and remote.exception() is not None
            remote.cancel()
            self.breaker.failure(time.monotonic())
            if not failed:
                # the link did not carry this frame in the time the device took: it carries less
                # than that, and at most half the estimate; a reply arriving later says how much
                elapsed_s = max(time.perf_counter() - sent_at, 1e-3)
                rate = min(wire_bytes * 8 / elapsed_s / 1e6, self.monitor.raw_mbps() / 2)
                self.monitor.add_transfer(wire_bytes, wire_bytes * 8 / max(rate, 1e-3) / 1e6)
                fut.add_done_callback(functools.partial(self._late_reply, wire_bytes))
                if rid in self._inflight:
                    self._inflight[rid] = replace(self._inflight[rid], late=True)
            else:
                self.link.forget(rid)
                self._inflight.pop(rid, None)
            out = await (fallback if fallback is not None else local())
            return Outcome(out, wire_bytes if sent else 0, reason)
        reply, arrived = remote.result()
        if isinstance(reply, wire.Error):
            self.breaker.failure(time.monotonic())
            return Outcome(await (fallback or local()), wire_bytes, f"cloud error {reply.code}: {reply.message}")
        assert isinstance(reply, wire.Result)
        try:
            outputs = reply_outputs(self.plan, cand, self.link.postprocessed, reply)
        except (wire.ProtocolError, ValueError) as exc:  # never returned as a cloud result
            self.breaker.failure(time.monotonic())
            log.warning("bad reply from the cloud: %s", exc)
            return Outcome(await (fallback or local()), wire_bytes, f"bad reply from the cloud: {exc}")
        if fallback is not None and not race:
            fallback.cancel()  # not started yet: dropped; running: stopped where it is (Device.run)
        # (racing, the device's run goes on: its time is the measurement the race was for)
        sampled = self.observe_reply(i, reply, (arrived - sent_at) * 1e3, wire_bytes, timings, raced=race)
        # the network's time, where the bandwidth estimate took this transfer as a sample (it has
        # the news if the link fell); a small frame's is not a sample, and stays the candidate's
        network_ms = (arrived - sent_at) * 1e3 if sampled else math.nan
        if self.link.postprocessed:
            return Outcome(outputs, wire_bytes, None, network_ms)  # post-processed by the cloud (e.g. detections)
        return Outcome(cand.finish(cut, outputs, self.plan.output_names), wire_bytes, None, network_ms)

    def observe_reply(self, i: int, reply: wire.Result, elapsed_ms: float, wire_bytes: int,
                      timings: dict[str, float], raced: bool = False) -> bool:
        """What a reply says about the link, the cloud and this candidate (``raced``: the frame
        shared the device with the whole model's run, so its overhead is an upper bound). Whether
        the bandwidth estimate took the transfer as a sample."""
        self.breaker.success()
        tm = reply.timings
        timings["cloud_queue_ms"], timings["cloud_compute_ms"] = tm.queue_ms, tm.compute_ms
        timings["transfer_ms"] = max(elapsed_ms - tm.queue_ms - tm.compute_ms, 0.0)
        timings["batch"] = tm.batch_size
        sampled = self.monitor.add_transfer(wire_bytes, tm.recv_ms / 1e3)
        overhead_ms = max(elapsed_ms - tm.recv_ms - tm.queue_ms - tm.compute_ms, 0.0)
        self.monitor.add_rtt(overhead_ms)
        self.controller.observe_overhead(i, overhead_ms, raced=raced)
        self.controller.observe_cloud(i, tm.compute_ms, tm.queue_ms, tm.batch_size)
        if reply.info is not None:
            self.controller.observe_result(i, reply.info.nbytes)
        return sampled

    def _late_reply(self, nbytes: int, fut: "asyncio.Future[wire.Message]") -> None:
        """A reply for a frame already finished locally: how long the request took to arrive is
        still a real measurement of the link (the only one during an outage), and the cloud
        answered: the hedge the device won counted as a failure when it won (a frozen cloud opens
        the breaker within a few frames), and the answer takes it back (a cloud that is only
        slower than the device is the controller's business, not the breaker's: three hedges in a
        row would otherwise keep every frame off the cloud for the cool-down).

        A transfer too small to be a throughput sample still bounds the link from above when the
        frame was late: its bytes took that long to arrive (a burst can only make it look faster
        than the link), so the link is slower than the estimate said (see ``add_ceiling``). Both
        ways: the request's arrival at the cloud, and the result's here, where results come back
        at the uplink's rate as the cost model assumes (a request sent just before the link fell
        can cross it at once, its result not). A frame held up by a stall arrives in a burst once
        the link is back: no bound."""
        if fut.cancelled() or fut.exception() is not None:
            return
        reply = fut.result()
        if not isinstance(reply, wire.Result):
            return
        self.breaker.success()
        recv_s = reply.timings.recv_ms / 1e3
        if recv_s > 0 and self.monitor.add_transfer(nbytes, recv_s):
            return  # a throughput sample: the estimate has the news
        shortest = self.monitor.min_sample_s
        bounds = [nbytes * 8 / recv_s / 1e6] if recv_s >= shortest else []
        if self.downlink_mbps is None and reply.info is not None and reply.info.seconds >= shortest:
            bounds.append(reply.info.nbytes * 8 / reply.info.seconds / 1e6)
        if bounds:
            self.monitor.add_ceiling(min(bounds))
