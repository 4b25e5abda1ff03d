"""What a cut costs on the wire, measured: each tensor's bytes under each codec, and each
candidate's ladder of codec settings with the bytes and the fidelity of every rung.

Raw fp32 sizes rank cuts wrongly. A 640² image is 4.8 MiB as fp32 and some 50 KB as a JPEG; an
activation after a ReLU or SiLU is mostly near zero, and int8 + zstd takes it to a fraction of its
int8 size. So at split time the whole model runs on a few sample frames (rendered road scenes for
an image input unless frames are given; random inputs otherwise, and the plan says which), with
every tensor a cut could cross exposed, and each tensor is encoded exactly as it travels
(:mod:`splitinfer.codecs`):

* the min-cut sweep prices a tensor at its mean bytes under :data:`SWEEP_CODEC` (an image input at
  a JPEG of :data:`JPEG_DEFAULT_QUALITY`, what the all-cloud candidate sends), so cuts enter the
  candidate set when compression makes them pay (:func:`measure_tensors`);
* every candidate records its ladder (:func:`candidate_ladder`): for each codec (and, for an image
  input, JPEG at each of :data:`JPEG_QUALITIES`) the mean bytes a frame's cut takes and its
  *fidelity*, ``1 - e`` where ``e`` is the largest relative L2 error of a model output when the cut
  crosses with that setting (``||y' - y|| / ||y||`` against the whole model, the worst over the
  sample frames and outputs). Lossless compressors share their base's fidelity.

A codec that cannot carry a tensor (int8 or fp16 of non-finite values, fp16 beyond its range) is
left out of that candidate's ladder, and the sweep prices such a tensor at fp32.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from .._types import PixelFormat, TensorSpec
from ..codecs import Codec, compressed, decode_tensor, encode_tensor
from ..errors import CodecError
from .graph import ModelGraph
from .plan import Rung
from .profiler import make_session

__all__ = ["TensorBytes", "Rung", "measure_tensors", "cut_samples", "candidate_ladder", "rel_error", "MEASURED_CODECS", "SWEEP_CODEC",
           "JPEG_QUALITIES", "JPEG_DEFAULT_QUALITY", "DEFAULT_SAMPLES"]

MEASURED_CODECS: tuple[str, ...] = ("fp16", "int8", "int8+lz4", "int8+zstd")
SWEEP_CODEC = "int8+zstd"
JPEG_QUALITIES: tuple[int, ...] = (30, 50, 70, 90)
JPEG_DEFAULT_QUALITY = 90  # the edge agent's default (--jpeg-quality)
DEFAULT_SAMPLES = 4


@dataclass
class TensorBytes:
    """Mean encoded bytes of each cuttable tensor under each codec, over the sample frames."""

    by_codec: dict[str, dict[str, float]]  # tensor -> codec -> mean bytes (a codec that failed: absent)
    image_input: str | None  # the image input's name, priced at JPEG in the sweep
    frames: int

    def sweep_bytes(self, graph: ModelGraph) -> dict[str, float]:
        """What the min-cut sweep pays for each tensor: :data:`SWEEP_CODEC`'s bytes, an image input's
        JPEG at the default quality, fp32 where neither could be measured."""
        out: dict[str, float] = {}
        for name, spec in graph.tensors.items():
            got = self.by_codec.get(name, {})
            key = f"jpeg:{JPEG_DEFAULT_QUALITY}" if name == self.image_input else SWEEP_CODEC
            out[name] = got.get(key, got.get(SWEEP_CODEC, float(spec.nbytes)))
        return out


def _exposed_session(graph: ModelGraph, names: Sequence[str], threads: int | None) -> Any:
    """An onnxruntime session of the whole model with ``names`` as extra outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(graph.model)
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            spec = graph.tensors[n]
            m.graph.output.append(onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)), list(spec.shape)))
    return make_session(m.SerializeToString(), threads=threads, level="basic")


def _cuttable(graph: ModelGraph) -> list[str]:
    names = [t.name for t in graph.inputs]
    for n in graph.compute_nodes():
        names.extend(o for o in n.outputs if graph.is_cuttable(o))
    return list(dict.fromkeys(names))


