"""Floating-point operation counts per ONNX node, from static shapes.

Heavy ops are counted exactly as multiply-adds × 2 (Conv, ConvTranspose, MatMul, Gemm,
Einsum is not); every other op with a float output is counted as one operation per output
element, and a few reductions (Softmax, LayerNormalization) as five. The counts feed the cost
model's fallback and the report; measured times, not FLOPs, pick the cuts when profiling is on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import onnx
from onnx import helper

__all__ = ["node_flops", "HEAVY_OPS"]

HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})

# Ops that move or reshape data: no arithmetic.
_FREE_OPS = frozenset(
    {
        "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split", "Slice",
        "Gather", "Identity", "Shape", "Constant", "ConstantOfShape", "Expand", "Cast", "Pad",
        "Tile", "Range", "Size", "Dropout",
    }
)
_FIVE_PER_ELEMENT = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization",
                               "InstanceNormalization", "GroupNormalization"})

Shape = Sequence[int]


def _prod(xs: Sequence[int]) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _conv(node: onnx.NodeProto, shape: Callable[[str], Shape | None]) -> int:
    out, w = shape(node.output[0]), shape(node.input[1])
    if out is None or w is None:
        return 0
    macs = _prod(out) * _prod(w[1:])  # each output element: Cin/g * prod(k) MACs
    bias = _prod(out) if len(node.input) > 2 and node.input[2] else 0
    return 2 * macs + bias


def _conv_transpose(node: onnx.NodeProto, shape: Callable[[str], Shape | None]) -> int:
    x, w = shape(node.input[0]), shape(node.input[1])
    if x is None or w is None:
        return 0
    # every input element meets Cout/g * prod(k) weights
    return 2 * _prod(x) * _prod(w[1:])


def _matmul(node: onnx.NodeProto, shape: Callable[[str], Shape | None]) -> int:
    a, out = shape(node.input[0]), shape(node.output[0])
    if a is None or out is None or not a:
        return 0
    return 2 * _prod(out) * int(a[-1])


def _gemm(node: onnx.NodeProto, shape: Callable[[str], Shape | None]) -> int:
    a, out = shape(node.input[0]), shape(node.output[0])
    if a is None or out is None or len(a) != 2:
        return 0
    k = a[0] if _attr(node, "transA", 0) else a[1]
    bias = _prod(out) if len(node.input) > 2 and node.input[2] else 0
    return 2 * _prod(out) * int(k) + bias


_HEAVY: dict[str, Callable[[onnx.NodeProto, Callable[[str], Shape | None]], int]] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MatMul": _matmul,
    "Gemm": _gemm,
}


def node_flops(node: onnx.NodeProto, shapes: Mapping[str, Shape]) -> int:
    """FLOPs of one node given the static shapes of its tensors (missing shapes count 0)."""

    def shape(name: str) -> Shape | None:
        return shapes.get(name)

    fn = _HEAVY.get(node.op_type)
    if fn is not None:
        return fn(node, shape)
    if node.op_type in _FREE_OPS or not node.output:
        return 0
    out = shape(node.output[0])
    if out is None:
        return 0
    per = 5 if node.op_type in _FIVE_PER_ELEMENT else 1
    return per * _prod(out)
