"""``add_bottleneck``: a plan in, the same plan with a learned bottleneck candidate ``b1``, ``b2``, …

The steps, all inside a copy of the plan that replaces it only when every step succeeded (the
plan's own atomic write: a temporary sibling directory, verified, re-hashed, renamed into place):

1. the cut tensor (``--at``: a candidate whose cut is one tensor, or a tensor name) and the model's
   segments around it (``segment.py``);
2. unlabeled frames (``--frames``: a video, a directory of images, or rendered scenes) through the
   frozen front: the cut tensors the bottleneck learns from, and a held-out set it is measured on;
3. training (``bottleneck.py``) by distillation through the frozen back run in torch
   (``onnx_torch.py``); where the back uses an operator that interpreter lacks, the cut tensors
   alone are distilled, and the result says which operators and what it measured;
4. the prior's tables (``prior.py``), the encoder spliced onto the front and the decoder onto the
   back (``bottleneck_graph.py``);
5. measured on the held-out frames exactly as it will run — the edge segment, the latent coded with
   ``rans`` and decoded, the cloud segment — against the whole model: mean bytes a frame and
   fidelity (``1 -`` the largest relative L2 output error, as for every other rung), then timed here
   for the plan's profiles, and checked like every candidate (``verify.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.utils import Extractor

from .._types import TensorSpec
from ..codecs import decode_tensor, encode_tensor
from ..errors import SplitinferError, VerificationError
from ..frames import frames_from, given_frames
from .bottleneck import BottleneckConfig, TrainReport, build_bottleneck, train_bottleneck
from .bottleneck_graph import bottleneck_flops, cloud_with_decoder, edge_with_encoder, latent_hw, weights_of
from .cuts import cut_from_tensors
from .graph import analyse
from .loader import load_model
from .onnx_torch import OnnxModule, unsupported
from .plan import BottleneckRecord, Candidate, Plan, Rung, SegmentRef, atomic_directory, plan_hash, sha256_file, \
    write_json_atomic
from .prior import logistic_tables
from .profiler import make_session, time_session
from .segment import build_segments, relax_batch
from .verify import verify_candidate
from .wire_bytes import rel_error

__all__ = ["add_bottleneck", "BottleneckResult", "Trained", "save_weights", "load_weights"]

Progress = Callable[[str, float], None]
Frames = str | Sequence[Mapping[str, np.ndarray]]


@dataclass
class BottleneckResult:
    plan: Plan
    candidate: str
    at: str
    rung: Rung  # rans: mean bytes a frame on the held-out frames, and fidelity
    distilled: str  # "outputs" | "features"
    unsupported_ops: list[str]  # the back's operators the torch interpreter lacks (then: features)
    training: TrainReport
    bits_per_frame: float  # the latent's code length under the tables, mean over held-out frames
    frames: dict[str, int] = field(default_factory=dict)  # train / held_out
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"plan": str(self.plan.path), "plan_hash": self.plan.hash, "candidate": self.candidate, "at": self.at,
                "bytes": self.rung.nbytes, "fidelity": self.rung.fidelity, "bits_per_frame": round(self.bits_per_frame, 1),
                "distilled": self.distilled, "unsupported_ops": self.unsupported_ops, "frames": self.frames,
                "training": {"steps": self.training.steps, "seconds": round(self.training.seconds, 1),
                             "feature_mse": self.training.feature_mse, "output_mse": self.training.output_mse},
                "seconds": round(self.seconds, 1)}


def _resolve_at(plan: Plan, at: str | Sequence[str]) -> list[str]:
    if isinstance(at, str):
        ids = [c.id for c in plan.candidates]
        if at in ids:
            cand = plan.candidate(at)
            if cand.local or cand.edge is None:
                raise SplitinferError(f"--at {at}: candidate {at!r} sends {'nothing' if cand.local else 'the model inputs'}; "
                                      "a bottleneck goes after a cut in the middle of the model")
            return [t.name for t in cand.cut]
        return [n.strip() for n in at.split(",") if n.strip()]
    return list(at)


def _cut_tensor(plan: Plan, graph: Any, names: list[str], flag: str) -> TensorSpec:
    if len(names) != 1:
        raise SplitinferError(f"{flag}: a bottleneck crosses one tensor; got {len(names)} ({names}). Name one "
                              "tensor of a multi-tensor cut, or a single-tensor candidate")
    cut = cut_from_tensors(graph, names)  # a name that is not a tensor, or a cut that is not closed, is named there
    spec = graph.tensors[cut.tensors[0]]
    if spec.name in {t.name for t in plan.inputs} or spec.name in plan.output_names:
        raise SplitinferError(f"{flag} {spec.name}: a model {'input' if spec.name in {t.name for t in plan.inputs} else 'output'}; "
                              "a bottleneck goes after a cut in the middle of the model")
    if len(spec.shape) != 4 or spec.shape[0] != 1 or spec.dtype != "float32":
        raise SplitinferError(f"{flag} {spec.name}: a bottleneck takes a float32 (1, C, H, W) feature map, the tensor is "
                              f"{spec.dtype} {list(spec.shape)}")
    return spec


def _frames(plan: Plan, source: Frames, n_train: int, n_eval: int, seed: int) -> tuple[list[Any], list[Any]]:
    """Training frames and held-out frames: for a video or a directory, its last ``n_eval`` frames
    are held out; generated scenes are held out by seed; given frames (a sequence of input dicts),
    the last ``n_eval`` of them. ``n_train == 0``: nothing to train on, every frame is for measuring."""
    if n_train == 0 and n_eval >= 1:
        src = frames_from(source, plan.inputs, n_eval, seed=seed + 7919, flag="--frames") \
            if isinstance(source, str) else iter(source)
        held = given_frames(src, plan.inputs, n_eval)
        if not held:
            raise SplitinferError("no frames to measure the bottleneck on")
        return [], held
    if n_train < 1 or n_eval < 1:
        raise SplitinferError(f"--train-frames and --eval-frames must be at least 1, got {n_train} and {n_eval}")
    if not isinstance(source, str):
        got = given_frames(source, plan.inputs, n_train + n_eval)
        if len(got) < 2:
            raise SplitinferError(f"{len(got)} frame(s) given; a bottleneck needs at least 2")
        k = min(n_eval, max(1, len(got) // 5))
        return got[:-k], got[-k:]
    if source in ("scene", "synthetic"):
        train = list(frames_from(source, plan.inputs, n_train, seed=seed, flag="--frames"))
        held = list(frames_from(source, plan.inputs, n_eval, seed=seed + 7919, flag="--frames"))
        return train, held
    got = list(frames_from(source, plan.inputs, n_train + n_eval, seed=seed, flag="--frames"))
    if len(got) < 2:
        raise SplitinferError(f"--frames {source}: {len(got)} frame(s); a bottleneck needs at least 2 (one to learn "
                              "from, one to measure on)")
    k = min(n_eval, max(1, len(got) // 5))
    return got[:-k], got[-k:]


@dataclass
class Trained:
    """A trained bottleneck: its parameters (``bottleneck_graph.weights_of`` names) and how it was made."""

    at: str
    cut_channels: int
    channels: int
    stride: int
    hidden: int
    weights: dict[str, np.ndarray]
    distilled: str
    report: TrainReport
    rate_weight: float
    seed: int
    unsupported_ops: list[str] = field(default_factory=list)


def save_weights(trained: Trained, path: str | os.PathLike[str]) -> None:
    """The weights and how they were made, as one ``.npz`` (no pickles), written atomically."""
    meta = {"at": trained.at, "cut_channels": trained.cut_channels, "channels": trained.channels,
            "stride": trained.stride, "hidden": trained.hidden, "distilled": trained.distilled,
            "rate_weight": trained.rate_weight, "seed": trained.seed, "unsupported_ops": trained.unsupported_ops,
            "steps": trained.report.steps, "seconds": round(trained.report.seconds, 1)}
    dest = Path(path)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **trained.weights)
    os.replace(tmp, dest)


def load_weights(path: str | os.PathLike[str]) -> Trained:
    """:func:`save_weights`'s file, checked: every parameter the architecture needs, of its shape."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["__meta__"]).decode())
            weights = {k: np.asarray(z[k], np.float32) for k in z.files if k != "__meta__"}
        c, k, s, h = (int(meta[key]) for key in ("cut_channels", "channels", "stride", "hidden"))
        at, distilled = str(meta["at"]), str(meta["distilled"])
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise SplitinferError(f"--weights {path}: not a bottleneck weights file: {exc}") from None
    want = {"encoder.0.weight": (h, c, 3, 3), "encoder.0.bias": (h,), "encoder.2.weight": (k, h, 3, 3),
            "encoder.2.bias": (k,), "decoder.0.weight": (h, k, 3, 3), "decoder.0.bias": (h,),
            "decoder.3.weight": (h, h, 3, 3), "decoder.3.bias": (h,), "decoder.5.weight": (c, h, 3, 3),
            "decoder.5.bias": (c,), "mu": (k,), "log_scale": (k,)}
    for key, shape in want.items():
        got = weights.get(key)
        if got is None or got.shape != shape or not np.isfinite(got).all():
            raise SplitinferError(f"--weights {path}: parameter {key!r} should be finite of shape {list(shape)}, got "
                                  f"{None if got is None else list(got.shape)}")
    report = TrainReport(steps=int(meta.get("steps", 0)), seconds=float(meta.get("seconds", 0.0)))
    return Trained(at, c, k, s, h, {key: weights[key] for key in want}, distilled, report,
                   float(meta.get("rate_weight", math.nan)), int(meta.get("seed", 0)),
                   [str(x) for x in meta.get("unsupported_ops") or []])


