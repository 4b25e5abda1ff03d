"""Admission of an inference request: its tensors' headers (still encoded) against the plan's
cut, before any payload is decompressed or anything is computed."""

from __future__ import annotations

from typing import Any

from .._types import TensorSpec
from ..errors import PlanError
from ..splitter.plan import Candidate, Plan
from ..transport import wire
from ..codecs import Encoded

__all__ = ["RequestError", "check_request"]


class RequestError(Exception):
    """A request the service answers with an error frame of ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_request(plan: Plan, req: wire.InferRequest, max_rows: int) -> Candidate:
    """The candidate ``req`` is for, once its tensor headers fit that candidate's cut: names,
    dtypes, shapes, rows (at most ``max_rows``). Raises :class:`RequestError` naming the problem."""
    if req.plan_hash != plan.hash:
        raise RequestError("unknown_plan", f"request for plan {req.plan_hash[:16]}…, this connection's hello "
                                           f"was for {plan.hash[:16]}…")
    try:
        cand = plan.candidate(req.candidate)
    except PlanError as exc:
        raise RequestError("unknown_candidate", str(exc)) from None
    if cand.cloud is None:
        raise RequestError("bad_request", f"candidate {cand.id!r} runs entirely on the edge; nothing to compute")
    want = {t.name: t for t in cand.cut}
    got = set(req.tensors)
    if got != set(want):
        missing, extra = sorted(set(want) - got), sorted(got - set(want))
        raise RequestError("shape", f"candidate {cand.id!r} takes tensors {sorted(want)}; missing {missing}, "
                                     f"unexpected {extra}")
    pixels = {t.name: t.pixels for t in plan.inputs}
    rows = None
    for name, arr in req.tensors.items():
        spec: TensorSpec = want[name]
        dtype, shape = _dtype_shape(arr)
        ok_dtype = dtype == spec.dtype
        ok_shape = (shape[1:] == spec.shape[1:] and len(shape) == len(spec.shape) and shape[0] >= 1
                    if cand.cloud.batch_dynamic else shape == spec.shape)
        if not (ok_dtype and ok_shape):
            raise RequestError("shape", f"tensor {name!r}: expected {spec.dtype} {list(spec.shape)}, got "
                                         f"{dtype} {list(shape)}")
        if isinstance(arr, Encoded) and arr.codec == "rans" and name not in cand.tables:
            raise RequestError("bad_request", f"tensor {name!r} came as rans, which is for a learned bottleneck's "
                                              f"latent only; candidate {cand.id!r} has none")
        if isinstance(arr, Encoded) and arr.codec == "jpeg" and pixels.get(name) is None:
            raise RequestError("bad_request", f"tensor {name!r} came as jpeg, but the plan does not record how camera "
                                              "pixels become this input (split with --normalize)")
        if rows is not None and shape[0] != rows:
            raise RequestError("shape", f"tensor {name!r}: batch {shape[0]} differs from the others' {rows}")
        rows = shape[0]
    if rows is not None and rows > 1 and rows > max_rows:
        raise RequestError("bad_request", f"{rows} rows in one request; this service takes at most "
                                           f"{max_rows} (max_rows)")
    return cand


def _dtype_shape(t: Any) -> tuple[str, tuple[int, ...]]:
    """dtype name and shape of an ndarray or an (undecoded) Encoded tensor."""
    if isinstance(t, Encoded):
        return t.dtype, tuple(t.shape)
    return t.dtype.name, tuple(t.shape)
