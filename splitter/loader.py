"""Load a model into the splitter: an ONNX file or bytes, or a PyTorch module + example input.

The result is a :class:`LoadedModel`: the source bytes (what the plan hashes and ships as
``model.onnx``) and a *static* copy whose inputs have fixed shapes and whose every tensor has a
known shape (ONNX shape inference, completed by one onnxruntime pass where inference stops).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import shape_inference

from .._types import TensorSpec, onnx_elem_to_dtype
from ..errors import ModelLoadError, ShapeError, UnsupportedModelError

__all__ = ["LoadedModel", "load_model", "export_torch", "parse_input_shape"]

# Fixed ONNX opset for PyTorch exports: supported by every onnxruntime we accept.
EXPORT_OPSET = 18


@dataclass
class LoadedModel:
    name: str
    source: bytes  # the model as given (dynamic batch kept); sha256 of this is the model's id
    static: onnx.ModelProto  # inputs fixed, shapes of every tensor inferred, nodes named
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source).hexdigest()


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME=1,3,640,640`` (the ``--input-shape`` option)."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(","))
        if not shape or any(d <= 0 for d in shape):
            raise ValueError
    except ValueError:
        raise ShapeError(f"--input-shape expects NAME=D0,D1,... with positive integers, got {text!r}") from None
    return name.strip(), shape


def export_torch(module: Any, example_input: Any, *, input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None, dynamic_batch: bool = True) -> bytes:
    """Export a ``torch.nn.Module`` to one ONNX file (bytes), batch dimension dynamic.

    ``example_input`` is a tensor or a tuple of tensors. Needs the ``torch`` extra.
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ModelLoadError("splitting a PyTorch module needs the torch extra: pip install 'splitinfer[torch]'") from exc
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    if not all(isinstance(a, torch.Tensor) for a in args):
        raise ModelLoadError(f"example_input must be a tensor or tuple of tensors, got {type(example_input).__name__}")
    names = list(input_names or (["input"] if len(args) == 1 else [f"input{i}" for i in range(len(args))]))
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=4096)
        dynamic_shapes = tuple({0: batch} for _ in args)
    module = module.eval()
    import logging
    import warnings

    # The exporter logs a line per missing optional op library (torchvision); keep stderr clean.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                module, args, dynamo=True, external_data=False, opset_version=EXPORT_OPSET,
                input_names=names, output_names=list(output_names) if output_names else None,
                dynamic_shapes=dynamic_shapes, verbose=False,
            )
        except Exception as exc:
            raise ModelLoadError(f"torch.onnx.export failed for {type(module).__name__}: {exc}") from exc
    assert program is not None
    buf = io.BytesIO()
    onnx.save_model(program.model_proto, buf)
    return buf.getvalue()


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{where}: the file is empty; expected an ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise ModelLoadError(f"{where}: not an ONNX model or truncated ({len(data)} bytes): {exc}") from exc
    if not model.graph.node or not model.graph.output:
        raise ModelLoadError(f"{where}: not an ONNX model (no graph nodes or outputs after parsing "
                             f"{len(data)} bytes); is the file truncated?")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ModelLoadError(f"{where}: the model fails onnx.checker: {first}") from exc
    return model


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _fix_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], where: str) -> None:
    inputs = _real_inputs(model)
    known = {i.name for i in inputs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise ShapeError(f"{where}: --input-shape names {unknown} but the model's inputs are {sorted(known)}")
    for vi in inputs:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedModelError(f"{where}: input {vi.name!r} is not a tensor")
        if onnx_elem_to_dtype(tt.elem_type) is None:
            raise UnsupportedModelError(
                f"{where}: input {vi.name!r} has ONNX element type {tt.elem_type}, which splitinfer does not carry")
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        given = shapes.get(vi.name)
        if given is not None:
            if dims is not None and len(dims) != len(given):
                raise ShapeError(f"{where}: input {vi.name!r} has rank {len(dims)}, "
                                 f"--input-shape gave rank {len(given)} ({list(given)})")
            for i, d in enumerate(dims or []):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != given[i]:
                    raise ShapeError(f"{where}: input {vi.name!r} dim {i} is fixed at {d.dim_value} in the model, "
                                     f"--input-shape gave {given[i]}")
            tt.shape.Clear()
            for g in given:
                tt.shape.dim.add().dim_value = int(g)
            continue
        if dims is None:
            raise ShapeError(f"{where}: input {vi.name!r} has no shape; give it with --input-shape {vi.name}=D0,D1,...")
        dynamic = [i for i, d in enumerate(dims) if not (d.HasField("dim_value") and d.dim_value > 0)]
        if dynamic == [0]:  # only the batch dimension is free: one frame at a time on the edge
            dims[0].Clear()
            dims[0].dim_value = 1
        elif dynamic:
            shown = [d.dim_param or "?" if i in dynamic else d.dim_value for i, d in enumerate(dims)]
            raise ShapeError(f"{where}: input {vi.name!r} has dynamic dims {shown}; fix them with "
                             f"--input-shape {vi.name}=1,...")


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = vi.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") or d.dim_value < 0 for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


def _name_nodes(model: onnx.ModelProto) -> None:
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}" if f"{node.op_type}_{i}" not in seen else f"{node.op_type}_{i}_{len(seen)}"
        seen.add(node.name)