def _train(back_model: onnx.ModelProto, pool: np.ndarray, spec: TensorSpec, channels: int, stride: int, hidden: int,
           minutes: float, rate_weight: float, seed: int, threads: int | None, back: Any,
           step: Progress) -> Trained:
    import torch

    missing = [] if back is not None else unsupported(back_model)
    if back is None and not missing:
        back = OnnxModule(back_model)
    cfg = BottleneckConfig(channels=channels, stride=stride, hidden=hidden, rate_weight=rate_weight,
                           seconds=60.0 * minutes, seed=seed)
    model = build_bottleneck(spec.shape[1], cfg)
    rng = np.random.default_rng(seed)

    def batches() -> Any:
        order = rng.permutation(len(pool))
        for k in range(0, len(order), cfg.batch):
            yield torch.from_numpy(pool[order[k:k + cfg.batch]])

    if threads:
        torch.set_num_threads(threads)
    report = train_bottleneck(model, back, batches, spec.name, cfg,
                              progress=lambda what, frac: step(f"training: {what}", 0.05 + 0.8 * frac))
    return Trained(spec.name, spec.shape[1], channels, stride, hidden, weights_of(model),
                   "outputs" if back is not None else "features", report, rate_weight, seed, missing)


def _next_id(plan: Plan) -> str:
    ids = {c.id for c in plan.candidates}
    k = 1
    while f"b{k}" in ids:
        k += 1
    return f"b{k}"


