"""What the edge agent returns for each input: exactly one per frame, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FrameResult"]


@dataclass
class FrameResult:
    index: int  # the frame's position in the input stream
    outputs: dict[str, np.ndarray] = field(repr=False)
    candidate: str  # the cut used
    edge_segment: str | None  # where the edge segment ran: "edge", or None (all-cloud)
    cloud_segment: str | None  # where the cloud segment ran: "cloud", "edge" (fallback), None (all-edge)
    bytes_sent: int
    timings: dict[str, float]  # edge_ms, encode_ms, transfer_ms, cloud_queue_ms, cloud_compute_ms, local_ms, total_ms
    fallback: bool = False
    fallback_reason: str | None = None
    predicted_ms: float = 0.0
    explore: bool = False
    batch_size: int = 0
    # what the cut was chosen from: bandwidth_mbps, rtt_ms, backlog_ms, cloud_ok, predicted_ms per candidate,
    # cloud_error (why the cloud is not connected: TLS, a refusal, unreachable; None when connected),
    # probes (those answered since the last frame: ActiveProber.take_answered)
    conditions: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def placement(self) -> str:
        """``edge`` (all on the device), ``cloud`` (all on the server), ``split``, or ``fallback``."""
        if self.fallback:
            return "fallback"
        if self.cloud_segment is None:
            return "edge"
        return "cloud" if self.edge_segment is None else "split"

    def to_json(self) -> dict[str, Any]:
        return {"frame": self.index, "candidate": self.candidate, "placement": self.placement,
                "edge_segment": self.edge_segment, "cloud_segment": self.cloud_segment, "bytes_sent": self.bytes_sent,
                "timings": {k: round(v, 3) for k, v in self.timings.items()}, "fallback": self.fallback,
                "fallback_reason": self.fallback_reason, "predicted_ms": round(self.predicted_ms, 3),
                "explore": self.explore, "batch_size": self.batch_size,
                "conditions": _rounded(self.conditions)}


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 3)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x