def _complete_shapes_with_ort(model: onnx.ModelProto, missing: list[str], where: str) -> None:
    """Run the model once with onnxruntime, every missing tensor an extra output, and record
    the shapes it had. Inference stops at ops whose output shape depends on data."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for name in missing:
        if name not in have:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise UnsupportedModelError(f"{where}: onnxruntime cannot run this model: {str(exc).strip()[:300]}") from exc
    try:
        feeds = {}
        for vi in _real_inputs(model):
            shape = _static_shape(vi)
            dtype = onnx_elem_to_dtype(vi.type.tensor_type.elem_type) or "float32"
            feeds[vi.name] = np.random.default_rng(0).random(shape).astype(dtype)
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(names, feeds)
    except Exception as exc:
        raise ShapeError(f"{where}: could not determine the shapes of {len(missing)} tensors "
                         f"(e.g. {missing[:3]}): onnxruntime failed: {exc}") from exc
    by_name = dict(zip(names, values))
    for name in missing:
        value = np.asarray(by_name[name])
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, elem, list(value.shape)))


def _make_static(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], where: str) -> onnx.ModelProto:
    static = onnx.ModelProto()
    static.CopyFrom(model)
    _fix_inputs(static, shapes, where)
    # Symbolic dims inside the graph (from a dynamic-batch export) would survive inference.
    del static.graph.value_info[:]
    for out in static.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        static = shape_inference.infer_shapes(static, check_type=True, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ShapeError(f"{where}: ONNX shape inference failed: {exc}") from exc
    _name_nodes(static)
    known = {vi.name for vi in list(static.graph.value_info) + list(static.graph.output) + list(static.graph.input)
             if _static_shape(vi) is not None}
    inits = {t.name for t in static.graph.initializer}
    missing = []
    for node in static.graph.node:
        for name in node.output:
            if name and name not in known and name not in inits:
                missing.append(name)
    if missing:
        keep = [vi for vi in static.graph.value_info if vi.name not in set(missing)]
        del static.graph.value_info[:]
        static.graph.value_info.extend(keep)
        _complete_shapes_with_ort(static, missing, where)
        outs = {vi.name: vi for vi in static.graph.value_info}
        for out in static.graph.output:
            if _static_shape(out) is None and out.name in outs:
                out.type.CopyFrom(outs[out.name].type)
    return static


def _check_runnable(static: onnx.ModelProto, where: str) -> None:
    """onnxruntime must be able to load the model: its error names the unsupported operator."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(static.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        ops = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in static.graph.node})
        raise UnsupportedModelError(f"{where}: onnxruntime cannot run this model ({str(exc).strip()[:300]}); "
                                    f"the model uses {len(ops)} operator types") from exc


def _specs(vis: Sequence[onnx.ValueInfoProto], where: str) -> list[TensorSpec]:
    specs = []
    for vi in vis:
        shape = _static_shape(vi)
        dtype = onnx_elem_to_dtype(vi.type.tensor_type.elem_type)
        if shape is None:
            raise ShapeError(f"{where}: tensor {vi.name!r} has no static shape after inference")
        if dtype is None:
            raise UnsupportedModelError(f"{where}: tensor {vi.name!r} has ONNX element type "
                                        f"{vi.type.tensor_type.elem_type}, which splitinfer does not carry")
        specs.append(TensorSpec(vi.name, shape, dtype))
    return specs


def load_model(source: str | os.PathLike[str] | bytes | onnx.ModelProto | Any, *,
               input_shapes: Mapping[str, Sequence[int]] | None = None,
               example_input: Any = None, name: str | None = None) -> LoadedModel:
    """Load an ONNX model (path, bytes or ``ModelProto``) or export a PyTorch module.

    >>> lm = load_model("model.onnx", input_shapes={"images": (1, 3, 640, 640)})  # doctest: +SKIP
    >>> lm.inputs[0].shape  # doctest: +SKIP
    (1, 3, 640, 640)
    """
    shapes = dict(input_shapes or {})
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise ModelLoadError(f"{where}: no such file; expected an ONNX model")
        data = path.read_bytes()
        name = name or path.stem
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), "<bytes>"
    elif isinstance(source, onnx.ModelProto):
        data, where = source.SerializeToString(), "<ModelProto>"
    else:
        if example_input is None:
            raise ModelLoadError(f"a {type(source).__name__} needs example_input to be exported to ONNX")
        where = f"<{type(source).__name__}>"
        data = export_torch(source, example_input)
        name = name or type(source).__name__
        ex = example_input if isinstance(example_input, tuple) else (example_input,)
        model0 = onnx.load_model_from_string(data)
        for vi, t in zip(_real_inputs(model0), ex):
            shapes.setdefault(vi.name, tuple(t.shape))
    model = _parse(data, where)
    static = _make_static(model, shapes, where)
    _check_runnable(static, where)
    inputs = _specs(_real_inputs(static), where)
    outputs = _specs(list(static.graph.output), where)
    return LoadedModel(name=name or model.graph.name or "model", source=data, static=static,
                       inputs=inputs, outputs=outputs)
