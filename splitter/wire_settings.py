"""What each candidate's cut travels in, and what that costs in bytes.

A plan records, per remote candidate, the codec settings measured at split time (``Rung``: codec,
JPEG quality, mean bytes, fidelity; ``wire_bytes.py``). From them and the user's flags this module
decides each candidate's setting (:func:`codec_settings`: ``auto`` takes the cheapest that keeps a
fidelity floor) and the byte ratio the cost model starts from (:func:`wire_ratios`) until the edge
measures its own frames. A plan without measurements falls back to nominal ratios.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SplitinferError

if TYPE_CHECKING:  # pragma: no cover
    from .plan import Plan

__all__ = ["nominal_ratio", "default_input_codec", "input_codec_for", "codec_settings", "wire_ratios",
           "below_floor", "DEFAULT_MIN_FIDELITY", "Setting"]


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
    :func:`default_input_codec`) at ``jpeg_quality``. A learned bottleneck's latent travels
    ``rans`` whatever is asked (its candidate is held to the floor by :func:`below_floor`)."""
    out: list[Setting | None] = []
    for c in plan.candidates:
        if c.local:
            out.append(None)
            continue
        if c.bottleneck is not None:
            out.append(("rans", None))
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
            fallback = (input_codec or default_input_codec(plan, codec)) if all_cloud else codec
        out.append((fallback, jpeg_quality if fallback == "jpeg" else None))
    return out


def below_floor(plan: "Plan", min_fidelity: float = DEFAULT_MIN_FIDELITY) -> list[int]:
    """Candidates no setting of which keeps ``min_fidelity``: learned bottlenecks measured below it
    (any other cut can always travel near-losslessly). The controller leaves them out unless a
    user pins one."""
    return [i for i, c in enumerate(plan.candidates)
            if c.bottleneck is not None and max((r.fidelity for r in c.wire), default=0.0) < min_fidelity]


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


def input_codec_for(plan: Plan, input_codec: str | None, codec: str) -> str:
    """The codec an all-cloud frame's inputs travel in: ``jpeg`` by default when every image input's
    pixel format is in the plan (what a camera sends anyway), else ``codec``. Asking for ``jpeg``
    on an image input whose pixel format the plan does not know is refused: a normalised input
    would be clipped to [0, 1] on the way."""
    images = [t for t in plan.inputs if t.is_image]
    if input_codec is None:
        return default_input_codec(plan, codec)
    if input_codec.partition("+")[0] == "jpeg":
        unknown = [t.name for t in images if t.pixels is None]
        if unknown:
            raise SplitinferError(f"--input-codec jpeg: the plan does not record how camera pixels become input "
                                  f"{unknown[0]!r} (scale, mean/std, channel order); split the model again with "
                                  f"--normalize (e.g. --normalize imagenet, --normalize 0-1, or "
                                  f"--normalize mean=A,B,C,std=A,B,C)")
    return input_codec
