"""``split_model``: a model in, a verified plan directory out. The steps are the splitter's
modules in order: load → analyse → per-node profile → candidate cuts → segments → segment
profile → manifest → verify → report, all inside a temporary directory that becomes the plan
only when every step succeeded."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx.utils import Extractor

from .. import __version__
from .._types import TensorSpec
from ..errors import SplitinferError, VerificationError
from ..frames import frames_from, given_frames, image_input
from .cost_model import NOMINAL_FLOP_PER_MS
from .cuts import Cut, cut_from_tensors, find_candidates
from .graph import ModelGraph, analyse
from .loader import LoadedModel, load_model
from .plan import FORMAT, FORMAT_VERSION, Candidate, Plan, SegmentRef, atomic_directory, check_destination, \
    plan_hash, sha256_file, write_json_atomic
from .pixels import Normalize, pixel_formats
from .profiler import device_info, make_session, node_times, random_feeds, time_session
from .segment import build_segments
from .verify import DEFAULT_TOLERANCE, VerifyReport, verify_plan
from .wire_bytes import DEFAULT_SAMPLES, TensorBytes, candidate_ladder, cut_samples, measure_tensors

__all__ = ["split_model", "SplitResult", "profile_plan", "SPLIT_HOST"]

SPLIT_HOST = "split-host"  # profile name of the machine that ran `split` (role "both")

Progress = Callable[[str, float], None]  # (what is being done, fraction done 0..1)
Frames = str | Iterable[Mapping[str, np.ndarray]] | None


def _sample_frames(specs: Sequence[TensorSpec], frames: Frames, n: int) -> tuple[list[dict[str, np.ndarray]], str]:
    """The frames wire sizes are measured on, and what they are: given ones, a source name
    (``scene``, ``synthetic``, a video or an image directory), else rendered road scenes for an
    image input and random inputs otherwise."""
    if n < 1:
        raise SplitinferError(f"--samples must be at least 1, got {n}")
    if frames is None:
        frames = "scene" if image_input(specs) is not None else "synthetic"
    if isinstance(frames, str):
        source = frames
        got = list(frames_from(frames, specs, n, flag="--frames"))
    else:
        source = "given"
        got = given_frames(frames, specs, n, what="sample frame")
    if not got:
        raise SplitinferError(f"--frames {source}: no frames")
    return got, source


@dataclass
class SplitResult:
    plan: Plan
    verification: VerifyReport | None


def _node_costs(graph: ModelGraph) -> dict[int, float]:
    """Node costs for the cut search: FLOPs at a nominal rate. Deterministic on purpose: measured
    node times on a busy machine differ from run to run, and near-equal cuts would then trade
    places, so the same model and options could give different candidates and plan hashes.
    Measured times go into the split host's profile (``node_ms``), which the hash excludes."""
    return {n.index: n.flops / NOMINAL_FLOP_PER_MS for n in graph.compute_nodes()}


def _measured_node_costs(lm: LoadedModel, graph: ModelGraph, threads: int | None) -> dict[int, float]:
    measured = node_times(lm.static.SerializeToString(), random_feeds(graph.inputs), threads=threads)
    return {n.index: measured.get(n.name, 0.0) for n in graph.compute_nodes()}


def _cloud_runs_batched(model: onnx.ModelProto, graph: ModelGraph, inputs: Sequence[str]) -> bool:
    try:
        sess = make_session(model.SerializeToString(), level="basic")
        specs = [graph.tensors[n] for n in inputs]
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4  # a graph that cannot batch fails here by design: no error log
        sess.run(None, random_feeds(specs, batch=2), quiet)
        return True
    except Exception:
        return False


def _with_ladders(root: str, graph: ModelGraph, candidates: list[Candidate], frames: Sequence[Mapping[str, np.ndarray]],
                  tb: TensorBytes, pixels: Mapping[str, Any], threads: int | None) -> list[Candidate]:
    """Each candidate with its measured codec settings (``wire_bytes.candidate_ladder``)."""
    wanted = [t.name for c in candidates if not c.local for t in c.cut]
    values, whole = cut_samples(graph, wanted, frames, threads=threads)
    out = []
    for c in candidates:
        cloud = None if c.cloud is None else Path(root, c.cloud.file).read_bytes()
        rungs = candidate_ladder(c.cut, cloud, c.passthrough, [t.name for t in graph.outputs], values, whole, tb,
                                 pixels=pixels, threads=threads)
        out.append(dataclasses.replace(c, wire=tuple(rungs)))
    return out


