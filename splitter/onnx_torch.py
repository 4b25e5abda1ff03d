"""An ONNX graph run in PyTorch: differentiable, for training through a frozen segment.

A learned bottleneck is trained by distillation through the frozen rest of the model (the cloud
segment): the loss compares the model's outputs, so gradients must flow through that segment's
operators. onnx2torch would do it but imports torchvision, whose operators do not load beside
torch 2.13 here; this is a small interpreter of the operators detectors and classifiers are made
of. Weights become frozen buffers; each node is the matching ``torch`` call, evaluated in the
graph's (topological) order. :func:`unsupported` names the operators a graph uses that are not
covered, so a caller can say which before any work (and fall back to distilling the cut tensors).

    >>> import onnx, torch
    >>> module = OnnxModule(onnx.load("segments/c1_cloud.onnx"))  # doctest: +SKIP
    >>> outputs = module({"getitem_20": torch.zeros(1, 64, 8, 8)})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import SplitinferError

__all__ = ["OnnxModule", "unsupported", "SUPPORTED_OPS"]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads(pads: list[int] | None, rank: int) -> tuple[list[int], bool]:
    """ONNX pads (begin..., end...) -> F.pad order (last dim first); and whether they are symmetric."""
    if not pads:
        return [0] * (2 * rank), True
    begin, end = pads[:rank], pads[rank:]
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [int(b), int(e)]
    return out, list(begin) == list(end)


def _ints(t: Any) -> list[int]:
    return [int(v) for v in t.detach().cpu().reshape(-1).tolist()]


def _conv(torch: Any, F: Any, x: Any, w: Any, b: Any, a: dict[str, Any]) -> Any:
    rank = w.dim() - 2
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise SplitinferError(f"Conv auto_pad={a['auto_pad']!r} is not supported (explicit pads only)")
    pads, sym = _pads(a.get("pads"), rank)
    stride, dil, groups = a.get("strides", [1] * rank), a.get("dilations", [1] * rank), a.get("group", 1)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    if sym:
        return conv(x, w, b, stride, pads[::2][::-1], dil, groups)
    return conv(F.pad(x, pads), w, b, stride, 0, dil, groups)


def _maxpool(torch: Any, F: Any, x: Any, a: dict[str, Any]) -> Any:
    k = a["kernel_shape"]
    rank = len(k)
    pads, sym = _pads(a.get("pads"), rank)
    stride = a.get("strides", [1] * rank)
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank]
    ceil = bool(a.get("ceil_mode", 0))
    dil = a.get("dilations", [1] * rank)
    if sym and all(p <= kk // 2 for p, kk in zip(pads[::2], reversed(k))):
        return pool(x, k, stride, pads[::2][::-1], dil, ceil_mode=ceil)
    return pool(F.pad(x, pads, value=float("-inf")), k, stride, 0, dil, ceil_mode=ceil)


def _resize(torch: Any, F: Any, x: Any, roi: Any, scales: Any, sizes: Any, a: dict[str, Any]) -> Any:
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = a.get("coordinate_transformation_mode", b"half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    if sizes is not None and sizes.numel():
        size = _ints(sizes)[2:]
    else:
        sc = [float(v) for v in scales.reshape(-1).tolist()]
        if sc[:2] != [1.0, 1.0]:
            raise SplitinferError("Resize of the batch or channel axes is not supported")
        size = [int(np.floor(d * s)) for d, s in zip(x.shape[2:], sc[2:])]
    if mode == "nearest":
        nm = a.get("nearest_mode", b"round_prefer_floor")
        nm = nm.decode() if isinstance(nm, bytes) else nm
        if ctm == "asymmetric" and nm == "floor":
            return F.interpolate(x, size=size, mode="nearest")
        integer = all(o % i == 0 for o, i in zip(size, x.shape[2:]))
        if integer and ctm in ("asymmetric", "half_pixel", "pytorch_half_pixel"):  # integer upsampling: the same pixels
            return F.interpolate(x, size=size, mode="nearest")
        raise SplitinferError(f"Resize nearest with coordinate_transformation_mode={ctm}, nearest_mode={nm} "
                              "is not supported")
    if mode == "linear":
        if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise SplitinferError(f"Resize linear with coordinate_transformation_mode={ctm} is not supported")
        m = {1: "linear", 2: "bilinear", 3: "trilinear"}[x.dim() - 2]
        return F.interpolate(x, size=size, mode=m, align_corners=ctm == "align_corners")
    raise SplitinferError(f"Resize mode {mode!r} is not supported")


def _slice(torch: Any, x: Any, starts: Any, ends: Any, axes: Any, steps: Any) -> Any:
    st, en = _ints(starts), _ints(ends)
    ax = _ints(axes) if axes is not None else list(range(len(st)))
    sp = _ints(steps) if steps is not None else [1] * len(st)
    idx: list[Any] = [slice(None)] * x.dim()
    for s, e, a, k in zip(st, en, ax, sp):
        if k <= 0:
            raise SplitinferError("Slice with a step <= 0 is not supported")
        n = x.shape[a]
        s = max(s + n, 0) if s < 0 else min(s, n)
        e = max(e + n, 0) if e < 0 else min(e, n)
        idx[a] = slice(s, e, k)
    return x[tuple(idx)]


def _split(torch: Any, x: Any, sizes: Any, a: dict[str, Any], n_out: int) -> list[Any]:
    axis = a.get("axis", 0)
    if sizes is not None and sizes.numel():
        parts = _ints(sizes)
    elif "split" in a:
        parts = list(a["split"])
    else:
        d = x.shape[axis]
        parts = [(d + n_out - 1) // n_out] * (n_out - 1)
        parts.append(d - sum(parts))
    return list(torch.split(x, parts, dim=axis))


def _reshape(torch: Any, x: Any, shape: Any, a: dict[str, Any]) -> Any:
    target = _ints(shape)
    if not a.get("allowzero", 0):
        target = [x.shape[k] if v == 0 else v for k, v in enumerate(target)]
    return x.reshape(target)


def _reduce(torch: Any, x: Any, axes: Any, a: dict[str, Any], fn: str) -> Any:
    ax = _ints(axes) if axes is not None and axes.numel() else a.get("axes")
    keep = bool(a.get("keepdims", 1))
    if not ax:
        if a.get("noop_with_empty_axes", 0):
            return x
        ax = list(range(x.dim()))
    return getattr(torch, fn)(x, dim=tuple(ax), keepdim=keep)


def _gemm(torch: Any, a_: Any, b: Any, c: Any, a: dict[str, Any]) -> Any:
    A = a_.T if a.get("transA", 0) else a_
    B = b.T if a.get("transB", 0) else b
    y = a.get("alpha", 1.0) * (A @ B)
    return y + a.get("beta", 1.0) * c if c is not None else y


def _table(torch: Any, F: Any) -> dict[str, Callable[..., Any]]:
    """op type -> f(inputs (None for an absent optional), attributes, number of outputs) -> output(s)."""
    return {
        "Conv": lambda i, a, n: _conv(torch, F, i[0], i[1], i[2] if len(i) > 2 else None, a),
        "MaxPool": lambda i, a, n: _maxpool(torch, F, i[0], a),
        "AveragePool": lambda i, a, n: F.avg_pool2d(i[0], a["kernel_shape"], a.get("strides", a["kernel_shape"]),
                                                    _pads(a.get("pads"), 2)[0][::2][::-1],
                                                    ceil_mode=bool(a.get("ceil_mode", 0)),
                                                    count_include_pad=bool(a.get("count_include_pad", 0))),
        "GlobalAveragePool": lambda i, a, n: i[0].mean(dim=tuple(range(2, i[0].dim())), keepdim=True),
        "GlobalMaxPool": lambda i, a, n: i[0].amax(dim=tuple(range(2, i[0].dim())), keepdim=True),
        "BatchNormalization": lambda i, a, n: F.batch_norm(i[0], i[3], i[4], i[1], i[2], False, 0.0,
                                                           a.get("epsilon", 1e-5)),
        "Resize": lambda i, a, n: _resize(torch, F, i[0], i[1] if len(i) > 1 else None, i[2] if len(i) > 2 else None,
                                          i[3] if len(i) > 3 else None, a),
        "Add": lambda i, a, n: i[0] + i[1], "Sub": lambda i, a, n: i[0] - i[1],
        "Mul": lambda i, a, n: i[0] * i[1], "Div": lambda i, a, n: i[0] / i[1],
        "Pow": lambda i, a, n: torch.pow(i[0], i[1]),
        "Sigmoid": lambda i, a, n: torch.sigmoid(i[0]), "Relu": lambda i, a, n: torch.relu(i[0]),
        "Tanh": lambda i, a, n: torch.tanh(i[0]), "Exp": lambda i, a, n: torch.exp(i[0]),
        "Sqrt": lambda i, a, n: torch.sqrt(i[0]), "Erf": lambda i, a, n: torch.erf(i[0]),
        "Neg": lambda i, a, n: -i[0], "Abs": lambda i, a, n: torch.abs(i[0]),
        "LeakyRelu": lambda i, a, n: F.leaky_relu(i[0], a.get("alpha", 0.01)),
        "HardSigmoid": lambda i, a, n: torch.clamp(a.get("alpha", 0.2) * i[0] + a.get("beta", 0.5), 0, 1),
        "HardSwish": lambda i, a, n: F.hardswish(i[0]),
        "Clip": lambda i, a, n: torch.clamp(i[0], *(None if len(i) <= k or i[k] is None else i[k] for k in (1, 2))),
        "Softmax": lambda i, a, n: torch.softmax(i[0], dim=a.get("axis", -1)),
        "Concat": lambda i, a, n: torch.cat(list(i), dim=a["axis"]),
        "Split": lambda i, a, n: _split(torch, i[0], i[1] if len(i) > 1 else None, a, n),
        "Slice": lambda i, a, n: _slice(torch, i[0], i[1], i[2], i[3] if len(i) > 3 else None,
                                        i[4] if len(i) > 4 else None),
        "Reshape": lambda i, a, n: _reshape(torch, i[0], i[1], a),
        "Flatten": lambda i, a, n: i[0].reshape(int(np.prod(i[0].shape[:a.get("axis", 1)])), -1),
        "Transpose": lambda i, a, n: i[0].permute(*(a.get("perm") or reversed(range(i[0].dim())))),
        "Squeeze": lambda i, a, n: i[0].squeeze(tuple(_ints(i[1]))) if len(i) > 1 and i[1] is not None
        else i[0].squeeze(),
        "Unsqueeze": lambda i, a, n: _unsqueeze(i[0], _ints(i[1])),
        "ReduceSum": lambda i, a, n: _reduce(torch, i[0], i[1] if len(i) > 1 else None, a, "sum"),
        "ReduceMean": lambda i, a, n: _reduce(torch, i[0], i[1] if len(i) > 1 else None, a, "mean"),
        "ReduceMax": lambda i, a, n: _reduce(torch, i[0], i[1] if len(i) > 1 else None, a, "amax"),
        "MatMul": lambda i, a, n: i[0] @ i[1],
        "LayerNormalization": lambda i, a, n: _layer_norm(F, i[0], i[1], i[2] if len(i) > 2 else None, a),
        "Gemm": lambda i, a, n: _gemm(torch, i[0], i[1], i[2] if len(i) > 2 else None, a),
        "Identity": lambda i, a, n: i[0],
        "Cast": lambda i, a, n: i[0].to(_TORCH_DTYPE(torch)[a["to"]]),
    }


def _layer_norm(F: Any, x: Any, scale: Any, bias: Any, a: dict[str, Any]) -> Any:
    axis = a.get("axis", -1) % x.dim()
    return F.layer_norm(x, tuple(x.shape[axis:]), scale, bias, a.get("epsilon", 1e-5))


def _unsqueeze(x: Any, axes: list[int]) -> Any:
    rank = x.dim() + len(axes)
    for ax in sorted(a % rank for a in axes):
        x = x.unsqueeze(ax)
    return x


def _TORCH_DTYPE(torch: Any) -> dict[int, Any]:
    P = onnx.TensorProto
    return {P.FLOAT: torch.float32, P.FLOAT16: torch.float16, P.DOUBLE: torch.float64, P.INT64: torch.int64,
            P.INT32: torch.int32, P.BOOL: torch.bool, P.UINT8: torch.uint8, P.INT8: torch.int8}


SUPPORTED_OPS: frozenset[str] = frozenset({
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Resize",
    "Add", "Sub", "Mul", "Div", "Pow", "Sigmoid", "Relu", "Tanh", "Exp", "Sqrt", "Erf", "Neg", "Abs", "LeakyRelu",
    "HardSigmoid", "HardSwish", "Clip", "Softmax", "Concat", "Split", "Slice", "Reshape", "Flatten", "Transpose",
    "Squeeze", "Unsqueeze", "ReduceSum", "ReduceMean", "ReduceMax", "MatMul", "Gemm", "Identity", "Cast", "Constant",
    "LayerNormalization",
})


def unsupported(model: onnx.ModelProto) -> list[str]:
    """The operator types ``model`` uses that :class:`OnnxModule` does not run (sorted, unique)."""
    return sorted({n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")
                   or n.op_type not in SUPPORTED_OPS})


def OnnxModule(model: onnx.ModelProto) -> Any:
    """A ``torch.nn.Module`` computing ``model``: ``module(feeds) -> {output name: tensor}``,
    differentiable in its inputs; the weights are frozen buffers. Raises
    :class:`~splitinfer.errors.SplitinferError` naming the operators it does not cover."""
    import torch
    import torch.nn.functional as F

    missing = unsupported(model)
    if missing:
        raise SplitinferError(f"the graph uses operators the torch interpreter does not run: {missing}")
    table = _table(torch, F)

    class _Module(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph = model.graph
            self._names: dict[str, str] = {}
            for k, init in enumerate(model.graph.initializer):
                arr = numpy_helper.to_array(init)
                buf = torch.from_numpy(np.array(arr, copy=True))
                key = f"w{k}"
                self.register_buffer(key, buf, persistent=False)
                self._names[init.name] = key
            self.input_names = [i.name for i in model.graph.input if i.name not in self._names]
            self.output_names = [o.name for o in model.graph.output]

        def forward(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
            env: dict[str, Any] = {name: getattr(self, key) for name, key in self._names.items()}
            env.update(feeds)
            for node in self.graph.node:
                a = _attrs(node)
                if node.op_type == "Constant":
                    env[node.output[0]] = torch.from_numpy(np.array(numpy_helper.to_array(a["value"]), copy=True))
                    continue
                ins = [env[x] if x else None for x in node.input]
                out = table[node.op_type](ins, a, len(node.output))
                if isinstance(out, (list, tuple)):
                    for name, v in zip(node.output, out):
                        env[name] = v
                else:
                    env[node.output[0]] = out
            return {name: env[name] for name in self.output_names}

    m = _Module()
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m
