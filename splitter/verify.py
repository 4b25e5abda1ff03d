"""Check a plan: every candidate's edge → cloud composition must reproduce the whole model.

Inputs are seeded random tensors (and any the caller gives, e.g. from a ``.npy`` file). Every
output must match the whole model to ``max |a - b| <= tolerance`` (default 1e-5, fp32). Cloud
segments marked batch-dynamic are also run on two different inputs stacked as a batch of 2 and
must give each row's batch-1 result to ``tolerance`` relative to the outputs' largest magnitude
(a batch of 2 runs other kernel blockings, which reorder float sums: a trained detector's box
outputs, in pixels, differ by ~1e-4 absolute). Sessions run at ORT_ENABLE_BASIC so that kernel
fusion, which legitimately reorders float sums, does not hide or fake a difference.

A learned bottleneck candidate is lossy by design: its latent crosses as it will on the wire
(``rans`` with the plan's tables) and the check reports its *fidelity* on these inputs (``1 -``
the largest relative L2 output error, the measure its codec setting records on real frames; on
random inputs it is lower) instead of failing on the difference; it fails if a segment does not
run, an output is not finite, or the batch-2 check fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codecs import decode_tensor, encode_tensor
from .plan import Candidate, Plan
from .profiler import make_session, random_feeds
from .wire_bytes import rel_error

__all__ = ["CandidateCheck", "VerifyReport", "verify_plan", "verify_candidate", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = 1e-5


@dataclass
class CandidateCheck:
    id: str
    max_abs_diff: float
    batch_max_abs_diff: float | None  # None: not batch-dynamic (or all-edge)
    ok: bool
    problem: str = ""
    fidelity: float | None = None  # a learned bottleneck: 1 - largest relative L2 output error

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "ok": self.ok, "max_abs_diff": self.max_abs_diff,
                "batch_max_abs_diff": self.batch_max_abs_diff, "problem": self.problem,
                **({"fidelity": self.fidelity} if self.fidelity is not None else {})}


@dataclass
class VerifyReport:
    ok: bool
    tolerance: float
    inputs: list[str]
    checks: list[CandidateCheck] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "tolerance": self.tolerance, "inputs": self.inputs,
                "candidates": [c.to_json() for c in self.checks]}


def _max_diff(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    worst = 0.0
    for k, v in a.items():
        w = np.asarray(b[k])
        if v.shape != w.shape:
            return float("inf")
        if v.size:
            d = np.abs(v.astype(np.float64) - w.astype(np.float64))
            worst = max(worst, float(np.nanmax(d)) if not np.isnan(d).all() else 0.0)
            if np.isnan(v).any() != np.isnan(w).any():
                return float("inf")
    return worst


def verify_plan(plan: Plan, *, extra_inputs: Sequence[Mapping[str, np.ndarray]] = (), n_random: int = 2,
                tolerance: float = DEFAULT_TOLERANCE, threads: int | None = None,
                progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Run the whole model and every candidate on the same inputs and compare."""
    feeds, labels = _feeds(plan, extra_inputs, n_random)
    whole = make_session(str(plan.model_file), threads=threads, level="basic")
    names = list(plan.output_names)
    expected = [dict(zip(names, whole.run(names, f))) for f in feeds]
    report = VerifyReport(ok=True, tolerance=tolerance, inputs=labels)
    for cand in plan.candidates:
        if progress:
            progress(cand.id)
        check = _check_candidate(plan, cand, feeds, expected, tolerance, threads)
        report.checks.append(check)
        report.ok &= check.ok
    return report


def verify_candidate(plan: Plan, cand: Candidate, *, extra_inputs: Sequence[Mapping[str, np.ndarray]] = (),
                     n_random: int = 2, tolerance: float = DEFAULT_TOLERANCE,
                     threads: int | None = None) -> CandidateCheck:
    """:func:`verify_plan` for one candidate (e.g. one just added to the plan)."""
    feeds, _ = _feeds(plan, extra_inputs, n_random)
    whole = make_session(str(plan.model_file), threads=threads, level="basic")
    names = list(plan.output_names)
    return _check_candidate(plan, cand, feeds, [dict(zip(names, whole.run(names, f))) for f in feeds], tolerance,
                            threads)