def _measure(root: Path, cand: Candidate, whole: Any, held: Sequence[Mapping[str, np.ndarray]],
             output_names: Sequence[str], threads: int | None) -> tuple[Rung, float]:
    """Mean rans bytes a frame and fidelity on the held-out frames, run as the edge and cloud will."""
    assert cand.edge is not None and cand.cloud is not None and cand.bottleneck is not None
    edge = make_session(str(root / cand.edge.file), threads=threads)
    cloud = make_session(str(root / cand.cloud.file), threads=threads)
    latent, tables = cand.bottleneck.latent, cand.bottleneck.tables
    sizes, bits, worst = [], [], 0.0
    for f in held:
        want = dict(zip(output_names, whole.run(list(output_names), dict(f))))
        y = edge.run([latent], {k: f[k] for k in cand.edge.inputs})[0]
        enc = encode_tensor(y, "rans", tables=tables)
        sizes.append(enc.nbytes)
        back = decode_tensor(enc, tables=tables)
        bits.append(tables.bits(back.astype(np.int64)))
        got = dict(zip(cand.cloud.outputs, cloud.run(list(cand.cloud.outputs), {latent: back})))
        worst = max([worst] + [rel_error(got[n], want[n]) for n in cand.cloud.outputs])
    fidelity = max(0.0, 1.0 - worst) if math.isfinite(worst) else 0.0
    return Rung("rans", int(round(float(np.mean(sizes)))), fidelity), float(np.mean(bits))


def _runs_at_batch_2(model: onnx.ModelProto, latent: TensorSpec) -> bool:
    """Whether a cloud segment made batch-dynamic really runs two requests at once (a back segment
    may hold a reshape fixed at batch 1)."""
    import onnxruntime as ort

    try:
        sess = make_session(model.SerializeToString(), level="basic")
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4
        sess.run(None, {latent.name: np.zeros((2, *latent.shape[1:]), np.float32)}, quiet)
        return True
    except Exception:
        return False


