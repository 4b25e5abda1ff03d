"""How fast the device runs each edge segment now, from its measured times.

A segment's own recent time is the best evidence of what it takes; the device's speed, shared by
everything it runs, moves it between measurements. :class:`DeviceSpeed` keeps, per segment, its
recent times and its usual time, and over all segments the device's scale (measured / profiled)
and its slowness (a steady segment's time against that segment's usual). The controller
(:mod:`splitinfer.edge.controller`) adds encoding and uses the result in every prediction; why
each piece is there is told in docs/architecture.md ("The device's speed").
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from .evidence import Ewma, RecentMedian

__all__ = ["DeviceSpeed", "SegmentTimes", "faded_weight"]


def faded_weight(at: float, now: float, hold_s: float, fade_s: float) -> float:
    """The weight left to evidence from ``at``: 1 for ``hold_s``, then decaying with ``fade_s``."""
    idle = now - at - hold_s
    return 1.0 if idle <= 0 else math.exp(-idle / fade_s)


class SegmentTimes:
    """One segment's times on the device: the median of its last 3 (a time after a pause of
    ``gap_s`` starts over), its usual time over the profile (every sample, slowly averaged), how
    far its times typically stray from that usual (a log ratio), and the device's slowness when
    it was last timed."""

    def __init__(self, profile_ms: float, gap_s: float) -> None:
        self.profile_ms = profile_ms
        self.recent = RecentMedian(3, gap_s=gap_s)
        self.usual = Ewma(0.1)
        self.spread = Ewma(0.1)
        self.n = 0
        self.slowness_then = math.nan

    def steady(self, after: int, spread: float) -> bool:
        """Whether its times hold still enough to say how slow the device is."""
        return self.n >= after and self.spread.value <= spread


class DeviceSpeed:
    """Per segment, its time on the device now; over all segments, the device's scale.

    ``slowness_spread`` / ``slowness_after``: a segment says how slow the device is only once
    timed that often and while its times stray from its usual by at most that (a log ratio);
    ``own_usual_after``: a segment timed that often fades, in the exploration's view, to its own
    usual time rather than to the profile x the device's scale; ``hold_s`` / ``fade_s``: how
    evidence not refreshed fades in that view."""

    def __init__(self, profile_ms: Sequence[float], *, gap_s: float, hold_s: float = 1.0,
                 fade_s: float = 3.0) -> None:
        self.segments = [SegmentTimes(p, gap_s) for p in profile_ms]
        self.hold_s, self.fade_s = hold_s, fade_s
        self.slowness_spread, self.slowness_after = 0.25, 3
        self.own_usual_after = 10
        self._scale = RecentMedian(3)  # measured / profiled, any segment: the median of the last 3
        self._scale_at = -math.inf
        self._scale_long = Ewma(0.1)  # the same, every sample but races', slowly averaged
        self._slowness = RecentMedian(3)
        self._slowness_at = -math.inf

    def observe(self, i: int, ms: float, now: float | None = None, raced: bool = False) -> None:
        """Segment ``i`` took ``ms``. ``raced``: it ran beside other work, an upper bound: taken
        only where it says less than the evidence, and never for the device's scale."""
        seg = self.segments[i]
        if not seg.recent.add(ms, now, upper_bound=raced):
            return
        if not raced and seg.profile_ms > 0.5:  # tiny segments say little about the device's speed
            at, r = seg.recent.at, ms / seg.profile_ms
            self._scale.add(r, at)
            self._scale_long.add(r)
            usual = seg.usual.value
            if not math.isnan(usual) and r > 0 and usual > 0:
                x = r / usual
                steady = seg.steady(self.slowness_after, self.slowness_spread)
                seg.spread.add(abs(math.log(x)))
                if steady:
                    self._slowness.add(x, at)
                    self._slowness_at = at
            seg.usual.add(r)
            seg.n += 1
            self._scale_at = at
        seg.slowness_then = self._slowness.value

    def scale(self) -> float:
        """Measured time / the profile's, over any segment (1 until measured)."""
        return 1.0 if math.isnan(self._scale.value) else self._scale.value

    def times(self, now: float | None = None, fade: bool = False) -> list[float]:
        """Each segment's time now: its own measurement, scaled by the device's slowness now over
        its slowness then; unmeasured, the profile x the device's scale. ``fade``: the
        exploration's view, where a measurement not refreshed fades to the profile x the scale
        (or, for a segment timed ``own_usual_after`` times, to its own usual time), and the scale,
        when nothing has run for a while, to the device's long-run scale."""
        now = time.monotonic() if now is None else now
        g = self.scale()
        if fade:
            g_long = 1.0 if math.isnan(self._scale_long.value) else self._scale_long.value
            g = g_long + (g - g_long) * faded_weight(self._scale_at, now, self.hold_s, self.fade_s)
        s_now = self._slowness.value
        out = []
        for seg in self.segments:
            prior, v = seg.profile_ms * g, seg.recent.value
            if math.isnan(v):
                v = prior
            else:
                if self._slowness_at > seg.recent.at and seg.slowness_then > 0:  # timed since, by a steady segment
                    v *= s_now / seg.slowness_then
                if fade:
                    if seg.n >= self.own_usual_after:  # timed often: its own usual, not the device's
                        prior = seg.profile_ms * seg.usual.value
                    v = prior + (v - prior) * faded_weight(seg.recent.at, now, self.hold_s, self.fade_s)
            out.append(v)
        return out
