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

__all__ = ["CostModel", "select_profile", "NOMINAL_FLOP_PER_MS", "nominal_ratio", "wire_ratios", "default_input_codec",
           "codec_settings", "DEFAULT_MIN_FIDELITY", "Setting"]

# A plan split without profiling (`split --no-profile`) is priced at its FLOPs at this rate
# (10 GFLOP/s) for both sides, the edge scaled by ``edge_slowdown``; the edge agent replaces the
# edge times with its own measurements at start.
NOMINAL_FLOP_PER_MS = 1e7


def nominal_ratio(codec: str) -> float:
    """Wire bytes / raw bytes for a plan that measured none (split before wire sizes were
    measured, or ``measure_wire=False``): without a prior a candidate would be predicted at raw
    size and never tried (jpeg: a 640x640 camera frame is ~1-3 % of its fp32 tensor; activations
    compress less than that)."""
    base, _, comp = codec.partition("+")
    ratio = {"raw": 1.0, "fp16": 0.5, "int8": 0.25, "jpeg": 0.03}.get(base, 1.0)
    return ratio * (0.7 if comp else 1.0)


def default_input_codec(plan: "Plan", codec: str) -> str:
    """What an all-cloud frame's inputs travel in unless asked: ``jpeg`` when every image input's
    pixel format is in the plan (what a camera sends anyway), else ``codec``."""
    images = [t for t in plan.inputs if t.is_image]
    return "jpeg" if images and all(t.pixels is not None for t in images) else codec


DEFAULT_MIN_FIDELITY = 0.98
Setting = tuple[str, "int | None"]  # a codec and, for jpeg, its quality


def codec_settings(plan: "Plan", codec: str = "auto", input_codec: str | None = None, jpeg_quality: int = 90,
                   min_fidelity: float = DEFAULT_MIN_FIDELITY) -> list[Setting | None]:
    """What each candidate's cut travels in (None for a local candidate, which sends nothing).

    ``codec="auto"``: the candidate's cheapest setting measured at split time whose fidelity is at
    least ``min_fidelity`` — for the same cut, fewer bytes are never slower, so this is each
    candidate's best setting on any link — the all-cloud input's JPEG qualities included (a ladder
    like any other); a candidate with no such measurement travels in fp16 (its input as JPEG
    q``jpeg_quality`` when the plan knows its pixel format). An explicit ``codec`` is used for
    every cut, and an all-cloud candidate's inputs go in ``input_codec`` (default
    :func:`default_input_codec`) at ``jpeg_quality``."""
    out: list[Setting | None] = []
    for c in plan.candidates:
        if c.local:
            out.append(None)
            continue
        all_cloud = c.edge is None
        if codec == "auto" and not (all_cloud and input_codec is not None):
            ok = [r for r in c.wire if r.fidelity >= min_fidelity]
            if ok:
                best = min(ok, key=lambda r: (r.nbytes, -r.fidelity))
                out.append((best.codec, best.quality))
                continue
            fallback = default_input_codec(plan, "fp16") if all_cloud else "fp16"
        else:
            fallback = (input_codec or default_input_codec(plan, "fp16" if codec == "auto" else codec)) if all_cloud \
                else codec
        out.append((fallback, jpeg_quality if fallback == "jpeg" else None))
    return out


def wire_ratios(plan: "Plan", codec: str = "auto", input_codec: str | None = None, jpeg_quality: int = 90,
                min_fidelity: float = DEFAULT_MIN_FIDELITY) -> list[float]:
    """Each candidate's wire bytes / raw cut bytes with the settings :func:`codec_settings` picks:
    as measured at split time on the plan's sample frames where the plan has that setting, else
    :func:`nominal_ratio`. Local candidates: 1 (they send nothing)."""
    out: list[float] = []
    for c, st in zip(plan.candidates, codec_settings(plan, codec, input_codec, jpeg_quality, min_fidelity)):
        if st is None or not c.cut_bytes:
            out.append(1.0)
            continue
        rung = c.rung(st[0], st[1])  # jpeg: the nearest quality measured, a better prior than none
        out.append(rung.nbytes / c.cut_bytes if rung is not None else nominal_ratio(st[0]))
    return out


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
