"""Predict each candidate's end-to-end latency under given network and load conditions.

For candidate *i* (ms)::

    all-edge:   edge_i
    otherwise:  edge_i + rtt + 8·bytes_i·ratio / uplink + queue + cloud_i [+ 8·result_i / downlink]

``edge_i`` and ``cloud_i`` come from device profiles stored in the plan (the edge device's own
profile when one was measured with ``splitinfer profile --role edge``, else the split host's times
scaled by ``edge_slowdown``), and may be overridden per frame by measured corrections. ``ratio``
is the codec's size ratio (1 for raw fp32). Results are assumed small (post-processed in the
cloud) unless a downlink rate is given. :meth:`CostModel.best` is a pure function of its
arguments, cheap enough to call for every frame (a few microseconds for eight candidates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from .plan import Plan

__all__ = ["CostModel", "select_profile", "NOMINAL_FLOP_PER_MS"]

# A plan split without profiling (`split --no-profile`) is priced at its FLOPs at this rate
# (10 GFLOP/s) for both sides, the edge scaled by ``edge_slowdown``; the edge agent replaces the
# edge times with its own measurements at start.
NOMINAL_FLOP_PER_MS = 1e7


def _flops_profile(plan: "Plan") -> dict[str, Any]:
    return {"role": "both", "candidates": {c.id: {"edge_ms": c.flops_edge / NOMINAL_FLOP_PER_MS,
                                                  "cloud_ms": c.flops_cloud / NOMINAL_FLOP_PER_MS}
                                           for c in plan.candidates}}


def select_profile(plan: "Plan", role: str, device: str | None = None) -> tuple[str, Mapping[str, Any]]:
    """The profile to use for ``role`` (``edge`` or ``cloud``): ``device`` by name, else the newest
    profile measured for that role, else the split host's (role ``both``)."""
    profiles = plan.profiles
    if device is not None:
        if device not in profiles:
            raise PlanError(f"plan {plan.name}: no profile named {device!r}; profiles: {sorted(profiles)}")
        return device, profiles[device]
    for wanted in (role, "both"):
        named = [(p.get("measured_at", ""), n) for n, p in profiles.items() if p.get("role") == wanted]
        if named:
            name = max(named)[1]
            return name, profiles[name]
    raise PlanError(f"plan {plan.name}: no profile for role {role!r}; run `splitinfer profile PLAN --role {role}`")


@dataclass(frozen=True)
class CostModel:
    ids: tuple[str, ...]
    edge_ms: tuple[float, ...]
    cloud_ms: tuple[float, ...]
    up_bytes: tuple[int, ...]  # raw (fp32) bytes of each candidate's cut; 0 when local
    result_bytes: tuple[int, ...]  # raw bytes of the cloud's outputs; 0 when local
    local: tuple[bool, ...]

    @classmethod
    def from_plan(cls, plan: "Plan", *, edge_device: str | None = None, cloud_device: str | None = None,
                  edge_slowdown: float = 1.0, cloud_speedup: float = 1.0) -> "CostModel":
        """Build from the plan's profiles. ``edge_slowdown``/``cloud_speedup`` scale the split host's
        times when the plan has no profile measured on the real edge or cloud device."""
        if not plan.profiles and edge_device is None and cloud_device is None:
            ename, eprof = cname, cprof = "flops", _flops_profile(plan)
        else:
            ename, eprof = select_profile(plan, "edge", edge_device)
            cname, cprof = select_profile(plan, "cloud", cloud_device)
        escale = edge_slowdown if eprof.get("role") == "both" else 1.0
        cscale = 1.0 / cloud_speedup if cprof.get("role") == "both" else 1.0
        edge, cloud = [], []
        for c in plan.candidates:
            e = eprof.get("candidates", {}).get(c.id, {}).get("edge_ms")
            k = cprof.get("candidates", {}).get(c.id, {}).get("cloud_ms")
            if e is None or k is None:
                raise PlanError(f"plan {plan.name}: profile {ename if e is None else cname!r} has no "
                                f"{'edge' if e is None else 'cloud'} time for candidate {c.id!r}")
            edge.append(float(e) * escale)
            cloud.append(float(k) * cscale)
        outputs = {t.name: t.nbytes for t in plan.outputs}
        return cls(
            ids=tuple(c.id for c in plan.candidates),
            edge_ms=tuple(edge),
            cloud_ms=tuple(cloud),
            up_bytes=tuple(0 if c.local else c.cut_bytes for c in plan.candidates),
            result_bytes=tuple(0 if c.local else sum(outputs[o] for o in c.cloud.outputs)  # type: ignore[union-attr]
                               for c in plan.candidates),
            local=tuple(c.local for c in plan.candidates),
        )

    def predict(self, bandwidth_mbps: float, rtt_ms: float = 0.0, queue_ms: float = 0.0, *,
                edge_ms: Sequence[float] | None = None, cloud_ms: Sequence[float] | None = None,
                byte_ratio: float | Sequence[float] = 1.0, downlink_mbps: float | None = None,
                result_bytes: Sequence[float] | None = None) -> list[float]:
        """Predicted end-to-end latency (ms) of every candidate, in ``ids`` order. ``result_bytes``
        overrides the plan's raw output sizes (e.g. measured, post-processed results)."""
        edge = self.edge_ms if edge_ms is None else edge_ms
        cloud = self.cloud_ms if cloud_ms is None else cloud_ms
        ratios = [byte_ratio] * len(self.ids) if isinstance(byte_ratio, (int, float)) else byte_ratio
        per_byte = 8.0 / (max(bandwidth_mbps, 1e-9) * 1e3)  # ms per byte
        down = 0.0 if downlink_mbps is None else 8.0 / (max(downlink_mbps, 1e-9) * 1e3)
        fixed = rtt_ms + queue_ms
        results = self.result_bytes if result_bytes is None else result_bytes
        out = []
        for i, local in enumerate(self.local):
            if local:
                out.append(edge[i])
            else:
                out.append(edge[i] + fixed + self.up_bytes[i] * ratios[i] * per_byte + cloud[i]
                           + results[i] * down)
        return out

    def best(self, bandwidth_mbps: float, rtt_ms: float = 0.0, queue_ms: float = 0.0, **kw: Any) -> tuple[int, float]:
        """Index and predicted latency (ms) of the fastest candidate."""
        pred = self.predict(bandwidth_mbps, rtt_ms, queue_ms, **kw)
        i = min(range(len(pred)), key=pred.__getitem__)
        return i, pred[i]
