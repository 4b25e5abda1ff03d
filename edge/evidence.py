"""The controller's evidence: small statistics over measurements that age.

Each kind of measurement the controller keeps (a device time, the cloud's reports, a candidate's
overhead and residual) needs a different notion of "recent": over a count of frames, over time, or
over the run of frames a candidate was last measured in. They live here, apart from the choice
that uses them (:mod:`splitinfer.edge.controller`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["Ewma", "TimedEwma", "RecentMedian", "Runs", "quantile", "lower_quartile", "median"]


class Ewma:
    def __init__(self, alpha: float) -> None:
        self.alpha, self.value = alpha, math.nan

    def add(self, x: float) -> None:
        self.value = x if math.isnan(self.value) else (1 - self.alpha) * self.value + self.alpha * x


class TimedEwma:
    """An average that forgets by time, not by count: a sample ``dt`` seconds after the last one
    weighs ``1 - exp(-dt / tau_s)`` (at least ``floor``). A candidate measured every frame is
    smoothed over about ``tau_s``; one measured again after a pause (an exploration every few
    seconds) is judged by that new measurement, not by what it did before the pause (a cold
    start, a burst of load that has passed). Unrefreshed, it fades back to the caller's prior:
    ``hold_s`` after its last sample, with time constant ``fade_s`` (:meth:`at`)."""

    def __init__(self, tau_s: float, floor: float = 0.05, hold_s: float = 1.0, fade_s: float = 3.0) -> None:
        self.tau_s, self.floor, self.hold_s, self.fade_s = tau_s, floor, hold_s, fade_s
        self.value, self._at = math.nan, -math.inf

    def add(self, x: float, now: float) -> None:
        if math.isnan(self.value):
            self.value = x
        else:
            w = max(1.0 - math.exp(-max(now - self._at, 0.0) / self.tau_s), self.floor)
            self.value += w * (x - self.value)
        self._at = now

    def at(self, now: float, prior: float) -> float:
        """The estimate at ``now``: ``prior`` until measured; a measurement not refreshed for more
        than ``hold_s`` fades towards ``prior`` (what the cloud did a while ago says little of now)."""
        if math.isnan(self.value):
            return prior
        idle = now - self._at - self.hold_s
        if idle <= 0:
            return self.value
        return prior + (self.value - prior) * math.exp(-idle / self.fade_s)


class RecentMedian:
    """The median of the last ``n`` samples: one frame that met a busy machine does not move it."""

    def __init__(self, n: int = 5, gap_s: float = math.inf) -> None:
        self._xs: deque[float] = deque(maxlen=n)
        self.gap_s = gap_s  # a sample after a pause this long starts over (see Runs)
        self.at = -math.inf  # when the last sample came
        self._value = math.nan  # the median, kept (it is read many times between samples)

    def add(self, x: float, now: float | None = None, upper_bound: bool = False) -> bool:
        """One sample; ``upper_bound`` as in :meth:`Runs.add`. Whether it was taken."""
        now = time.monotonic() if now is None else now
        if upper_bound:
            if math.isnan(self.value) or x >= self.value:
                return False
            self._xs.clear()
        elif now - self.at >= self.gap_s:
            self._xs.clear()
        self._xs.append(x)
        self.at = now
        self._value = median(self._xs)
        return True

    @property
    def value(self) -> float:
        return self._value


class Runs:
    """A candidate's recent samples of one kind (its overhead, its residual) as ``(time, ms)``.

    Evidence belongs to the run of frames that made it: a candidate measured again after a pause
    of ``gap_s`` or more (an exploration, a race, a return to it) starts a new run and the old
    samples are dropped — what it did before the pause (a cold start, a stalled device) says
    little of now, and one fresh frame is then enough. Within a run, at least ``min_n`` samples
    make a value, so one odd frame does not, and the samples within ``window_s`` of the run's last
    one count. The standing view (:meth:`value`) keeps a run's evidence until the candidate is
    measured again: a candidate the model flatters (a split cut whose device and decode costs it
    underrates) is not chosen again, unmeasured, on the model alone once its evidence ages (at
    loopback it was, every ~10 s, for two frames 40-50 ms slower each). Exploration's view
    (``fade``) drops samples older than ``window_s`` and weighs a candidate's first run, not
    refreshed for ``hold_s``, less and less (time constant ``fade_s``): bad news from the start
    (cold code paths, a stream and its peers starting at once) never rules a candidate out of
    being measured again, and older news lets it be looked at again by one frame."""

    def __init__(self, stat: Callable[[list[float]], float], *, window_s: float = 10.0, gap_s: float = 2.5,
                 min_n: int = 2, hold_s: float = 1.0, fade_s: float = 3.0) -> None:
        self.stat, self.window_s, self.gap_s, self.min_n = stat, window_s, gap_s, min_n
        self.hold_s, self.fade_s = hold_s, fade_s
        self._xs: deque[tuple[float, float]] = deque(maxlen=9)
        self._fresh = False  # the current run restarted after a pause: one sample is enough
        self._standing: tuple[float | None] | None = None  # value() kept until the next sample

    def add(self, ms: float, now: float, upper_bound: bool = False) -> None:
        """One sample. ``upper_bound``: the frame shared the device with other work (a race), so
        the candidate alone takes at most this long: it replaces evidence that says more, and is
        ignored otherwise (taken as it is, one slowed race would hold a candidate off)."""
        if upper_bound:
            v = self.value(now)
            if v is None or ms >= v:
                return
            self._xs.clear()
            self._fresh = True
        elif self._xs and now - self._xs[-1][0] >= self.gap_s:
            self._xs.clear()
            self._fresh = True
        self._xs.append((now, ms))
        self._standing = None

    def value(self, now: float, fade: bool = False) -> float | None:
        """The statistic over the current run's samples (None: not enough of them); ``fade``:
        exploration's view (see the class)."""
        if not self._xs:
            return None
        if not fade and self._standing is not None:  # the standing view depends on the samples alone
            return self._standing[0]
        ref = now if fade else self._xs[-1][0]
        recent = [ms for at, ms in self._xs if ref - at <= self.window_s]
        if not recent or len(recent) < (1 if self._fresh else self.min_n):
            if not fade:
                self._standing = (None,)
            return None
        v = self.stat(recent)
        if not fade:
            self._standing = (v,)
        idle = now - self._xs[-1][0] - self.hold_s
        if fade and idle > 0 and not self._fresh:
            v *= math.exp(-idle / self.fade_s)
        return v


def quantile(xs: Sequence[float], q: float) -> float:
    """numpy's default (linear) quantile, in plain Python: called for every candidate on every
    frame with a handful of samples, where numpy's per-call cost is most of the work (the
    controller's choice took ~2.4 ms a frame on a 0.17-core device, ~1.5 % of a cloud frame)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def lower_quartile(xs: list[float]) -> float:
    return quantile(xs, 0.25)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)