def _profiles(plan: Plan, root: Path, cand: Candidate, threads: int | None, budget_s: float) -> dict[str, Any]:
    """The plan's profiles with the new candidate's times: measured here for profiles of this
    machine's role ``both`` (the split host), scaled by each other profile's whole-model time
    against this machine's for the rest (marked ``estimated``: re-profile on the device to replace)."""
    assert cand.edge is not None and cand.cloud is not None
    feeds = {t.name: np.zeros(t.shape, t.dtype) for t in plan.inputs}
    whole_ms = time_session(make_session(str(plan.model_file), threads=threads), feeds, budget_s=budget_s)
    edge = make_session(str(root / cand.edge.file), threads=threads)
    edge_ms = time_session(edge, feeds, budget_s=budget_s)
    latent = edge.run(None, feeds)[0]
    cloud_ms = time_session(make_session(str(root / cand.cloud.file), threads=threads),
                            {cand.cut[0].name: latent}, budget_s=budget_s)
    out: dict[str, Any] = {}
    for name, prof in plan.profiles.items():
        p = dict(prof)
        measured = p.get("role") == "both"
        scale = 1.0 if measured else float(p.get("whole_ms") or whole_ms) / whole_ms
        times = {"edge_ms": edge_ms * scale, "cloud_ms": cloud_ms * scale}
        if not measured:
            times["estimated"] = True
        p["candidates"] = {**dict(p.get("candidates") or {}), cand.id: times}
        out[name] = p
    return out