def _write_segments(root: str, graph: ModelGraph, extractor: Extractor, cid: str, cut: Cut,
                    kind: str) -> Candidate:
    seg = build_segments(graph, cut, extractor, cid)
    if seg.cloud is not None and seg.cloud_batchable and not _cloud_runs_batched(seg.cloud, graph, seg.cloud_inputs):
        seg = build_segments(graph, cut, extractor, cid, batch_dynamic=False)
    refs: dict[str, SegmentRef | None] = {"edge": None, "cloud": None}
    os.makedirs(os.path.join(root, "segments"), exist_ok=True)
    for side, model, ins, outs in (("edge", seg.edge, seg.edge_inputs, seg.edge_outputs),
                                   ("cloud", seg.cloud, seg.cloud_inputs, seg.cloud_outputs)):
        if model is None:
            continue
        rel = f"segments/{cid}_{side}.onnx"
        onnx.save_model(model, os.path.join(root, rel))
        refs[side] = SegmentRef(rel, sha256_file(Path(root, rel)), tuple(ins), tuple(outs),
                                side == "cloud" and seg.cloud_batchable)
    flops_edge = cut.edge_flops(graph)
    cand = Candidate(cid, kind, tuple(graph.tensors[t] for t in cut.tensors), refs["edge"], refs["cloud"],
                     tuple(seg.passthrough), flops_edge, graph.total_flops - flops_edge, len(cut.edge_nodes))
    return cand


def _profile_candidates(plan: Plan, role: str, threads: int | None, budget_s: float,
                        progress: Progress | None) -> dict[str, Any]:
    """Time the whole model and each candidate's segments on this machine."""
    info = device_info(role, threads)
    feeds = random_feeds(plan.inputs)
    steps = len(plan.candidates) + 1
    if progress:
        progress("timing whole model", 0.0)
    whole = make_session(str(plan.model_file), threads=threads)
    info["whole_ms"] = time_session(whole, feeds, budget_s=budget_s)
    del whole
    out: dict[str, dict[str, float]] = {}
    for k, cand in enumerate(plan.candidates, 1):
        if progress:
            progress(f"timing candidate {cand.id}", k / steps)
        times: dict[str, float] = {}
        eout: dict[str, np.ndarray] = {}
        if cand.edge is not None:
            sess = make_session(str(plan.file(cand.edge)), threads=threads)
            efeeds = {n: feeds[n] for n in cand.edge.inputs}
            if role in ("edge", "both"):
                times["edge_ms"] = time_session(sess, efeeds, budget_s=budget_s)
            eout = dict(zip(cand.edge.outputs, sess.run(list(cand.edge.outputs), efeeds)))
        elif role in ("edge", "both"):
            times["edge_ms"] = 0.0
        if role in ("cloud", "both"):
            if cand.cloud is not None:
                sess = make_session(str(plan.file(cand.cloud)), threads=threads)
                times["cloud_ms"] = time_session(sess, cand.cut_feed(feeds, eout), budget_s=budget_s)
            else:
                times["cloud_ms"] = 0.0
        out[cand.id] = times
    info["candidates"] = out
    return info


def profile_plan(plan: Plan, *, role: str, device: str | None = None, threads: int | None = None,
                 budget_s: float = 1.0, progress: Progress | None = None) -> tuple[str, dict[str, Any]]:
    """Re-time ``plan`` on this machine as ``role`` (``edge``, ``cloud`` or ``both``) and store the
    profile in the plan under ``device`` (default: ``<role>-<hostname>``). The plan hash is unchanged."""
    if role not in ("edge", "cloud", "both"):
        raise ValueError(f"role must be edge, cloud or both, got {role!r}")
    info = _profile_candidates(plan, role, threads, budget_s, progress)
    name = device or f"{role}-{info['host']}"
    plan.set_profile(name, info)
    return name, info


