"""What the edge agent tells its bandwidth prober after each frame's choice: whether a faster link
would change that choice (then the prober ramps up and probes steadily within a share of the
rate), and the budget for its probes (a share of what the cheapest remote candidate's frames would
send, lifted on a close call). The prober itself is ``transport.prober.ActiveProber``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..splitter.plan import Plan
from ..transport.prober import ActiveProber
from .controller import Controller


class ProbeSteering:
    """Steers an agent's prober from the predictions of one frame.

    ``budget``: the probes' share of what sending the frames to the cloud would cost (they are how
    a better link is found while the frames stay on the device); ``prior_ratio``: a candidate's
    wire bytes over its raw bytes until its size is measured here."""

    def __init__(self, plan: Plan, controller: Controller, prior_ratio: float, budget: float = 0.1) -> None:
        self.plan, self.controller, self.prior_ratio, self.budget = plan, controller, prior_ratio, budget

    def budget_bps(self, frame_interval_ms: float) -> float | None:
        """The probes' average bytes/s at most, unless the call is close: ``budget`` of what
        the cheapest remote candidate's frames would send at the camera's rate (None while the rate
        is not known). Probing at a share of the link alone cost an agent on the device as much
        uplink as sending every frame to the cloud (session 22, a 1-4 Mbit/s trace window: 29 KiB
        of probes a frame beside the all-cloud candidate's 44); the budget alone, on a close call,
        left the estimate 7 s old while the cloud was predicted within 5 % of the device and was in
        fact ~1.8x faster (TMobile-LTE-short: 14 frames on the device, adaptive 1.047x the cloud)."""
        if not math.isfinite(frame_interval_ms):
            return None
        ratios = self.controller.byte_ratios(self.prior_ratio)
        cm = self.controller.cm
        wire = [cm.up_bytes[i] * ratios[i] for i, c in enumerate(self.plan.candidates) if not c.local]
        return self.budget * min(wire) * 1e3 / frame_interval_ms if wire else None

    def faster_would_matter(self, bw: float, rtt: float, preds: Sequence[float], common: dict[str, Any],
                            factor: float = 4.0) -> bool:
        """Whether a link ``factor`` times faster than the estimate would pick another candidate:
        then finding the link's real rate is worth probing for. (``common`` holds the frame's
        evidence: no state is gathered again.)"""
        faster = self.controller.predict(bw * factor, rtt, **common)
        return argmin(faster) != argmin(preds)

    def steer(self, prober: ActiveProber, bw: float, rtt: float, preds: Sequence[float], common: dict[str, Any],
              *, frame_interval_ms: float, pinned: bool) -> None:
        """Ramp the probes up while a faster link would change the choice (``preds``: a frame's; a
        pinned agent's choice cannot change)."""
        want = not pinned and self.faster_would_matter(bw, rtt, preds, common)
        prober.want_more = want
        # a close call (a link 1.5x as fast would change it) is worth the link's share of probes;
        # a distant one, a tenth of what the frames would cost in the cloud
        close = want and self.faster_would_matter(bw, rtt, preds, common, factor=1.5)
        prober.budget_bps = None if close else self.budget_bps(frame_interval_ms)


def argmin(xs: Sequence[float]) -> int:
    """The first index of the smallest (numpy's argmin costs more than the choice on a few candidates)."""
    return min(range(len(xs)), key=xs.__getitem__)