def add_bottleneck(plan_path: str | os.PathLike[str], at: str | Sequence[str] | None, *, frames: Frames = "scene",
                   train_frames: int = 256, eval_frames: int = 16, channels: int = 12, stride: int = 2,
                   hidden: int = 64, minutes: float = 10.0, rate_weight: float = 0.01, seed: int = 0,
                   threads: int | None = None, budget_s: float = 0.5, back: Any = None,
                   weights: str | os.PathLike[str] | None = None, save: str | os.PathLike[str] | None = None,
                   progress: Progress | None = None) -> BottleneckResult:
    """Train a bottleneck at ``at`` and add it to the plan at ``plan_path`` as a new candidate.

    ``frames``: a source name (``scene``, a video file, a directory of images) or the frames
    themselves (input dicts; the last ``eval_frames`` are held out). ``back``: optionally the
    model's rest after ``at`` as a torch callable (``{at: tensor} ->
    {output: tensor}``), e.g. from the PyTorch module the plan was split from; by default the
    plan's own cloud segment runs in torch (``onnx_torch.py``). ``weights``: attach a bottleneck
    trained before (an ``.npz`` written with ``save``; its shape parameters and cut come with it)
    instead of training: no torch needed. ``save``: also write the trained weights there. Raises a
    :class:`~splitinfer.errors.SplitinferError` naming the problem, leaving the plan as it was."""
    t_start = time.monotonic()

    def step(what: str, frac: float) -> None:
        if progress:
            progress(what, frac)

    for name, value, low in (("channels", channels, 1), ("stride", stride, 1), ("hidden", hidden, 1)):
        if not isinstance(value, int) or value < low or value > 4096:
            raise SplitinferError(f"--{name} must be an integer in [{low}, 4096], got {value!r}")
    if not (math.isfinite(minutes) and minutes > 0) or not (math.isfinite(rate_weight) and rate_weight >= 0):
        raise SplitinferError(f"--minutes must be > 0 and --rate-weight >= 0, got {minutes} and {rate_weight}")
    plan = Plan.load(plan_path)
    given = load_weights(weights) if weights is not None else None
    if at is None and given is None:
        raise SplitinferError("--at: where the bottleneck goes (a candidate or a tensor), unless --weights says")
    step("loading the model", 0.0)
    lm = load_model(str(plan.model_file), input_shapes={t.name: t.shape for t in plan.inputs})
    graph = analyse(lm.static)
    spec = _cut_tensor(plan, graph, _resolve_at(plan, at if at is not None else given.at), "--at")  # type: ignore[union-attr]
    cid = _next_id(plan)
    cut = cut_from_tensors(graph, [spec.name])
    seg = build_segments(graph, cut, Extractor(lm.static), cid, batch_dynamic=False)
    assert seg.edge is not None and seg.cloud is not None
    step("running the frozen front on the frames", 0.02)
    train, held = _frames(plan, frames, train_frames if given is None else 0, eval_frames, seed)
    if given is None:
        front = make_session(seg.edge.SerializeToString(), threads=threads)
        pool = np.concatenate([front.run([spec.name], {k: f[k] for k in seg.edge_inputs})[0] for f in train], 0)
        trained = _train(seg.cloud, pool, spec, channels, stride, hidden, minutes, rate_weight, seed, threads, back,
                         step)
    else:
        trained = given
        if trained.at != spec.name or trained.cut_channels != spec.shape[1]:
            raise SplitinferError(f"--weights {weights}: trained at {trained.at!r} ({trained.cut_channels} channels), "
                                  f"not at {spec.name!r} ({spec.shape[1]} channels)")
    report, distilled, missing = trained.report, trained.distilled, trained.unsupported_ops
    channels, stride, hidden, weights_ = trained.channels, trained.stride, trained.hidden, trained.weights
    step("exporting the bottleneck into the segments", 0.86)
    tables = logistic_tables(weights_["mu"], np.exp(weights_["log_scale"].astype(np.float64)))
    lh, lw = latent_hw(spec.shape[2], spec.shape[3], stride)
    latent = TensorSpec(f"{cid}.latent", (1, channels, lh, lw), "float32")
    edge_model = edge_with_encoder(seg.edge, weights_, cid, spec.name, latent, stride)
    cloud_model = cloud_with_decoder(seg.cloud, weights_, cid, spec, latent, stride)
    batched = onnx.ModelProto()
    batched.CopyFrom(cloud_model)
    if relax_batch(batched) and _runs_at_batch_2(batched, latent):  # else the cloud runs it one request at a time
        cloud_model = batched
    batchable = cloud_model is batched
    if save is not None:  # before the plan is touched: a bad --save path changes nothing
        save_weights(trained, save)
    enc_flops, dec_flops = bottleneck_flops(spec, channels, hidden, stride)
    record = BottleneckRecord(spec.name, latent.name, channels, stride, hidden, tables, distilled, {
        "frames": {"source": "given" if not isinstance(frames, str) else frames if frames in ("scene", "synthetic")
                   else Path(frames).name or frames,
                   "train": len(train), "held_out": len(held)},
        "seconds": round(report.seconds, 1), "steps": report.steps, "rate_weight": trained.rate_weight,
        "seed": trained.seed, **({"weights": Path(weights).name} if weights is not None else {}),
        **({"unsupported_ops": missing} if missing else {})})
    edge_flops = cut.edge_flops(graph)
    with atomic_directory(plan.path, force=True) as tmp:
        for entry in plan.path.iterdir():
            if entry.name.startswith("."):
                continue
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, tmp / entry.name)
        refs = {}
        for side, m, ins, outs in (("edge", edge_model, seg.edge_inputs, [latent.name]),
                                   ("cloud", cloud_model, [latent.name], seg.cloud_outputs)):
            rel = f"segments/{cid}_{side}.onnx"
            onnx.save_model(m, str(tmp / rel))
            refs[side] = SegmentRef(rel, sha256_file(tmp / rel), tuple(ins), tuple(outs), side == "cloud" and batchable)
        cand = Candidate(cid, "split", (latent,), refs["edge"], refs["cloud"], (), edge_flops + enc_flops,
                         graph.total_flops - edge_flops + dec_flops, len(cut.edge_nodes), (), record)
        step("measuring bytes and fidelity on held-out frames", 0.9)
        whole = make_session(str(plan.model_file), threads=threads)
        rung, bits = _measure(tmp, cand, whole, held, plan.output_names, threads)
        cand = dataclasses.replace(cand, wire=(rung,))
        manifest = dict(plan.manifest)
        cands = list(manifest["candidates"])
        at_edge = next((k for k, c in enumerate(cands) if c["kind"] == "edge"), len(cands))
        cands.insert(at_edge, cand.to_json())
        manifest["candidates"] = cands
        manifest["plan_hash"] = plan_hash(manifest)
        step("timing it here", 0.94)
        manifest["profiles"] = _profiles(plan, tmp, cand, threads, budget_s)
        write_json_atomic(tmp / "manifest.json", manifest)
        new = Plan.load(tmp)
        step("verifying", 0.97)
        check = verify_candidate(new, new.candidate(cid), threads=threads)
        if not check.ok:
            raise VerificationError(f"bottleneck {cid}: {check.problem}")
        if (tmp / "report.png").exists() and new.profiles:
            from .report import write_report_png

            write_report_png(new, tmp / "report.png")
    step("done", 1.0)
    final = Plan.load(plan.path)
    return BottleneckResult(final, cid, spec.name, rung, distilled, missing, report, bits,
                            {"train": len(train), "held_out": len(held)}, time.monotonic() - t_start)

