"""What a cloud's reply must be before the edge decodes it: the tensors the candidate's cloud
segment makes (names, dtypes, shapes from the plan), or the post-processed format agreed at
hello (``yolo``: float32 detections ``(K <= MAX_DETECTIONS, 6)``). Checked on the still-encoded
headers, so a reply that would decompress to gigabytes is refused before any byte is inflated."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..postprocess import MAX_DETECTIONS
from ..splitter.plan import Candidate, Plan
from ..transport import wire
from ..codecs import Encoded

__all__ = ["BadReply", "reply_outputs"]


class BadReply(Exception):
    """A reply for a request of ours that the wire format refuses (over a limit, say)."""


def _dtype_shape(t: Any) -> tuple[str, tuple[int, ...]]:
    return (t.dtype, tuple(t.shape)) if isinstance(t, Encoded) else (t.dtype.name, tuple(t.shape))


def reply_outputs(plan: Plan, cand: Candidate, postprocessed: str, reply: wire.Result) -> dict[str, np.ndarray]:
    """``reply``'s tensors, checked against what ``cand``'s cloud segment makes (or the
    ``postprocessed`` format), then decoded. Raises ValueError (or a ProtocolError) naming the misfit."""
    got = reply.outputs
    if postprocessed == "yolo":
        want: dict[str, tuple[str | None, tuple[int, ...] | None]] = {"detections": ("float32", None)}
    else:
        assert cand.cloud is not None
        specs = {t.name: t for t in plan.outputs}
        want = {n: (specs[n].dtype, specs[n].shape) if n in specs else (None, None) for n in cand.cloud.outputs}
    if set(got) != set(want):
        raise ValueError(f"outputs {sorted(got)}, expected {sorted(want)}")
    for name, t in got.items():
        dtype, shape = _dtype_shape(t)
        wdtype, wshape = want[name]
        if postprocessed == "yolo":
            ok = dtype == "float32" and len(shape) == 2 and shape[1] == 6 and shape[0] <= MAX_DETECTIONS
            expected = f"float32 (K <= {MAX_DETECTIONS}, 6)"
        else:
            ok = (wdtype is None or dtype == wdtype) and (wshape is None or shape == wshape)
            expected = f"{wdtype} {list(wshape) if wshape is not None else '?'}"
        if not ok:
            raise ValueError(f"output {name!r} is {dtype} {list(shape)}, expected {expected}")
    return wire.decode_tensors(got) if any(isinstance(t, Encoded) for t in got.values()) else dict(got)
