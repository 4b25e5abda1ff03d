"""The uplink as a frame's choice sees it: whether the cloud may be asked, the rate to plan with,
and what is still ahead of this frame on the wire.

The bandwidth monitor's estimate is what the link did; what is on the link now bounds it from
above (an unanswered probe, frames in flight past their expected reply: a link that falls
under frames in flight is noticed while they are still on the wire), and the bytes sent and not
yet through delay any send. The agent reads this once per frame (:mod:`splitinfer.edge.agent`).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from ..transport.bandwidth import BandwidthMonitor, queued_bytes
from .breaker import CircuitBreaker
from .link import CloudLink
from .remote import RemoteCall

__all__ = ["Uplink", "uplink_now"]


class Uplink(NamedTuple):
    cloud_ok: bool  # connected and the breaker lets a frame through
    bandwidth_mbps: float  # the estimate, bounded by what is overdue on the link now
    backlog_ms: float  # the frames in flight still ahead of this one
    probe_ms: float  # the probes' part on top of that (one-off traffic: this frame's choice only)


def uplink_now(monitor: BandwidthMonitor, link: CloudLink | None, remote: RemoteCall | None,
               breaker: CircuitBreaker) -> Uplink:
    connected = link is not None and link.connected
    cloud_ok = connected and breaker.allows(time.monotonic())
    bw = monitor.estimate_mbps()
    prober = link.prober if link is not None else None
    if prober is not None:  # an overdue probe bounds the rate from above
        bw = min(bw, prober.rate_bound_mbps(rtt_ms=monitor.min_rtt_ms()))
    if remote is not None:  # and so do overdue frames (with the probes in their way)
        bw = min(bw, remote.rate_bound_mbps(probes=link.recent_probes() if link is not None else ()))
    frames = remote.sends_in_flight() if remote is not None else []
    probes = link.probe_sends_in_flight() if link is not None else []
    if not frames and not probes:
        return Uplink(cloud_ok, bw, 0.0, 0.0)
    ms_per_byte = 8 / (max(bw, 1e-3) * 1e3)
    backlog = queued_bytes(frames, bw) * ms_per_byte
    with_probes = queued_bytes(frames + probes, bw) * ms_per_byte - backlog if probes else 0.0
    return Uplink(cloud_ok, bw, backlog, with_probes)
