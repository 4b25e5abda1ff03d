"""A trained bottleneck as ONNX: the encoder spliced onto the end of the edge segment, the decoder
onto the start of the cloud segment.

The parts are written as ONNX nodes directly from the trained weights (no torch exporter: the
architecture is fixed — ``bottleneck.py`` — and the nodes are a handful of opset-11 operators
that every runtime has, so the segments keep the model's own opset):

* edge: ``front → Conv 3x3 → SiLU → Conv 3x3 /stride → Round`` and the segment's one output is the
  latent (integers in a float tensor; the ``rans`` codec clips it to the tables' range and codes it);
* cloud: ``latent → Conv 3x3 → SiLU → Resize x stride (nearest) → Conv 3x3 → SiLU → Conv 3x3 →
  Slice to the cut's height and width → back``.

SiLU is ``x * Sigmoid(x)``; ``Resize`` uses the ``asymmetric`` transform with ``floor``, which is
``torch.nn.Upsample(mode="nearest")`` at an integer scale. The test runs both and compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._types import TensorSpec
from ..errors import UnsupportedModelError

__all__ = ["MIN_OPSET", "latent_hw", "weights_of", "edge_with_encoder", "cloud_with_decoder", "bottleneck_flops"]

MIN_OPSET = 11  # Round, and Resize with scales


def latent_hw(height: int, width: int, stride: int) -> tuple[int, int]:
    """The latent's height and width for a cut of ``height`` x ``width`` (3x3 conv, padding 1)."""
    return (height - 1) // stride + 1, (width - 1) // stride + 1


def weights_of(module: Any) -> dict[str, np.ndarray]:
    """The trained parts' parameters as float32 arrays, by their names in ``build_bottleneck``."""
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in module.state_dict().items()}


def bottleneck_flops(cut: TensorSpec, channels: int, hidden: int, stride: int) -> tuple[int, int]:
    """Multiply-adds x 2 of the encoder (edge) and the decoder (cloud) at batch 1."""
    c, h, w = cut.shape[1], cut.shape[2], cut.shape[3]
    lh, lw = latent_hw(h, w, stride)
    uh, uw = lh * stride, lw * stride
    enc = 2 * 9 * (c * hidden * h * w + hidden * channels * lh * lw)
    dec = 2 * 9 * (channels * hidden * lh * lw + hidden * hidden * uh * uw + hidden * c * uh * uw)
    return enc, dec


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


class _Builder:
    """Nodes and initializers under one name prefix, none clashing with the host graph's names."""

    def __init__(self, prefix: str, taken: set[str]) -> None:
        self.prefix, self.taken = prefix, taken
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def name(self, what: str) -> str:
        n = f"{self.prefix}/{what}"
        if n in self.taken:
            raise UnsupportedModelError(f"bottleneck: the model already has a tensor or node named {n!r}")
        self.taken.add(n)
        return n

    def const(self, what: str, value: np.ndarray) -> str:
        n = self.name(what)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def node(self, op: str, inputs: Sequence[str], what: str, out: str | None = None, **attrs: Any) -> str:
        y = out or self.name(what)
        self.nodes.append(helper.make_node(op, list(inputs), [y], name=self.name(what + ":node"), **attrs))
        return y

    def conv(self, x: str, w: Mapping[str, np.ndarray], key: str, stride: int = 1, out: str | None = None) -> str:
        weight = self.const(f"{key}.weight", w[f"{key}.weight"])
        bias = self.const(f"{key}.bias", w[f"{key}.bias"])
        return self.node("Conv", [x, weight, bias], key, out, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         strides=[stride, stride])

    def silu(self, x: str, what: str) -> str:
        return self.node("Mul", [x, self.node("Sigmoid", [x], what + ".sigmoid")], what)


def _names(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    names = {n.name for n in g.node} | {o for n in g.node for o in n.output} | {i.name for i in g.initializer}
    return names | {i.name for i in g.input} | {o.name for o in g.output}


def _check(model: onnx.ModelProto, what: str) -> None:
    if _opset(model) < MIN_OPSET:
        raise UnsupportedModelError(f"bottleneck: the {what} segment is opset {_opset(model)}; a bottleneck needs "
                                    f"opset >= {MIN_OPSET} (Round, Resize)")


def edge_with_encoder(front: onnx.ModelProto, weights: Mapping[str, np.ndarray], prefix: str, at: str,
                      latent: TensorSpec, stride: int) -> onnx.ModelProto:
    """``front`` (whose one output is ``at``) with the encoder after it: its one output ``latent``."""
    _check(front, "edge")
    if [o.name for o in front.graph.output] != [at]:
        raise UnsupportedModelError(f"bottleneck: the edge segment should output only {at!r}, it outputs "
                                    f"{[o.name for o in front.graph.output]}")
    m = onnx.ModelProto()
    m.CopyFrom(front)
    b = _Builder(prefix, _names(m))
    h = b.silu(b.conv(at, weights, "encoder.0"), "encoder.1")
    y = b.conv(h, weights, "encoder.2", stride=stride)
    b.node("Round", [y], "round", out=latent.name)
    m.graph.node.extend(b.nodes)
    m.graph.initializer.extend(b.inits)
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info(latent.name, TensorProto.FLOAT, list(latent.shape)))
    m.graph.name = f"{prefix}_edge"
    onnx.checker.check_model(m)
    return m


def cloud_with_decoder(back: onnx.ModelProto, weights: Mapping[str, np.ndarray], prefix: str, at: TensorSpec,
                       latent: TensorSpec, stride: int) -> onnx.ModelProto:
    """``back`` (whose one input is ``at``) with the decoder before it, reading ``latent``."""
    _check(back, "cloud")
    if [i.name for i in back.graph.input] != [at.name]:
        raise UnsupportedModelError(f"bottleneck: the cloud segment should read only {at.name!r}, it reads "
                                    f"{[i.name for i in back.graph.input]}")
    m = onnx.ModelProto()
    m.CopyFrom(back)
    b = _Builder(prefix, _names(m))
    b.taken.discard(at.name)
    h = b.silu(b.conv(latent.name, weights, "decoder.0"), "decoder.1")
    if stride > 1:
        roi = b.const("resize.roi", np.zeros(0, np.float32))
        scales = b.const("resize.scales", np.array([1, 1, stride, stride], np.float32))
        h = b.node("Resize", [h, roi, scales], "decoder.2", mode="nearest",
                   coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    h = b.silu(b.conv(h, weights, "decoder.3"), "decoder.4")
    height, width = at.shape[2], at.shape[3]
    lh, lw = latent_hw(height, width, stride)
    if (lh * stride, lw * stride) != (height, width):
        out = b.conv(h, weights, "decoder.5")
        b.node("Slice", [out, b.const("crop.starts", np.array([0, 0], np.int64)),
                         b.const("crop.ends", np.array([height, width], np.int64)),
                         b.const("crop.axes", np.array([2, 3], np.int64))], "crop", out=at.name)
    else:
        b.conv(h, weights, "decoder.5", out=at.name)
    nodes = list(b.nodes) + list(m.graph.node)  # the decoder first: the graph stays in topological order
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.extend(b.inits)
    del m.graph.input[:]
    m.graph.input.append(helper.make_tensor_value_info(latent.name, TensorProto.FLOAT, list(latent.shape)))
    del m.graph.value_info[:]  # shapes inferred for the old input no longer bind anything
    m.graph.name = f"{prefix}_cloud"
    onnx.checker.check_model(m)
    return m
