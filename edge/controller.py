"""Choosing the cut for each frame.

The plan's cost model predicts every candidate's end-to-end latency from the bandwidth
monitor's estimate and RTT, the edge's own measured segment times (corrections to the profile),
the cloud's reported compute and queue times, and each candidate's measured wire size (codec
ratio). On top of it:

* hysteresis and a minimum dwell time, so the choice does not flap between close candidates
  (an emergency, where the current choice is predicted ``emergency`` times worse than the best,
  switches at once);
* exploration: every ``explore_every_s`` a candidate not used for a while, predicted within
  ``explore_margin`` of the best, is used for one frame to re-measure it (each candidate less
  often while it is not chosen and comes no closer to the choice: up to 4x; ``explore_margin_costly``
  for candidates whose exploration risks the frame: the agent races the all-cloud and all-edge
  candidates, ``cheap_explore``, but not split cuts); a look for one comes at most every
  ``explore_look_s``;
* the cloud's reports (compute, queue) averaged over time, not over a count of frames, so a
  candidate re-measured after a pause is judged by the new measurement; a report not refreshed
  fades back to the profile within seconds (bad news from a cold start does not hold the cloud
  off until the next exploration);
* evidence of runs: a candidate measured again after a pause starts a new run (one fresh frame
  replaces what it did before); exploration judges candidates with stale evidence faded (a
  candidate's first run, device times), so one judged at start-up is measured again within
  seconds, while the standing choice trusts evidence until the candidate is measured again;
* the device's load: the queue ahead of a candidate's device work, and the backlog a candidate
  would build at a frame rate it cannot keep (:meth:`Controller.load_ms`);
* policies: ``latency`` (lowest predicted latency, the default) and ``bytes`` (fewest uplink
  bytes among candidates predicted within ``latency_budget_ms``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..splitter.cost_model import CostModel
from .device_speed import DeviceSpeed
from .evidence import Ewma, Runs, TimedEwma, lower_quartile, median

__all__ = ["Controller", "Choice", "DeviceLoad", "Evidence", "POLICIES"]

POLICIES = ("latency", "bytes")


@dataclass(frozen=True)
class DeviceLoad:
    """What the device is doing, for the prediction: ``wait_ms`` queued on it now; per candidate,
    ``device_ms`` of its work on the device (0 for one that does not use it); the camera's
    ``interval_ms`` between frames (nan: unpaced); ``max_inflight`` frames at once."""

    wait_ms: float
    device_ms: Sequence[float]
    interval_ms: float = math.nan
    max_inflight: int = 2


@dataclass(frozen=True)
class Choice:
    index: int
    id: str
    predicted_ms: float
    predictions: tuple[float, ...]
    explore: bool = False
    unexplored: int | None = None  # what the choice would have been without exploring
    base: tuple[float, ...] = ()  # the model's part of each prediction (see Controller.predict_parts)
    faded: tuple[float, ...] = ()  # each prediction in the exploration's view (stale evidence faded)
    evidence: Evidence | None = None  # what the (standing) predictions were made from


@dataclass(frozen=True)
class Evidence:
    """What the controller knows at ``now``, per candidate, for its predictions: device time
    (segment and encoding), cloud compute, wire/raw byte ratio, result bytes, the measured
    overhead and residual (None: not enough samples), and the cloud's queue. Taken once per
    frame (:meth:`Controller.evidence`) and shared by every prediction made for it, at any
    bandwidth: on a 0.05-core device each ms of the choice's own CPU is ~20 ms of a frame's
    latency. ``fade``: the exploration's view (stale evidence faded)."""

    now: float
    fade: bool
    edge: list[float]
    cloud: list[float]
    ratios: list[float]
    results: list[float]
    overhead: list[float | None]
    residual: list[float | None]
    queue_ms: float


