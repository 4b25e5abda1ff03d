"""How camera pixels become a model's image input, recorded in the plan per input.

The edge sends an all-cloud frame as the camera's JPEG and the cloud turns its pixels back into
the model input, so both must know the convention: ``x = (pixel * scale - mean) / std``, channels
in RGB or BGR order (:class:`~splitinfer._types.PixelFormat`). It is given at split time
(``--normalize imagenet``, ``mean=…,std=…``, ``0-1``, ``0-255``) or read from the graph when the
graph itself begins with the normalisation (``Sub``/``Div``, ``Mul``/``Add``, or a ``Div`` by 255
on the input): then the input is unnormalised pixels, on the [0, 1] or the [0, 255] scale that
the constants show. Without either the plan does not know, and JPEG is refused for that input.

>>> pixel_formats(model, graph, "imagenet")   # doctest: +SKIP
{'input': PixelFormat(scale=0.0039..., mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), order='rgb')}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .._types import PixelFormat
from ..errors import SplitinferError
from .graph import ModelGraph

__all__ = ["pixel_formats", "read_pixel_format"]

Normalize = PixelFormat | str | Mapping[str, PixelFormat | str] | None


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(a.t)
    return consts


def _per_channel(v: np.ndarray) -> np.ndarray | None:
    """A constant broadcast over (1, 3, H, W) per channel (or a scalar), as 3 values."""
    v = np.asarray(v, np.float64)
    if v.size == 1:
        return np.repeat(v.reshape(1), 3)
    if v.shape in ((3, 1, 1), (1, 3, 1, 1)):  # (3,) would broadcast over the width, not the channels
        return v.reshape(3)
    return None


def read_pixel_format(model: onnx.ModelProto, input_name: str) -> PixelFormat | None:
    """The pixel format implied by a graph that begins with its own normalisation, else None."""
    consts = _constants(model)
    readers = [n for n in model.graph.node if input_name in n.input]
    if len(readers) != 1:
        return None
    node = readers[0]
    other = [t for t in node.input if t != input_name]
    if len(other) != 1 or other[0] not in consts or node.input[0] != input_name:
        return None
    c = _per_channel(consts[other[0]])
    if c is None:
        return None
    if node.op_type == "Div" and np.allclose(c, 255.0, rtol=1e-3):
        return PixelFormat(scale=1.0)  # the graph scales 0..255 pixels itself
    if node.op_type == "Mul" and np.allclose(c, 1 / 255.0, rtol=1e-3):
        return PixelFormat(scale=1.0)
    mean: np.ndarray | None = None
    if node.op_type == "Sub":
        mean = c
    elif node.op_type == "Mul":  # x * a + b with a = 1/std, b = -mean/std
        nxt = [n for n in model.graph.node if node.output[0] in n.input]
        if len(nxt) == 1 and nxt[0].op_type == "Add":
            b = [t for t in nxt[0].input if t != node.output[0]]
            bc = _per_channel(consts[b[0]]) if len(b) == 1 and b[0] in consts else None
            if bc is not None and np.all(c != 0):
                mean = -bc / c
    if mean is None or np.allclose(mean, 0.0):
        return None
    # the constants say the scale of what comes in: ImageNet's 0.485 or 123.7
    return PixelFormat(scale=1.0 if float(np.abs(mean).max()) > 1.5 else 1 / 255)


def pixel_formats(model: onnx.ModelProto, graph: ModelGraph, normalize: Normalize) -> dict[str, PixelFormat]:
    """Per image input, its pixel format: given (one for every image input, or by name), else read
    from the graph; inputs with neither are left out."""
    images = [t.name for t in graph.inputs if t.is_image]
    given: dict[str, Any]
    if normalize is None:
        given = {}
    elif isinstance(normalize, (str, PixelFormat)):
        if not images:
            raise SplitinferError(f"--normalize applies to image inputs (1, 3, H, W) float; this model's inputs are "
                                  f"{[(t.name, list(t.shape), t.dtype) for t in graph.inputs]}")
        given = {n: normalize for n in images}
    else:
        given = dict(normalize)
        unknown = sorted(set(given) - set(images))
        if unknown:
            raise SplitinferError(f"--normalize names {unknown}, which are not image inputs (1, 3, H, W) float; "
                                  f"the image inputs are {images}")
    out: dict[str, PixelFormat] = {}
    for name in images:
        if name in given:
            v = given[name]
            try:
                out[name] = v if isinstance(v, PixelFormat) else PixelFormat.parse(str(v))
            except ValueError as exc:
                raise SplitinferError(f"--normalize: {exc}") from None
        else:
            found = read_pixel_format(model, name)
            if found is not None:
                out[name] = found
    return out
