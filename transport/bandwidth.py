"""Bandwidth and RTT estimation from real transfers.

The estimator follows adaptive-bitrate players (Shaka, dash.js): each throughput sample
(bytes, and the seconds it took from first to last byte at the receiver) feeds two exponentially
weighted moving averages whose weight is the sample's transfer time, one fast and one slow. The
estimate is the minimum of the two (quick to fall, slow to believe a rise), bias-corrected while
little weight has accumulated, times a safety factor. Samples from small frames are left out of
the throughput (their timing is noise) but still give RTT, unless the link spread one over
``min_timed_s`` (then its timing is the link's). A transfer too fast to time (under
``min_sample_s``) is a lower bound, not nothing: the link carried at least its bytes in that
time. So is a probe too small to time at the receiver that came back soon: its bytes crossed within
its round trip less the base RTT (taken at no less than ``min_timed_s``). While no timed sample
says otherwise, the estimate is at least the freshest such bound, so a fast link (loopback, a LAN)
is not left at the prior. The other way round, a small frame that came back late is an upper bound
(:meth:`BandwidthMonitor.add_ceiling`): the link took that long for it, which a 4 KB frame's own
first-to-last byte time does not show; until a timed sample comes, the estimate is at most the
freshest such bound.

Defaults were chosen for the figure in issue 3: after a step from 50 to 5 Mbit/s and back, the
estimate is within ±20% of the real rate within 2 s of saturating traffic
(benchmarks/bandwidth_tracking.py measures it, and the lag on the real traces).

Probing the uplink while no data flows is :mod:`splitinfer.transport.prober`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["BandwidthMonitor", "Ewma", "Taken", "queued_bytes"]

Taken = Literal["sample", "floor"]  # what a transfer told the monitor was taken as (add_transfer)


@dataclass
class Ewma:
    """An EWMA whose samples are weighted by their duration, bias-corrected at start-up.

    Kept as a weighted sum and its total weight, so :meth:`age` can lower the confidence in
    old samples (both scale down, the value stays) and fresh ones take over quickly."""

    half_life_s: float
    _num: float = 0.0
    _den: float = 0.0

    def add(self, value: float, weight_s: float) -> None:
        alpha = 0.5 ** (weight_s / self.half_life_s)
        self._num = alpha * self._num + (1 - alpha) * value
        self._den = alpha * self._den + (1 - alpha)

    def age(self, factor: float) -> None:
        self._num *= factor
        self._den *= factor

    @property
    def value(self) -> float:
        return self._num / self._den if self._den > 0 else math.nan


class BandwidthMonitor:
    """Uplink throughput (Mbit/s) and RTT (ms) from passive samples.

    >>> m = BandwidthMonitor()
    >>> m.add_transfer(1_000_000, 0.8)   # 1 MB took 0.8 s from first to last byte: 10 Mbit/s
    'sample'
    >>> round(m.raw_mbps(), 1)
    10.0
    """

    def __init__(self, *, fast_half_life_s: float = 0.25, slow_half_life_s: float = 0.6, safety: float = 0.9,
                 min_sample_bytes: int = 32 * 1024, min_sample_s: float = 0.002, default_mbps: float = 5.0,
                 stale_after_s: float = 0.5, min_timed_bytes: int = 8 * 1024, min_timed_s: float = 0.02,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fast = Ewma(fast_half_life_s)
        self.slow = Ewma(slow_half_life_s)
        self.safety = safety  # share of the measured rate the estimate promises
        self.min_sample_bytes = min_sample_bytes  # smaller transfers do not count as throughput
        self.min_sample_s = min_sample_s  # nor faster ones: the frame was buffered, not timed on the wire
        # a smaller transfer of at least min_timed_bytes that took min_timed_s is timed all the same:
        # the link, not the timer's noise, spread it (an 18 KB frame at 1.5 Mbit/s takes ~100 ms;
        # left out, the estimate of a link that carried only such frames moved only with the probes)
        self.min_timed_bytes = min_timed_bytes
        self.min_timed_s = min_timed_s
        self.default_mbps = default_mbps  # before the first sample
        self.stale_after_s = stale_after_s  # after this long without samples, old ones lose weight
        self.clock = clock
        self.samples = 0
        self.last_sample_at = -math.inf
        self.floor_ttl_s = 3.0  # a lower bound from a too-fast transfer holds this long unless renewed
        self._floor: tuple[float, float] | None = None  # (Mbit/s, at): the freshest lower bound
        self._ceiling: tuple[float, float] | None = None  # (Mbit/s, at): the freshest upper bound
        # an upper bound holds this long unless a timed sample comes first: while frames avoid a
        # slow link nothing else renews it, and each expiry costs a late frame; a link that
        # recovers is found by the next probe (every max_interval_s at most), whose timed sample
        # ends the bound
        self.ceiling_ttl_s = 10.0
        self._srtt: float | None = None
        # (time, ms) of the RTTs of the last 10 s that no later one undercuts: increasing in ms, so
        # the first is the window's minimum (read every frame, in O(1))
        self._rtts: deque[tuple[float, float]] = deque()

    # ------------------------------------------------------------------ samples
    def add_transfer(self, nbytes: int, seconds: float, at: float | None = None) -> Taken | None:
        """A transfer of ``nbytes`` that took ``seconds`` first to last byte; what it was taken as:
        ``"sample"``, ``"floor"``, or None (ignored).

        One faster than ``min_sample_s`` is a lower bound (its bytes in ``min_sample_s``): the
        estimate is at least that until a timed sample comes or the bound is ``floor_ttl_s`` old.
        One smaller than ``min_sample_bytes`` counts only if it is at least ``min_timed_bytes`` and
        took at least ``min_timed_s``."""
        if nbytes < self.min_sample_bytes and not (nbytes >= self.min_timed_bytes and seconds >= self.min_timed_s):
            return None
        now = self.clock() if at is None else at
        if seconds < self.min_sample_s:
            self.add_floor(nbytes * 8 / self.min_sample_s / 1e6, now)
            return "floor"
        self._floor = self._ceiling = None  # a timed transfer is what the link does now
        mbps = nbytes * 8 / seconds / 1e6
        gap = now - self.last_sample_at
        if self.samples and gap > self.stale_after_s:
            # halve the old samples' weight for every stale_after_s of silence beyond the first
            factor = 0.5 ** ((gap - self.stale_after_s) / self.stale_after_s)
            self.fast.age(factor)
            self.slow.age(factor)
        self.fast.add(mbps, seconds)
        self.slow.add(mbps, seconds)
        self.samples += 1
        self.last_sample_at = now
        return "sample"

    def add_floor(self, mbps: float, at: float | None = None) -> None:
        """The link carried at least ``mbps`` lately (a transfer too fast to time, or a probe that
        came back sooner than its bytes could have crossed a slower link): until a timed sample
        comes, or the bound is ``floor_ttl_s`` old, the estimate is at least that."""
        if not (mbps > 0 and math.isfinite(mbps)):
            return
        now = self.clock() if at is None else at
        if self._floor is None or now - self._floor[1] > self.floor_ttl_s or mbps >= self._floor[0]:
            self._floor = (mbps, now)
        else:  # a smaller bound renews the larger one's freshness: both say the link is fast
            self._floor = (self._floor[0], now)

    def add_ceiling(self, mbps: float, at: float | None = None) -> None:
        """The link carried at most ``mbps`` lately: a frame too small to be a throughput sample
        came back later than the estimate allowed, and its bytes took this long to arrive (a
        burst can make a small transfer look faster than the link, never slower). Until a timed
        sample comes, or the bound is ``ceiling_ttl_s`` old, the estimate is at most that (at
        0.2 Mbit/s, 4 KB frames were otherwise sent to the cloud again as soon as each late reply
        landed, the estimate still at the 50 Mbit/s from before the fall)."""
        if not (mbps > 0 and math.isfinite(mbps)):
            return
        self._ceiling = (mbps, self.clock() if at is None else at)

    def add_rtt(self, rtt_ms: float, at: float | None = None) -> None:
        if rtt_ms < 0 or not math.isfinite(rtt_ms):
            return
        now = self.clock() if at is None else at
        self._srtt = rtt_ms if self._srtt is None else 0.875 * self._srtt + 0.125 * rtt_ms  # RFC 6298 alpha
        rtts = self._rtts
        while rtts and rtts[-1][1] >= rtt_ms:  # never the minimum again while this one is in the window
            rtts.pop()
        rtts.append((now, rtt_ms))
        while rtts[0][0] < now - 10.0:
            rtts.popleft()

    # ------------------------------------------------------------------ estimates
    def raw_mbps(self) -> float:
        """min(fast, slow), bias-corrected, before the safety factor; at least a fresh lower bound
        and at most a fresh upper bound. Before the first timed sample, the prior raised by the
        last lower bound, however old: a bound that expired still says more than the prior did (on
        loopback nothing is slow enough to time, and every 3 s the estimate fell from the last
        probe's 150-8400 Mbit/s back to the 5 Mbit/s prior: the fast device then took the 1.5 KB
        b1 cut over the all-cloud candidate for 21 of 240 frames, adaptive/cloud 1.16, 4edcbe0)."""
        ewma = self.default_mbps if self.samples == 0 else min(self.fast.value, self.slow.value)
        bound = self._floor[0] if self._floor is not None and self.samples == 0 else self.lower_bound_mbps()
        est = max(ewma, bound) if bound is not None else ewma
        if self._ceiling is not None and self.clock() - self._ceiling[1] <= self.ceiling_ttl_s:
            est = min(est, self._ceiling[0])
        return est

    def lower_bound_mbps(self) -> float | None:
        """The freshest bound from transfers too fast to time (None when none holds)."""
        if self._floor is None or self.clock() - self._floor[1] > self.floor_ttl_s:
            return None
        return self._floor[0]

    def estimate_mbps(self) -> float:
        """What the cost model should assume the uplink carries now."""
        return self.raw_mbps() * self.safety

    def rtt_ms(self) -> float:
        """Smoothed RTT (ms); 0 before any sample."""
        return self._srtt or 0.0

    def min_rtt_ms(self) -> float:
        """The smallest RTT of the last 10 s (ms): the base RTT; the smoothed RTT before any."""
        return self._rtts[0][1] if self._rtts else self.rtt_ms()

    def idle_s(self) -> float:
        """Seconds since the last throughput sample (a lower bound counts)."""
        last = max(self.last_sample_at, self._floor[1] if self._floor is not None else -math.inf)
        return self.clock() - last


def queued_bytes(sends: Iterable[tuple[float, int]], mbps: float) -> float:
    """Bytes still ahead on an uplink of ``mbps``: ``sends`` are (seconds ago, bytes) of what was
    written and not yet answered. The link drains them first in, first out, at its rate: bytes
    sent long enough ago are through even while their answers are still on the way back (counting
    them until the answer came made an idle link look busy for a whole RTT)."""
    rate = max(mbps, 1e-6) * 1e6 / 8  # bytes per second
    queue, last = 0.0, None
    for ago, n in sorted(sends, key=lambda s: -s[0]):  # oldest first
        if last is not None:
            queue = max(queue - rate * (last - ago), 0.0)
        queue, last = queue + n, ago
    if last is not None:
        queue = max(queue - rate * max(last, 0.0), 0.0)
    return queue