def _sizes(arr: np.ndarray, pixels: PixelFormat | None, is_image: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    bases: dict[str, Any] = {}
    for codec in MEASURED_CODECS:
        base, _, comp = codec.partition("+")
        try:
            if base not in bases:
                bases[base] = encode_tensor(arr, base)  # quantised once, then compressed each way
            enc = bases[base] if not comp else compressed(bases[base], comp)
        except CodecError:
            continue
        out[codec] = enc.nbytes
    if is_image:
        for q in sorted({*JPEG_QUALITIES, JPEG_DEFAULT_QUALITY}):
            out[f"jpeg:{q}"] = encode_tensor(arr, "jpeg", pixels=pixels, quality=q).nbytes
    return out


def measure_tensors(graph: ModelGraph, frames: Iterable[Mapping[str, np.ndarray]], *,
                    pixels: Mapping[str, PixelFormat | None] | None = None, image_input: str | None = None,
                    threads: int | None = None) -> TensorBytes:
    """Run the whole model on ``frames`` with every cuttable tensor exposed and measure each one's
    encoded bytes per codec (the mean over the frames)."""
    names = _cuttable(graph)
    sess = _exposed_session(graph, [n for n in names if n not in {t.name for t in graph.inputs}], threads)
    outs = [o.name for o in sess.get_outputs()]
    pix = dict(pixels or {})
    totals: dict[str, dict[str, float]] = {}
    counts: dict[tuple[str, str], int] = {}
    k = 0
    for k, feed in enumerate(frames, 1):
        values = dict(zip(outs, sess.run(outs, {t.name: feed[t.name] for t in graph.inputs})))
        values.update({t.name: np.asarray(feed[t.name]) for t in graph.inputs})
        for n in names:
            sizes = _sizes(values[n], pix.get(n), n == image_input)
            acc = totals.setdefault(n, {})
            for codec, b in sizes.items():
                acc[codec] = acc.get(codec, 0.0) + b
                counts[n, codec] = counts.get((n, codec), 0) + 1
        del values
    if k == 0:
        raise ValueError("no sample frames to measure wire sizes on")
    # a codec counts for a tensor only if it carried the tensor on every frame
    mean = {n: {c: v / k for c, v in acc.items() if counts[n, c] == k} for n, acc in totals.items()}
    return TensorBytes(mean, image_input, k)


def cut_samples(graph: ModelGraph, tensors: Iterable[str], frames: Iterable[Mapping[str, np.ndarray]], *,
                threads: int | None = None) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """For each frame, the values of ``tensors`` (and the model inputs) and the whole model's outputs."""
    inputs = {t.name for t in graph.inputs}
    wanted = [t for t in dict.fromkeys(tensors) if t not in inputs]
    sess = _exposed_session(graph, wanted, threads)
    outs = [o.name for o in sess.get_outputs()]
    model_outs = {t.name for t in graph.outputs}
    values, whole = [], []
    for feed in frames:
        got = dict(zip(outs, sess.run(outs, {n: feed[n] for n in inputs})))
        values.append({**{n: got[n] for n in wanted}, **{n: np.asarray(feed[n]) for n in inputs}})
        whole.append({n: v for n, v in got.items() if n in model_outs})
    return values, whole


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    want64 = want.astype(np.float64).ravel()
    diff = got.astype(np.float64).ravel() - want64
    if not np.all(np.isfinite(diff)):
        return float("inf")
    norm = float(np.linalg.norm(want64))
    err = float(np.linalg.norm(diff))
    return err / norm if norm > 0 else (0.0 if err == 0 else float("inf"))


def candidate_ladder(cut: Sequence[TensorSpec], cloud_model: bytes | None, passthrough: Sequence[str],
                     output_names: Sequence[str], samples: Sequence[Mapping[str, np.ndarray]],
                     whole_outputs: Sequence[Mapping[str, np.ndarray]], tensor_bytes: TensorBytes, *,
                     pixels: Mapping[str, PixelFormat | None] | None = None, threads: int | None = None) -> list[Rung]:
    """The ladder of a candidate whose cut is ``cut`` and whose cloud segment is ``cloud_model``
    (serialised ONNX). ``samples[k]`` holds frame ``k``'s cut tensors; ``whole_outputs[k]`` the
    whole model's outputs on it. A local candidate (nothing crosses) has no ladder."""
    if cloud_model is None or not cut:
        return []
    sess = make_session(cloud_model, threads=threads, level="basic")
    seg_outs = [o.name for o in sess.get_outputs()]
    seg_ins = [i.name for i in sess.get_inputs()]
    pix = dict(pixels or {})
    image = tensor_bytes.image_input
    settings: list[tuple[str, int | None]] = [(c, None) for c in MEASURED_CODECS]
    if len(cut) == 1 and cut[0].name == image:
        settings += [("jpeg", q) for q in JPEG_QUALITIES]
    fidelity: dict[tuple[str, int | None], float] = {}
    rungs: list[Rung] = []
    for codec, q in settings:
        key = codec if q is None else f"jpeg:{q}"
        sizes = [tensor_bytes.by_codec.get(t.name, {}).get(key) for t in cut]
        if any(s is None for s in sizes):
            continue  # this codec cannot carry one of the cut's tensors
        base = (Codec.parse(codec).base, q)
        if base not in fidelity:
            worst = 0.0
            for sample, want in zip(samples, whole_outputs):
                try:
                    crossed = {t.name: decode_tensor(encode_tensor(sample[t.name], codec, pixels=pix.get(t.name),
                                                                   quality=q), pixels=pix.get(t.name))
                               for t in cut}
                except CodecError:
                    worst = float("inf")
                    break
                got = dict(zip(seg_outs, sess.run(seg_outs, {n: crossed[n] for n in seg_ins})))
                for name in output_names:
                    y = got[name] if name in got else crossed[name] if name in passthrough else None
                    if y is not None:
                        worst = max(worst, rel_error(y, want[name]))
            fidelity[base] = worst
        if not np.isfinite(fidelity[base]):
            continue
        rungs.append(Rung(codec, int(round(sum(s for s in sizes if s is not None))), max(0.0, 1.0 - fidelity[base]), q))
    return rungs
