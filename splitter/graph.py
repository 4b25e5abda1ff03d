"""Graph analysis: every tensor's shape and bytes, every node's FLOPs, producers and consumers,
and which tensors depend only on constants (those are recomputed on whichever side needs them
and are never cut)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx

from .._types import TensorSpec, onnx_elem_to_dtype
from ..errors import ShapeError
from .flops import node_flops

__all__ = ["Node", "ModelGraph", "analyse"]


@dataclass
class Node:
    index: int  # position in topological order
    name: str
    op_type: str
    inputs: list[str]  # non-empty input names, implicit (subgraph) inputs included
    outputs: list[str]
    flops: int
    const: bool  # every input is constant: the node is never cut around


@dataclass
class ModelGraph:
    model: onnx.ModelProto  # the static model
    nodes: list[Node]
    tensors: dict[str, TensorSpec]  # every tensor with a known shape and carried dtype
    producer: dict[str, int]  # tensor -> node index
    consumers: dict[str, list[int]]  # tensor -> node indices
    const: set[str]  # tensors that depend only on initializers/Constant nodes
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    node_by_name: dict[str, int] = field(default_factory=dict)

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    def compute_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.const]

    def ancestors(self, tensors: Iterable[str]) -> set[int]:
        """Indices of the non-constant nodes needed to compute ``tensors`` from the inputs."""
        seen: set[int] = set()
        stack = [self.producer[t] for t in tensors if t in self.producer]
        while stack:
            i = stack.pop()
            if i in seen or self.nodes[i].const:
                continue
            seen.add(i)
            stack.extend(self.producer[t] for t in self.nodes[i].inputs if t in self.producer)
        return seen

    def is_cuttable(self, name: str) -> bool:
        return name in self.tensors and name not in self.const


def _subgraph_refs(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from the enclosing scope."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(x for x in node.input if x)
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                used.update(_subgraph_refs(g))
        defined.update(node.output)
    return used - defined


def analyse(static: onnx.ModelProto) -> ModelGraph:
    """Analyse a static model (from :func:`~splitinfer.splitter.loader.load_model`)."""
    g = static.graph
    tensors: dict[str, TensorSpec] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        dtype = onnx_elem_to_dtype(tt.elem_type)
        dims = tt.shape.dim if tt.HasField("shape") else None
        if dtype is None or dims is None or any(not d.HasField("dim_value") for d in dims):
            continue
        tensors[vi.name] = TensorSpec(vi.name, tuple(int(d.dim_value) for d in dims), dtype)
    inits = {t.name for t in g.initializer}
    const: set[str] = set(inits)
    nodes: list[Node] = []
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    shapes = {k: v.shape for k, v in tensors.items()}
    for t in g.initializer:
        shapes.setdefault(t.name, tuple(t.dims))
    for i, n in enumerate(g.node):
        ins = [x for x in n.input if x]
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                ins.extend(sorted(_subgraph_refs(sub) - set(ins)))
        is_const = all(x in const for x in ins)
        if is_const:
            const.update(o for o in n.output if o)
        node = Node(i, n.name, n.op_type, ins, [o for o in n.output if o], node_flops(n, shapes), is_const)
        nodes.append(node)
        for o in node.outputs:
            producer[o] = i
        for x in set(ins):
            consumers.setdefault(x, []).append(i)
    inputs = [tensors[vi.name] for vi in g.input if vi.name not in inits]
    outputs = []
    for vi in g.output:
        if vi.name not in tensors:
            raise ShapeError(f"output {vi.name!r} has no static shape or an unsupported dtype")
        outputs.append(tensors[vi.name])
    return ModelGraph(static, nodes, tensors, producer, consumers, const - set(t.name for t in inputs),
                      inputs, outputs, {n.name: n.index for n in nodes})
