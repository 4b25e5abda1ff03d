"""Cut a model into its edge segment and cloud segment (ONNX models of their own).

The edge segment reads the model inputs it needs and yields the cut tensors made on the edge;
the cloud segment reads every cut tensor and yields the model outputs not already in the cut.
Cloud segments get a symbolic batch dimension so the cloud can stack requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx
from onnx.utils import Extractor

from ..errors import UnsupportedModelError
from .cuts import Cut
from .graph import ModelGraph

__all__ = ["Segments", "build_segments", "relax_batch", "BATCH_DIM"]

BATCH_DIM = "batch"  # dim_param of a cloud segment's batch dimension


@dataclass
class Segments:
    edge: onnx.ModelProto | None  # None for all-cloud: the input itself is sent
    cloud: onnx.ModelProto | None  # None for all-edge: nothing runs in the cloud
    edge_inputs: list[str]
    edge_outputs: list[str]
    cloud_inputs: list[str]  # == the cut tensors
    cloud_outputs: list[str]
    passthrough: list[str]  # model outputs that are cut tensors (made on the edge)
    cloud_batchable: bool  # every cloud input and output has the batch as dim 0


def _extract(extractor: Extractor, inputs: Sequence[str], outputs: Sequence[str], name: str) -> onnx.ModelProto:
    try:
        model = extractor.extract_model(list(inputs), list(outputs))
    except Exception as exc:
        raise UnsupportedModelError(f"could not extract segment {name} ({list(inputs)} -> {list(outputs)}): {exc}") from exc
    model.graph.name = name
    onnx.checker.check_model(model)
    return model


def relax_batch(model: onnx.ModelProto) -> bool:
    """Make dim 0 of every input and output symbolic; False (and no change) when some tensor
    has no leading batch dimension of 1."""
    vis = list(model.graph.input) + list(model.graph.output)
    for vi in vis:
        dims = vi.type.tensor_type.shape.dim
        if not dims or not dims[0].HasField("dim_value") or dims[0].dim_value != 1:
            return False
    for vi in vis:
        d = vi.type.tensor_type.shape.dim[0]
        d.Clear()
        d.dim_param = BATCH_DIM
    del model.graph.value_info[:]  # intermediate shapes were inferred at batch 1
    return True


def build_segments(graph: ModelGraph, cut: Cut, extractor: Extractor, tag: str, *,
                   batch_dynamic: bool = True) -> Segments:
    model_inputs = [t.name for t in graph.inputs]
    model_outputs = [t.name for t in graph.outputs]
    edge_outputs = [t for t in cut.tensors if t not in model_inputs]
    edge_inputs = [t for t in model_inputs
                   if any(c in cut.edge_nodes for c in graph.consumers.get(t, []))]
    passthrough = [t for t in cut.tensors if t in model_outputs]
    cloud_outputs = [t for t in model_outputs if t not in cut.tensors]
    edge = _extract(extractor, edge_inputs, edge_outputs, f"{tag}_edge") if edge_outputs else None
    cloud, batchable = None, False
    if cloud_outputs:
        cloud = _extract(extractor, list(cut.tensors), cloud_outputs, f"{tag}_cloud")
        if batch_dynamic:
            batchable = relax_batch(cloud)
            onnx.checker.check_model(cloud)
    return Segments(edge, cloud, edge_inputs, edge_outputs, list(cut.tensors), cloud_outputs,
                    passthrough, batchable)