def _feeds(plan: Plan, extra_inputs: Sequence[Mapping[str, np.ndarray]],
           n_random: int) -> tuple[list[dict[str, np.ndarray]], list[str]]:
    feeds = [random_feeds(plan.inputs, seed=s) for s in range(n_random)]
    labels = [f"random(seed={s})" for s in range(n_random)]
    for i, extra in enumerate(extra_inputs):
        for spec in plan.inputs:
            if spec.name not in extra:
                from ..errors import ShapeError

                raise ShapeError(f"verification input {i} lacks model input {spec.name!r}")
            spec.check(np.asarray(extra[spec.name]), what="verification input")
        feeds.append(dict(extra))
        labels.append(f"given[{i}]")
    return feeds, labels


def _check_candidate(plan: Plan, cand: Candidate, feeds: list[dict[str, np.ndarray]],
                     expected: list[dict[str, np.ndarray]], tol: float, threads: int | None) -> CandidateCheck:
    edge = make_session(str(plan.file(cand.edge)), threads=threads, level="basic") if cand.edge else None
    cloud = make_session(str(plan.file(cand.cloud)), threads=threads, level="basic") if cand.cloud else None
    worst, rel = 0.0, 0.0
    cuts = []
    tables = cand.tables
    try:
        for feed, want in zip(feeds, expected):
            eout: dict[str, np.ndarray] = {}
            if edge is not None:
                assert cand.edge is not None
                eout = dict(zip(cand.edge.outputs, edge.run(list(cand.edge.outputs),
                                                            {k: feed[k] for k in cand.edge.inputs})))
            cut = cand.cut_feed(feed, eout)
            for name, t in tables.items():  # a bottleneck's latent crosses as it does on the wire
                cut[name] = decode_tensor(encode_tensor(cut[name], "rans", tables=t), tables=t)
            cuts.append(cut)
            cout: dict[str, np.ndarray] = {}
            if cloud is not None:
                assert cand.cloud is not None
                cout = dict(zip(cand.cloud.outputs, cloud.run(list(cand.cloud.outputs), cut)))
            got = cand.finish(cut, cout, plan.output_names)
            worst = max(worst, _max_diff(want, got))
            rel = max([rel] + [rel_error(got[n], want[n]) for n in want])
    except Exception as exc:  # a segment that does not run is a failed check, named
        return CandidateCheck(cand.id, float("inf"), None, False, f"segment failed to run: {exc}")
    batch_diff = None
    fidelity = None
    if cand.bottleneck is not None:  # lossy by design: its fidelity is reported, non-finite outputs fail
        fidelity = max(0.0, 1.0 - rel) if np.isfinite(rel) else 0.0
        problem = "" if np.isfinite(rel) else "outputs are not finite"
    else:
        problem = "" if worst <= tol else f"outputs differ from the whole model by {worst:.3g} > {tol:g}"
    if cloud is not None and cand.cloud is not None and cand.cloud.batch_dynamic and len(cuts) >= 2:
        try:
            stacked = {k: np.concatenate([cuts[0][k], cuts[1][k]], 0) for k in cuts[0]}
            outs = cloud.run(list(cand.cloud.outputs), stacked)
            singles = [cloud.run(list(cand.cloud.outputs), c) for c in cuts[:2]]
            batch_diff = max(_max_diff({str(j): o[r:r + 1] for j, o in enumerate(outs)},
                                       {str(j): s for j, s in enumerate(singles[r])}) for r in range(2))
            scale = max(1.0, max(float(np.nanmax(np.abs(x))) if x.size else 0.0 for one in singles for x in one))
        except Exception as exc:
            batch_diff, scale = float("inf"), 1.0
            problem = problem or f"cloud segment fails at batch 2: {exc}"
        if batch_diff > tol * scale and not problem:
            problem = (f"cloud segment at batch 2 differs from batch 1 by {batch_diff:.3g} > {tol * scale:.3g} "
                       f"({tol:g} of the outputs' scale {scale:.3g})")
    ok = not problem
    return CandidateCheck(cand.id, worst, batch_diff, ok, problem, fidelity)