class Controller:
    def __init__(self, cost_model: CostModel, *, policy: str = "latency", latency_budget_ms: float | None = None,
                 hysteresis: float = 0.08, min_dwell_s: float = 0.5, emergency: float = 2.0,
                 explore_every_s: float = 5.0, explore_margin: float = 3.0, alpha: float = 0.3,
                 cloud_tau_s: float = 1.5) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "bytes" and latency_budget_ms is None:
            raise ValueError("the bytes policy needs latency_budget_ms")
        self.cm = cost_model
        self.policy, self.budget = policy, latency_budget_ms
        self.hysteresis, self.min_dwell_s, self.emergency = hysteresis, min_dwell_s, emergency
        self.explore_every_s, self.explore_margin = explore_every_s, explore_margin
        self.explore_margin_costly = 1.1
        # candidates the caller explores without risking the frame (a race), each with the standing
        # choices it is raced from (None: any); from another choice it is a costly one (the whole
        # model is raced against an all-cloud candidate; from a split cut it would run for real)
        self.cheap_explore: dict[int, Collection[int] | None] = {}
        self.behind_frames = 10  # the horizon over which a candidate that cannot keep the frame rate is charged
        n = len(cost_model.ids)
        # evidence not refreshed for stale_hold_s fades (time constant stale_fade_s) in exploration's view
        self.stale_hold_s, self.stale_fade_s = 1.0, 3.0
        # each segment's time on the device now, and the device's speed (see DeviceSpeed)
        self.device = DeviceSpeed(cost_model.edge_ms, gap_s=explore_every_s / 2, hold_s=self.stale_hold_s,
                                  fade_s=self.stale_fade_s)
        # the cloud's state changes with its other clients: what it reports is averaged over time
        self._cloud = [TimedEwma(cloud_tau_s) for _ in range(n)]  # reported cloud compute ms
        self._ratio = [Ewma(alpha) for _ in range(n)]  # wire bytes / raw cut bytes
        self._encode = [Ewma(alpha) for _ in range(n)]  # encoding the cut on the device (ms)
        self._result = [Ewma(alpha) for _ in range(n)]  # result frame bytes coming back
        # evidence of a run of frames: a re-measurement after a pause (half the exploration interval)
        # starts a new run (see Runs)
        gap_s = explore_every_s / 2
        self.overhead_window_s = 10.0  # a run's samples this close to its last count (exploration: to now)
        fading = dict(window_s=self.overhead_window_s, gap_s=gap_s, hold_s=self.stale_hold_s,
                      fade_s=self.stale_fade_s)
        self._overhead = [Runs(lower_quartile, **fading) for _ in range(n)]  # beyond the base RTT
        self.cold_frames = 2  # per candidate, not counted in its overhead (device times: upper bounds)
        self._warmed, self._edge_frames = [False] * n, [0] * n
        self._seen = [0] * n
        # per candidate, what its frames really took beyond the model's prediction (a device's
        # scheduling, decoding, the loop); the median of the run's last frames is added
        self._residual = [Runs(median, **fading) for _ in range(n)]
        self._seen_total = [0] * n
        self._queue = TimedEwma(cloud_tau_s)
        # result size until measured: the raw outputs, unless the cloud says it post-processes
        self.result_prior = [float(b) for b in cost_model.result_bytes]
        self._cloud_scale = TimedEwma(cloud_tau_s)
        self.current: int | None = None
        self._since = -math.inf
        self._last_used = [-math.inf] * n
        self._last_explore: float | None = None
        # a candidate explored again and again while it comes no closer is explored less often: its
        # interval doubles with each exploration, up to explore_backoff_max x, back to 1x once it is
        # chosen or its prediction over the choice's is below explore_closer x what it was when last
        # explored (docs/architecture.md, controller.py)
        self.explore_backoff_max = 4.0
        self.explore_closer = 0.75
        self._backoff = [1.0] * n
        self._explored_rel = [math.inf] * n
        # a look for a candidate to explore, due every explore_every_s, comes at most every
        # explore_look_s until one is explored (see exploration_due)
        self.explore_look_s = 1.0
        self._last_look = -math.inf

    # ------------------------------------------------------------------ observations
    def observe_edge(self, i: int, ms: float, now: float | None = None, raced: bool = False,
                     warm: bool = False) -> None:
        """A segment's time on the device. ``raced``: it ran beside another frame's work (a race
        with the cloud): on a CPU-quota device every ms the event loop spent then (the next
        frame's JPEG, the reply) costs the segment ~1/quota ms, so a raced run is an upper bound
        (measured: 700-930 ms against ~390 alone at 0.17 core): taken only where it says less
        than the evidence, and never for the device's scale. ``warm``: the agent's own timing
        before the first frame; after it, a candidate's first ``cold_frames`` frames are upper
        bounds too (as they are not counted in its overhead): a 0.1-core device's split cut, timed
        at ~70 ms, took 250 and 220 ms in the first two frames, every process starting at once,
        and as measured it was held off for 20 s at 360 ms predicted, the cloud's ~190 ms frames
        10 % slower than its own."""
        if warm:
            self._warmed[i] = True
        else:
            self._edge_frames[i] += 1
            raced = raced or (self._warmed[i] and self._edge_frames[i] <= self.cold_frames)
        self.device.observe(i, ms, now, raced)

    def observe_cloud(self, i: int, compute_ms: float, queue_ms: float, batch_size: int = 1,
                      now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        per = compute_ms  # the edge waits for the whole batch: its latency is the batch's compute
        self._cloud[i].add(per, now)
        self._queue.add(queue_ms, now)
        if self.cm.cloud_ms[i] > 0.5:
            self._cloud_scale.add(per / self.cm.cloud_ms[i], now)

    def observe_overhead(self, i: int, ms: float, now: float | None = None, raced: bool = False) -> None:
        """A remote frame's time beyond its uplink transfer and the cloud's queue and compute: the
        RTT, the result's way back, decoding at both ends, a busy device's scheduling. The model
        charges the base RTT and the result bytes for it; what a candidate really costs on top
        (the lower quartile of its last frames, robust to a frame that waited behind another) is
        added. A candidate's first ``cold_frames`` frames are not counted: on a small device they
        pay for code paths running for the first time. A ``raced`` frame shared the device with
        the whole model's run: an upper bound (see ``Runs.add``)."""
        self._seen[i] += 1
        if self._seen[i] <= self.cold_frames:  # a candidate's first frames pay for cold code paths
            return
        self._overhead[i].add(ms, time.monotonic() if now is None else now, upper_bound=raced)

    def observe_total(self, i: int, measured_ms: float, base_ms: float, now: float | None = None,
                      raced: bool = False) -> None:
        """A frame's own time on this side (from its start to its result, less any wait for the
        device) against what the model expected of it (``base_ms``, without this residual or the
        device's load): the difference, over a candidate's recent frames, corrects what the model
        does not see. A local frame's is what follows its device time (post-processing, which a
        remote frame's cloud does for it: on the uplink traces edge frames took 2-3 % longer
        than predicted, and won the close calls they should have lost). Where the bandwidth
        estimate took the frame's transfer as a sample, the agent gives the model's device time
        (segment and encoding) plus the frame's network time
        as it really was (request to reply), so the residual is the device side's unmodelled cost
        (scheduling, decoding, the loop): the network has its own evidence (the bandwidth
        estimate, the cloud's reports, :meth:`observe_overhead`); a transfer too small to be a
        sample (a 4 KB JPEG) is compared with the whole prediction, its link's slowness seen
        nowhere else. Taken against the whole prediction, a frame the link slowed as it fell (a
        trace's 2 -> 0.4 Mbit/s) took 1.2 s against 0.2 predicted, and that residual held the
        cloud off for 13 frames after the link came back (session 20), on top of the estimate
        that had fallen.
        Its first ``cold_frames`` frames are not counted; a ``raced`` frame is an upper bound (it
        shared the device with the whole model's run)."""
        self._seen_total[i] += 1
        if self._seen_total[i] <= self.cold_frames or not math.isfinite(measured_ms - base_ms):
            return
        self._residual[i].add(measured_ms - base_ms, time.monotonic() if now is None else now, upper_bound=raced)

    def observe_result(self, i: int, nbytes: int) -> None:
        self._result[i].add(nbytes)

    def result_bytes(self) -> list[float]:
        """Measured result size per candidate; the plan's raw output size until measured."""
        return [r.value if not math.isnan(r.value) else float(p) for r, p in zip(self._result, self.result_prior)]

    def observe_encode(self, i: int, ms: float) -> None:
        self._encode[i].add(ms)

    def observe_bytes(self, i: int, wire_bytes: int) -> None:
        if self.cm.up_bytes[i] > 0:
            self._ratio[i].add(wire_bytes / self.cm.up_bytes[i])

    # ------------------------------------------------------------------ estimates
    def edge_ms(self, now: float | None = None, fade: bool = False) -> list[float]:
        """Device time per candidate: its edge segment now (:meth:`DeviceSpeed.times`; ``fade``: the
        exploration's view, stale times faded), plus encoding its cut (once measured)."""
        return [t + (0.0 if math.isnan(enc.value) else enc.value)
                for t, enc in zip(self.device.times(now, fade), self._encode)]

    def device_scale(self) -> float:
        """This device's measured time / the profile's, over any candidate (1 until measured)."""
        return self.device.scale()

    def cloud_ms(self, now: float | None = None) -> list[float]:
        """Reported cloud compute per candidate, a report fading back to the profile as it ages;
        until reported, the profile x the cloud's measured scale (over every candidate, fading too)."""
        now = time.monotonic() if now is None else now
        g = self._cloud_scale.at(now, 1.0)
        return [p * g if math.isnan(c.value) else c.at(now, p) for c, p in zip(self._cloud, self.cm.cloud_ms)]

    def byte_ratios(self, default: float | Sequence[float] = 1.0) -> list[float]:
        """Measured wire/raw size per candidate; ``default`` (one value or one per candidate) until measured."""
        d = [default] * len(self._ratio) if isinstance(default, (int, float)) else list(default)
        return [r.value if not math.isnan(r.value) else d[i] for i, r in enumerate(self._ratio)]

    def queue_ms(self, now: float | None = None) -> float:
        """The cloud's reported queue time; it fades to none as the report ages."""
        return self._queue.at(time.monotonic() if now is None else now, 0.0)

    def evidence(self, now: float | None = None, fade: bool = False,
                 default_ratio: float | Sequence[float] = 1.0) -> Evidence:
        """What every prediction at ``now`` is made from (see :class:`Evidence`); ``default_ratio``:
        the byte ratio of a candidate whose wire size is not measured yet."""
        now = time.monotonic() if now is None else now
        return Evidence(now, fade, self.edge_ms(now, fade), self.cloud_ms(now), self.byte_ratios(default_ratio),
                        self.result_bytes(), [o.value(now, fade) for o in self._overhead],
                        [r.value(now, fade) for r in self._residual], self.queue_ms(now))

    def predict(self, bandwidth_mbps: float, rtt_ms: float, *, default_ratio: float | Sequence[float] = 1.0,
                backlog_ms: float = 0.0, downlink_mbps: float | None = None, now: float | None = None,
                load: DeviceLoad | None = None, fade: bool = False, evidence: Evidence | None = None) -> list[float]:
        """``backlog_ms``: time the uplink needs for what is already in flight (delays any send);
        ``downlink_mbps``: charge the results coming back at this rate (None: results are free);
        ``load``: the device's queue and the frame rate (see :meth:`load_ms`); ``evidence``: made
        from this (its ``now``, ``fade`` and byte ratios) instead of the controller's state now."""
        return self.predict_parts(bandwidth_mbps, rtt_ms, default_ratio=default_ratio, backlog_ms=backlog_ms,
                                  downlink_mbps=downlink_mbps, now=now, load=load, fade=fade, evidence=evidence)[0]

    def predict_parts(self, bandwidth_mbps: float, rtt_ms: float, *, default_ratio: float | Sequence[float] = 1.0,
                      backlog_ms: float = 0.0, downlink_mbps: float | None = None, now: float | None = None,
                      load: DeviceLoad | None = None, fade: bool = False,
                      evidence: Evidence | None = None) -> tuple[list[float], list[float]]:
        """The predictions, and the model's part of them (before a candidate's measured residual
        and the device's load), which :meth:`observe_total` compares a frame's real time with
        where the link's time was not a bandwidth sample. ``fade``: evidence not refreshed lately
        (device times, overheads, residuals) weighs less and less — the view exploration takes
        (:meth:`choose`); the standing choice trusts it until the candidate is measured again."""
        ev = self.evidence(now, fade, default_ratio) if evidence is None else evidence
        results = ev.results
        pred = self.cm.predict(bandwidth_mbps, rtt_ms, ev.queue_ms + backlog_ms, edge_ms=ev.edge, cloud_ms=ev.cloud,
                               byte_ratio=ev.ratios, downlink_mbps=downlink_mbps, result_bytes=results)
        down = 0.0 if downlink_mbps is None else 8.0 / (max(downlink_mbps, 1e-9) * 1e3)
        local = self.cm.local
        for i, typical in enumerate(ev.overhead):
            # the first frames of a connection can be slow (cold): the lower quartile of a run's
            # frames, so they do not hold a good candidate back
            if typical is not None and not local[i]:
                pred[i] += max(typical - rtt_ms - results[i] * down, 0.0)
        base = list(pred)
        for i, r in enumerate(ev.residual):
            if r is not None:
                pred[i] = max(pred[i] + r, 0.5 * pred[i])
        if load is not None:
            if ev.fade:  # the device's work by the same faded times
                load = DeviceLoad(load.wait_ms, [ev.edge[i] if d > 0 else 0.0 for i, d in enumerate(load.device_ms)],
                                  load.interval_ms, load.max_inflight)
            pred = [p + w for p, w in zip(pred, self.load_ms(pred, load))]
        return pred, base

    def load_ms(self, pred: Sequence[float], load: DeviceLoad) -> list[float]:
        """Per candidate, what the device's load adds to a frame: the queue ahead of its device
        work, and, where the candidate cannot keep the camera's rate (its device time, or its
        latency over the frames allowed in flight, is longer than the frame interval), the backlog
        it would build: it falls behind by the difference every frame, half the horizon's worth on
        average over the horizon: the frames a choice is kept at least (``min_dwell_s``), and
        never fewer than ``behind_frames``."""
        out = []
        horizon = self.behind_frames
        if math.isfinite(load.interval_ms) and load.interval_ms > 0:
            horizon = max(horizon, self.min_dwell_s * 1e3 / load.interval_ms)
        for i, p in enumerate(pred):
            dev = load.device_ms[i]
            extra = load.wait_ms if dev > 0 else 0.0
            if math.isfinite(load.interval_ms):
                cycle = max(dev, (p + extra) / max(load.max_inflight, 1))
                extra += max(cycle - load.interval_ms, 0.0) * horizon / 2
            out.append(extra)
        return out

    # ------------------------------------------------------------------ the choice
    def choose(self, bandwidth_mbps: float, rtt_ms: float, now: float, *, allowed: Collection[int] | None = None,
               default_ratio: float | Sequence[float] = 1.0, backlog_ms: float = 0.0, transient_ms: float = 0.0,
               downlink_mbps: float | None = None, load: DeviceLoad | None = None,
               evidence: Evidence | None = None) -> Choice:
        """The candidate for the next frame. ``allowed`` restricts it (e.g. only local ones while
        the cloud is unreachable). ``transient_ms``: uplink time of one-off traffic ahead of this
        frame (a probe): it weighs on this frame's choice only; the standing choice, which
        hysteresis keeps, is made without it, so one probe does not move every frame after it.
        ``evidence``: the standing view at ``now`` when the caller has taken it already; the
        choice carries it (:attr:`Choice.evidence`) for the caller's own predictions."""
        ev = self.evidence(now, False, default_ratio) if evidence is None else evidence
        common = dict(backlog_ms=backlog_ms, downlink_mbps=downlink_mbps, load=load)
        pred, base = self.predict_parts(bandwidth_mbps, rtt_ms, evidence=ev, **common)  # type: ignore[arg-type]
        idx = list(allowed) if allowed is not None else list(range(len(pred)))
        if not idx:
            raise ValueError("no candidate is allowed")
        # what exploration goes by: stale evidence fades, so a candidate judged in a bad moment (a
        # cold start, a stalled device) is measured again instead of being ruled out until it expires.
        # Taken only when an exploration is due: it was ~60 of the choice's ~130 us a frame, and
        # on a CPU-quota device the frame's own CPU before its send is what its latency pays for
        due = self.exploration_due(now)
        faded = self.predict(bandwidth_mbps, rtt_ms, evidence=self.evidence(now, True, default_ratio),
                             **common) if due else pred  # type: ignore[arg-type]
        i, explore, unexplored = self._standing(pred, now, idx, ev.ratios, faded, due)
        detour = self.policy == "latency" and transient_ms > 0 and i == self.current
        if detour and not self.cm.local[i]:
            fpred, fbase = self.predict_parts(bandwidth_mbps, rtt_ms, backlog_ms=backlog_ms + transient_ms,
                                              downlink_mbps=downlink_mbps, load=load, evidence=ev)
            best = min(idx, key=fpred.__getitem__)
            if fpred[best] < fpred[i] * (1 - self.hysteresis):  # this frame goes round it
                self._last_used[best] = now
                return Choice(best, self.cm.ids[best], fpred[best], tuple(fpred), False, best, tuple(fbase),
                              evidence=ev)
        return Choice(i, self.cm.ids[i], pred[i], tuple(pred), explore, unexplored, tuple(base),
                      tuple(faded) if faded is not pred else (), ev)

    def exploration_due(self, now: float) -> bool:
        """Whether :meth:`choose` at ``now`` looks for a candidate to explore: from
        ``explore_every_s`` after the last exploration (the first choice, at start-up), at most
        once every ``explore_look_s``. (A look takes the exploration's view, ~60 of the choice's
        ~130 us; looked for on every frame once ``explore_every_s`` had passed and nothing was
        worth it, as on a link where the cloud is far ahead, it was a CPU-quota device's ~0.6 ms a
        frame.)"""
        if self._last_explore is None:
            return False
        return now - self._last_explore >= self.explore_every_s \
            and now - self._last_look >= min(self.explore_look_s, self.explore_every_s)

    def _cheap(self, i: int, choice: int) -> bool:
        """Whether exploring ``i`` from the standing ``choice`` risks no frame (a race). (The
        whole model, seen as cheap from a split cut, took the exploration's turn there and was
        then not explored: the all-cloud candidate's turn came 5 s later, and a cold start's
        two slow cloud frames held the frames on the slower split cut for ~11 s.)"""
        if i not in self.cheap_explore:
            return False
        raced_from = self.cheap_explore[i]
        return raced_from is None or choice in raced_from

    def worth_running(self, choice: Choice) -> bool:
        """Whether an exploration of a ``cheap_explore`` candidate that the caller cannot race
        (the standing choice is a split cut, not the all-cloud candidate) is worth running for
        real: its prediction in the exploration's view within ``explore_margin_costly`` of the
        standing choice's, the margin any candidate whose exploration risks the frame is explored
        at. Otherwise it is not explored at all. (It never was: while frames went to a split cut,
        the whole model's time, measured in two slow runs, stood for ~10 s of frames at 8 fps.)"""
        if not choice.explore or choice.unexplored is None or not choice.faded:
            return False
        i = choice.index
        return min(choice.predictions[i], choice.faded[i]) <= choice.predictions[choice.unexplored] \
            * self.explore_margin_costly

    def _standing(self, pred: list[float], now: float, idx: list[int], ratios: Sequence[float],
                  faded: Sequence[float], due: bool) -> tuple[int, bool, int]:
        """The choice among ``idx`` from ``pred``, with hysteresis, a minimum dwell and exploration
        (a candidate is worth exploring by ``faded``, its prediction with stale evidence faded):
        the candidate, whether it is explored, and what the choice would have been without exploring.
        ``ratios``: each candidate's wire/raw byte ratio (the bytes policy); ``due``: whether a look
        for a candidate to explore is due (:meth:`exploration_due`, as :meth:`choose` read it)."""
        if self.policy == "bytes":
            within = [i for i in idx if pred[i] <= self.budget]  # type: ignore[operator]
            raw = [self.cm.up_bytes[i] * ratios[i] for i in range(len(pred))]
            best = min(within, key=lambda i: (raw[i], pred[i])) if within else min(idx, key=pred.__getitem__)
        else:
            best = min(idx, key=pred.__getitem__)
        cur = self.current
        choice = best
        if cur is not None and cur in idx and cur != best:
            dwell = now - self._since
            better = pred[best] < pred[cur] * (1 - self.hysteresis)
            urgent = pred[cur] > pred[best] * self.emergency
            if not urgent and not (better and dwell >= self.min_dwell_s):
                choice = cur
        explore = False
        unexplored = choice
        if self._last_explore is None:  # start-up measured every segment: the first exploration waits
            self._last_explore = now
        if due:
            self._last_look = now
            # closer by the standing view: the exploration's view comes closer by itself as evidence
            # fades, and reset the back-off at every look (a 0.1-core device raced the whole model
            # every 5-10 s at 4x the cloud's time, each race ~270 ms of its CPU)
            rel = [pred[i] / max(pred[choice], 1e-9) for i in range(len(pred))]
            for i in idx:  # come closer to the choice since it was explored: worth a look again soon
                if rel[i] < self.explore_closer * self._explored_rel[i]:
                    self._backoff[i] = 1.0
            stale = [i for i in idx if i != choice
                     and min(pred[i], faded[i]) <= pred[choice] * (self.explore_margin if self._cheap(i, choice)
                                                                   else self.explore_margin_costly)
                     and now - self._last_used[i] >= self.explore_every_s * self._backoff[i]]
            if stale:
                choice = min(stale, key=lambda i: self._last_used[i])
                explore = True
                self._last_explore = now
                self._explored_rel[choice] = rel[choice]
                self._backoff[choice] = min(2 * self._backoff[choice], self.explore_backoff_max)
        if not explore and choice != self.current:
            self.current, self._since = choice, now
            self._backoff[choice] = 1.0
        self._last_used[choice] = now
        return choice, explore, unexplored