def split_model(source: Any, output_dir: str | os.PathLike[str], *,
                input_shapes: Mapping[str, Sequence[int]] | None = None, example_input: Any = None,
                name: str | None = None, max_candidates: int = 8, cut: Sequence[str] | None = None,
                profile: bool = True, verify: bool = True, verify_inputs: Sequence[Mapping[str, np.ndarray]] = (),
                tolerance: float = DEFAULT_TOLERANCE, threads: int | None = None, budget_s: float = 1.0,
                force: bool = False, report: bool = True, edge_slowdown: float = 5.0,
                normalize: Normalize = None, frames: Frames = None, samples: int = DEFAULT_SAMPLES,
                measure_wire: bool = True, progress: Progress | None = None) -> SplitResult:
    """Split a model into a plan directory at ``output_dir``.

    ``source`` is an ONNX path/bytes/``ModelProto`` or a ``torch.nn.Module`` (with
    ``example_input``). ``cut`` adds a forced cut by tensor names to the automatic candidates.
    Every tensor's bytes on the wire are measured per codec on ``samples`` sample frames
    (``frames``: inputs, or a source name — ``scene``, ``synthetic``, a video file, a directory of
    images; default rendered road scenes for an image input, random inputs otherwise): the cut
    search prices tensors at them, and each candidate records its codec settings with bytes and
    fidelity (``wire_bytes.py``). ``measure_wire=False`` prices raw bytes and records none.
    ``normalize`` says how camera pixels become an image input (``"imagenet"``, ``"0-1"``,
    ``"mean=…,std=…"``, a :class:`~splitinfer.PixelFormat`, or one per input name); without it the
    plan records what the graph's own first nodes show, if anything (see ``pixels.py``).
    Raises a :class:`~splitinfer.errors.SplitinferError` subclass, leaving nothing behind, on bad
    input or when verification fails.

    >>> from splitinfer.models import build
    >>> model, x = build("chain", (1, 3, 32, 32))
    >>> res = split_model(model, "/tmp/chain-plan", example_input=x, force=True, report=False)  # doctest: +SKIP
    >>> [c.id for c in res.plan.candidates]  # doctest: +SKIP
    ['cloud', 'c1', 'c2', 'c3', 'edge']
    """

    def step(what: str, frac: float) -> None:
        if progress:
            progress(what, frac)

    check_destination(output_dir, force=force)  # before any work: a bad -o fails at once
    if not tolerance >= 0:
        raise SplitinferError(f"tolerance must be a number >= 0, got {tolerance!r}")
    step("loading model", 0.0)
    lm = load_model(source, input_shapes=input_shapes, example_input=example_input, name=name)
    graph = analyse(lm.static)
    pixels = pixel_formats(lm.static, graph, normalize)
    forced = [cut_from_tensors(graph, cut)] if cut else []  # a bad --cut fails before any measuring
    tb: TensorBytes | None = None
    sample: list[dict[str, np.ndarray]] = []
    source = ""
    if measure_wire:
        step("measuring wire sizes on sample frames", 0.05)
        specs = [dataclasses.replace(t, pixels=pixels.get(t.name)) for t in graph.inputs]
        sample, source = _sample_frames(specs, frames, samples)
        image = image_input(specs)
        tb = measure_tensors(graph, sample, pixels=pixels, threads=threads,
                             image_input=image.name if image is not None and image.pixels is not None else None)
    step("profiling nodes", 0.1)
    costs = _node_costs(graph)
    step("finding candidate cuts", 0.15)
    cuts = find_candidates(graph, costs, max_candidates=max_candidates, forced=forced,
                           tensor_bytes=tb.sweep_bytes(graph) if tb is not None else None)
    extractor = Extractor(lm.static)
    with atomic_directory(output_dir, force=force) as tmp:
        (tmp / "model.onnx").write_bytes(lm.source)
        candidates = []
        middle = 0
        for k, c in enumerate(cuts):
            kind = c.kind(graph)
            if kind == "split":
                middle += 1
            cid = kind if kind != "split" else f"c{middle}"
            step(f"writing segments {cid}", 0.2 + 0.2 * k / len(cuts))
            cand = _write_segments(str(tmp), graph, extractor, cid, c, kind)
            candidates.append(cand)
        if tb is not None:
            step("measuring each candidate's codec settings", 0.38)
            candidates = _with_ladders(str(tmp), graph, candidates, sample, tb, pixels, threads)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "splitinfer_version": __version__,
            "model": {"name": lm.name, "file": "model.onnx", "sha256": lm.sha256, "flops": graph.total_flops,
                      "nodes": len(graph.nodes), "opset": max((o.version for o in lm.static.opset_import
                                                               if o.domain in ("", "ai.onnx")), default=0)},
            "inputs": [dataclasses.replace(t, pixels=pixels.get(t.name)).to_json() for t in graph.inputs],
            "outputs": [t.to_json() for t in graph.outputs],
            "candidates": [c.to_json() for c in candidates],
        }
        if tb is not None:
            manifest["wire_samples"] = {"source": source if source in ("scene", "synthetic", "given") else
                                        Path(source).name or source, "frames": tb.frames}
        manifest["plan_hash"] = plan_hash(manifest)
        manifest["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        manifest["profiles"] = {}
        write_json_atomic(tmp / "manifest.json", manifest)
        plan = Plan.load(tmp)
        if profile:
            info = _profile_candidates(plan, "both", threads, budget_s,
                                       lambda w, f: step(w, 0.4 + 0.35 * f))
            measured = _measured_node_costs(lm, graph, threads)
            info["node_ms"] = {graph.nodes[i].name: round(v, 5) for i, v in measured.items()}
            plan.set_profile(SPLIT_HOST, info)
        result = None
        if verify:
            n = len(plan.candidates)
            done = iter(range(n))
            result = verify_plan(plan, extra_inputs=verify_inputs, tolerance=tolerance, threads=threads,
                                 progress=lambda cid: step(f"verifying {cid}", 0.75 + 0.2 * next(done) / n))
            if not result.ok:
                bad = [c for c in result.checks if not c.ok]
                raise VerificationError(f"{len(bad)} of {n} candidates do not reproduce the whole model: "
                                        + "; ".join(f"{c.id}: {c.problem}" for c in bad))
        if report and profile:
            step("writing report.png", 0.95)
            from .report import write_report_png

            write_report_png(plan, tmp / "report.png", edge_slowdown=edge_slowdown)
    step("done", 1.0)
    final = Plan.load(output_dir, check_files=False)
    return SplitResult(final, result)
