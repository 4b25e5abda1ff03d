"""Active probing of the uplink: padded pings while no data flows (:class:`ActiveProber`).

:class:`ActiveProber` sends padded pings when no data has flowed for a while, so an all-edge
period still notices the bandwidth coming back. Probes cost the camera's data plan and, on a slow
link, the link itself, so they are sent for what they can change: while the caller says a higher
rate would change what it does (``want_more``), probe traffic is at most a share of the estimated
rate, ramps included; otherwise one probe every ``max_interval_s`` keeps the estimate from going
stale and finds a link that came back (an all-edge agent on a 1 Mbit/s link sent a 48 KB probe
every 2 s, 20 % of the link and ~2 GB a day, with nothing to gain from it). A ramp is how a faster
link is found, as TCP slow start and BBR's startup do: back-to-back probes, each twice the last,
until the measured rate stops growing (less than 25 % over two rounds), a probe takes
``probe_ms`` to cross (it timed the link itself) or the largest probe is reached; then it rests
until its bytes are within the share, and at least ``ramp_every_s``. A link slow enough for a
probe to time is not ramped on, by the last probe or by the estimate (frames timed since). Until the caller's first word, one ramp measures a new link and
then the probes are as if a faster link would not matter. When the estimate falls below
``fall_ratio`` of its highest in the last ``recall_s`` (a late frame's ceiling, a probe caught in
a stall) and a faster link would matter, recovery probes go ``recovery_s`` after the fall, then
twice as far apart each time, whatever the share or budget: most such falls are a mobile link's outage of a second or two, and
the budget alone (a tenth of what the frames would send: a 48 KB probe every ~160 s beside a 1.5 KB
bottleneck) left an agent on the device for 5-10 s after the link came back, on every outage of
a trace (demo detector, ATT-LTE-driving-2016: ~18 ms a frame of its 198). A fall that stays costs
~3-4 probes before it is the estimate ``recall_s`` remembers.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable

from .bandwidth import BandwidthMonitor
from .wire import Ping, Pong

__all__ = ["ActiveProber"]


class ActiveProber:
    """Probe the uplink with padded pings while no data flows.

    ``send`` sends a :class:`Ping`; the caller routes the peer's :class:`Pong` to
    :meth:`on_pong`. A probe goes out when the monitor has had no throughput sample for
    ``idle_s``; it carries ``probe_ms`` worth of the estimated rate (at least
    :meth:`floor_bytes`: ``min_probe_bytes``, the monitor's smallest bulk sample and a margin, or
    on a link slower than that in ``probe_ms`` the rate's ``probe_ms``, down to the monitor's
    ``min_timed_bytes``). While
    ``want_more`` (the caller's word that a faster link would change its choice), probes are spaced
    so they use at most ``share`` of the estimated rate, and at most ``budget_bps`` when the caller
    sets one; otherwise, and where the share or the budget would space them further apart, one
    goes every ``max_interval_s`` (a dead or slow link is retried, a recovered one found), of
    the floor only while a faster link would not matter. A ramp (probes doubling up to
    ``max_probe_bytes``) starts and goes on only while ``busy`` (if given) says none of the
    caller's requests is waiting for an answer; meanwhile a steady probe is of the floor."""

    def __init__(self, monitor: BandwidthMonitor, send: Callable[[Ping], Awaitable[object]], *,
                 idle_s: float = 0.5, probe_ms: float = 60.0, share: float = 0.1,
                 min_probe_bytes: int = 48 * 1024, max_probe_bytes: int = 2 << 20,
                 max_interval_s: float = 10.0, ramp_every_s: float = 10.0,
                 busy: Callable[[], bool] | None = None) -> None:
        self.monitor, self.send = monitor, send
        # the caller's word that its own data is on the link now (requests not yet answered): a
        # ramp waits for it to clear, and a steady probe is of min_probe_bytes meanwhile, instead
        # of 2 MB beside those requests
        self.busy = busy
        self.idle_s, self.probe_ms, self.share = idle_s, probe_ms, share
        self.min_probe_bytes, self.max_probe_bytes = min_probe_bytes, max_probe_bytes
        self.max_interval_s = max_interval_s
        self.sent = 0
        self.sent_bytes = 0
        self._seq = 0
        self._last_probe = -math.inf
        self._inflight: dict[int, tuple[float, int]] = {}  # seq -> (sent at, bytes)
        # the last probes, answered or not: [sent at, bytes, answered at (None: not yet)] (see recent_sends)
        self._history: deque[list[float | None]] = deque(maxlen=16)
        self.last_probe_mbps = 0.0
        self._last_pong_at = -math.inf  # when the last probe's answer was taken as a sample
        self.last_probe_s = 0.0  # how long the last answered probe took to cross (0: none yet)
        # the ramp (slow start): on while the caller says a higher rate would matter; until it
        # says anything, one ramp measures a new link at once and then the probes wait for its word
        self._want_more: bool | None = None
        # the caller's cap on the probes' average bytes/s below the share of the rate (None: none);
        # an edge agent's is a share of what sending its frames to the cloud would cost
        self.budget_bps: float | None = None
        self.ramp_every_s = ramp_every_s  # rest between ramps that found the link's rate
        self.ramps = 0  # ramps finished
        self._ramp_size = 0  # the ramp's next probe size (0: not ramping)
        self._ramp_best = 0.0  # the best rate this ramp measured
        self._ramp_stalls = 0  # rounds without 25 % growth
        self._ramp_rest_until = -math.inf
        self._debt = 0.0  # probe bytes not yet covered by the share of the rate (see _repay)
        self._debt_at = 0.0
        # recovery from a fall (see the module's docstring)
        self.fall_ratio, self.recall_s, self.recovery_s = 0.25, 10.0, 1.0
        self._highs: deque[tuple[float, float]] = deque()  # (at, Mbit/s): the estimate's maxima, recall_s
        self._fell_at: float | None = None
        self._recoveries = 0  # recovery probes sent since the fall
        self.recovery_probes = 0  # in all
        # what each answered probe said, for logs (see take_answered): bounded, whoever reads it
        self._answered: deque[dict[str, float | int | str]] = deque(maxlen=32)

    @property
    def want_more(self) -> bool:
        """The caller's word that a faster link would change its choice. Before any word, True for
        the first ramp only: an agent connected before its first frame (a benchmark's pre-roll, a
        camera not yet streaming) had, after that ramp, 2 MB steady probes every 0.5 s on loopback,
        ~12 MB before its first frame, and another ramp every ``ramp_every_s``."""
        return self.ramps == 0 if self._want_more is None else self._want_more

    @want_more.setter
    def want_more(self, value: bool) -> None:
        self._want_more = bool(value)

    def rate_bound_mbps(self, now: float | None = None, rtt_ms: float = 0.0) -> float:
        """What unanswered probes say: a probe of n bytes sent t seconds ago and not yet answered
        means the link carried less than n bytes in t seconds, less the base RTT ``rtt_ms`` that its
        answer needs anyway (inf when none is outstanding, or none is overdue yet). At start-up,
        before any sample, this is all there is to know of a dead link."""
        now = self.monitor.clock() if now is None else now
        bounds = [n * 8 / max(now - at - rtt_ms / 1e3, 1e-3) / 1e6 for at, n in self._inflight.values()
                  if now - at > rtt_ms / 1e3]
        return min(bounds, default=math.inf)

    def sends_in_flight(self, now: float | None = None) -> list[tuple[float, int]]:
        """(seconds since sent, bytes) of each probe not yet answered: see :func:`queued_bytes`."""
        now = self.monitor.clock() if now is None else now
        return [(now - at, n) for at, n in self._inflight.values()]

    def recent_sends(self, now: float | None = None) -> list[tuple[float, int, float | None]]:
        """(seconds since sent, bytes, seconds since answered or None) of the last probes: what
        else was on the uplink while a frame waited (see ``RemoteCall.rate_bound_mbps``)."""
        now = self.monitor.clock() if now is None else now
        return [(now - at, int(n), None if done is None else now - done)  # type: ignore[operator]
                for at, n, done in self._history]

    def take_answered(self) -> list[dict[str, float | int | str]]:
        """The probes answered since the last call (at most the last 32), oldest first, each as
        ``bytes``, ``recv_ms`` (first to last byte at the peer), ``round_trip_ms``, ``mbps`` (what
        it told the monitor; 0 when ignored), ``taken`` as: ``sample`` (a timed throughput
        sample), ``floor`` (too fast to time: a lower bound), ``bound`` (too small to time, its
        round trip a lower bound) or ``ignored``, and ``estimate_mbps`` (the monitor's estimate
        after it). For the agent's per-frame conditions: without them an estimate that sat still
        could not be told from probes that said nothing."""
        out = list(self._answered)
        self._answered.clear()
        return out

    def _rate_bps(self) -> float:
        # a probe that measured more than the (smoothed) estimate sizes the next one: probe up fast;
        # not once frames were timed after it (the link fell since: a 20 Mbit/s probe's rate sized
        # a 150 KB probe on the demo's 1.5 Mbit/s stretch, 0.8 s ahead of the next frame)
        if self.monitor.last_sample_at > self._last_pong_at:
            return self.monitor.raw_mbps() * 1e6 / 8
        return max(self.monitor.raw_mbps(), self.last_probe_mbps) * 1e6 / 8

    def floor_bytes(self) -> int:
        """The smallest probe: ``min_probe_bytes``, or where the estimate says that takes longer
        than ``probe_ms``, the rate's ``probe_ms`` (at least the monitor's ``min_timed_bytes``),
        which the monitor times all the same: a 48 KB probe holds the frame behind it 260 ms at
        1.5 Mbit/s, 650 ms at 0.6, where an 11 KB one takes 60 ms (a link that got faster makes it
        too quick to time: its rate sizes the next probe, see ``_rate_bps``)."""
        bps = self.monitor.raw_mbps() * 1e6 / 8
        return int(min(self.min_probe_bytes, max(self.monitor.min_timed_bytes, bps * self.probe_ms / 1e3)))

    def probe_size(self) -> int:
        bps = self._rate_bps()
        return int(min(self.max_probe_bytes, max(self.floor_bytes(), bps * self.probe_ms / 1e3)))

    def _repay(self, now: float) -> float:
        """The probes' bytes not yet covered by ``share`` of the estimated rate (or ``budget_bps``
        where that is less) since they were sent."""
        bps = self.share * max(self._rate_bps(), 1.0)
        if self.budget_bps is not None:
            bps = max(min(bps, self.budget_bps), 1.0)
        self._debt = max(0.0, self._debt - bps * max(now - self._debt_at, 0.0))
        self._debt_at = now
        return self._debt

    @property
    def ramping(self) -> bool:
        return self._ramp_size > 0

    def _ramp_round(self, mbps: float, now: float) -> None:
        """One ramp probe answered: grow, or stop when the rate stopped growing."""
        if mbps >= 1.25 * self._ramp_best:
            self._ramp_best, self._ramp_stalls = mbps, 0
        else:
            self._ramp_stalls += 1
        timed = self.last_probe_s >= self.probe_ms / 1e3  # a probe this long measured the link itself
        if self._ramp_stalls >= 2 or self._ramp_size >= self.max_probe_bytes or not self.want_more or timed:
            self._end_ramp(now)
        else:
            self._ramp_size = min(self._ramp_size * 2, self.max_probe_bytes)

    def _end_ramp(self, now: float) -> None:
        self._ramp_size = 0
        self.ramps += 1
        self._ramp_rest_until = now + self.ramp_every_s

    def _busy(self) -> bool:
        return self.busy is not None and self.busy()

    def _fallen(self, now: float) -> bool:
        """Whether the estimate is below ``fall_ratio`` of its highest in the last ``recall_s``
        (and since when: ``_fell_at``)."""
        est = self.monitor.raw_mbps()
        highs = self._highs
        while highs and now - highs[0][0] > self.recall_s:
            highs.popleft()
        while highs and highs[-1][1] <= est:
            highs.pop()
        highs.append((now, est))
        if est < self.fall_ratio * highs[0][1]:
            if self._fell_at is None:
                self._fell_at, self._recoveries = now, 0
            return True
        self._fell_at = None
        return False

    def due(self, now: float) -> bool:
        """Whether a probe goes now. Ramp probes go back to back; a ramp starts, and a steady
        probe goes while a faster link would matter, only once the probes' bytes so far are within
        ``share`` of the rate or ``budget_bps`` (a ramp to 100 Mbit/s, ~1.5 MB, is ~1.2 s of a 10 %
        share); a recovery probe after a fall (see the module's docstring); whatever else holds,
        one goes every ``max_interval_s`` on an idle link."""
        fallen = self._fallen(now)  # (kept up to date every tick)
        if self._inflight:
            return False
        busy = self._busy()
        if self.ramping:
            if not busy:
                return True
            if now - self._last_probe < self.max_interval_s:
                return False
            # held off that long, the caller's requests keep the link busy (and time it): the ramp
            # ends, and the steady rules below hold (a dead link is still retried)
            self._end_ramp(now)
        if fallen and self.want_more and self._fell_at is not None and self.monitor.idle_s() >= self.idle_s \
                and now - max(self._fell_at, self._last_probe) >= self.recovery_s * 2 ** self._recoveries:
            self._recoveries += 1
            self.recovery_probes += 1
            return True
        paid = self._repay(now) <= 0.0
        # a ramp is for a link too fast for a probe to time (the last one crossed in under probe_ms):
        # on a slow link it measured nothing a steady probe does not, at 7x the bytes, and its debt
        # held the steady probes off for ~30 s at 0.8 Mbit/s while the call was close
        # (and the estimate agrees: frames timed since the last probe can say the link fell to where
        # a probe would time it; a 48 KB ramp probe at 1.5 Mbit/s held the frame behind it 260 ms)
        fast = self.last_probe_s < self.probe_ms / 1e3 and (
            self.monitor.samples == 0  # (the prior is no measurement: a new link is ramped on)
            or self.floor_bytes() == self.min_probe_bytes)  # (a slower link's floor is under it)
        if paid and fast and self.want_more and now >= self._ramp_rest_until and not busy:
            self._ramp_size, self._ramp_best, self._ramp_stalls = self.min_probe_bytes, 0.0, 0
            return True
        if self.monitor.idle_s() < self.idle_s:
            return False
        since = now - self._last_probe
        return since >= self.max_interval_s or (self.want_more and paid and since >= self.idle_s)

    async def probe(self) -> None:
        now = self.monitor.clock()
        self._seq += 1
        # while a faster link would not matter, a probe need only find a slower one (or a dead
        # one): the smallest size the monitor times does that (on loopback the full size, 2 MB
        # every max_interval_s, was ~300 KB of uplink a frame beside the frames' own)
        size = (self._ramp_size if self.ramping else self.probe_size() if self.want_more and not self._busy()
                else self.floor_bytes())
        self._repay(now)
        self._debt += size
        self._last_probe = now
        self._inflight[self._seq] = (now, size)
        self._history.append([now, size, None])
        self.sent += 1
        self.sent_bytes += size
        await self.send(Ping(self._seq, now, padding=size))

    def on_pong(self, pong: Pong) -> None:
        now = self.monitor.clock()
        sent = self._inflight.pop(pong.seq, None)
        ours = sent is not None  # (else one given up on: still a measurement)
        for h in self._history:
            if sent is not None and h[0] == sent[0] and h[2] is None:
                h[2] = now
        # a probe too fast to time measured at least its bytes in the monitor's shortest timed sample
        seconds = max(pong.recv_ms / 1e3, self.monitor.min_sample_s)
        self.last_probe_mbps = pong.nbytes * 8 / seconds / 1e6
        self.last_probe_s = pong.recv_ms / 1e3
        taken: str | None = self.monitor.add_transfer(pong.nbytes, pong.recv_ms / 1e3)
        self._last_pong_at = self.monitor.last_sample_at
        self.monitor.add_rtt((now - pong.sent_at) * 1e3 - pong.recv_ms)
        told = self.last_probe_mbps if taken else 0.0
        if not taken and pong.nbytes >= self.monitor.min_timed_bytes:
            # a probe too small to time at the receiver (an 8 KB floor probe crosses a 3-6 Mbit/s
            # link in 11-22 ms) still came back within (elapsed - base RTT) of its send: its bytes
            # crossed at least that fast (a burst or a queue only make that time longer). Taken at
            # no less than min_timed_s. Ignored, it left an agent on a 1.5 KB bottleneck cut for
            # ~19 s with the estimate at 0.15 Mbit/s while the cloud took ~150 ms a frame
            # (orange-4G-highway@341s, slow device, 833a4c9's full records)
            crossing_s = max((now - pong.sent_at) - self.monitor.min_rtt_ms() / 1e3, self.monitor.min_timed_s)
            taken, told = "bound", pong.nbytes * 8 / crossing_s / 1e6
            self.monitor.add_floor(told, now)
        self._answered.append({"bytes": int(pong.nbytes), "recv_ms": round(pong.recv_ms, 2),
                               "round_trip_ms": round((now - pong.sent_at) * 1e3, 2),
                               "mbps": round(told, 3), "taken": taken or "ignored",
                               "estimate_mbps": round(self.monitor.raw_mbps(), 3)})
        if ours and self.ramping:
            self._ramp_round(self.last_probe_mbps, now)

    async def run(self, tick_s: float = 0.05) -> None:
        """Probe whenever due, until cancelled. A probe unanswered after ``max_interval_s`` is dropped."""
        while True:
            now = self.monitor.clock()
            for seq, (at, _) in list(self._inflight.items()):
                if now - at > self.max_interval_s * 2:
                    del self._inflight[seq]
                    for h in self._history:  # no longer on the link (see recent_sends)
                        if h[0] == at and h[2] is None:
                            h[2] = now
                    if self.ramping:  # the link did not carry it: the ramp is over
                        self._ramp_stalls = 2
                        self._ramp_round(0.0, now)
            if self.due(now):
                await self.probe()
            await asyncio.sleep(tick_s)
