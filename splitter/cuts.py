"""Cuts of a model graph and how the splitter finds good ones.

A cut splits the non-constant nodes into an edge side and a cloud side. It is *closed* when no
tensor flows from the cloud side back to the edge side; its *cut tensors* are what the edge sends:
every tensor made on the edge side (or a model input) that a cloud node reads, plus model outputs
made on the edge side (they pass through the cloud unchanged). A cut may cross several tensors.

Candidates are the union of the optimal cuts over a sweep of bandwidths and edge/cloud speed
ratios, each optimal cut found as a minimum s–t cut (networkx) of a flow graph in which

* source → node costs the node's time on the cloud (paid if the node runs there),
* node → sink costs the node's time on the edge (paid if it runs there),
* producer → tensor costs the tensor's transfer time; tensor → consumers are infinite, so a
  tensor read by several cloud nodes is paid once, and infinite reverse edges make every finite
  cut closed.

plus the two ends, all-cloud (the input is sent) and all-edge (only outputs remain).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov

from ..errors import CutError
from .graph import ModelGraph

__all__ = ["Cut", "cut_from_edge_nodes", "cut_from_tensors", "find_candidates",
           "DEFAULT_BANDWIDTHS_MBPS", "DEFAULT_SPEED_RATIOS"]

# Sweep used to enumerate candidates: uplinks from a poor 3G cell to fibre, and beyond, because a
# slower edge device is equivalent to a faster link (node costs are the split host's)...
DEFAULT_BANDWIDTHS_MBPS: tuple[float, ...] = tuple(round(0.1 * 2 ** (k / 2), 3) for k in range(34))
# ...and cloud/edge speed ratios from a near-equal pair to a GPU server against a small ARM core;
# the last one (cloud time ~0) traces the edge-time/bytes trade-off itself.
DEFAULT_SPEED_RATIOS: tuple[float, ...] = (2.0, 5.0, 20.0, 100.0, 1000.0)


@dataclass(frozen=True)
class Cut:
    tensors: tuple[str, ...]  # what the edge sends, in topological order of their producers
    edge_nodes: frozenset[int]  # indices of the non-constant nodes run on the edge

    def kind(self, graph: ModelGraph) -> str:
        """``cloud`` (nothing on the edge), ``edge`` (everything on the edge) or ``split``."""
        if not self.edge_nodes:
            return "cloud"
        if len(self.edge_nodes) == len(graph.compute_nodes()):
            return "edge"
        return "split"

    def nbytes(self, graph: ModelGraph, tensor_bytes: Mapping[str, float] | None = None) -> float:
        """What the cut sends: ``tensor_bytes`` per tensor (measured, encoded) or raw bytes."""
        if tensor_bytes is None:
            return sum(graph.tensors[t].nbytes for t in self.tensors)
        return sum(tensor_bytes.get(t, graph.tensors[t].nbytes) for t in self.tensors)

    def edge_flops(self, graph: ModelGraph) -> int:
        return sum(graph.nodes[i].flops for i in self.edge_nodes)


def cut_from_edge_nodes(graph: ModelGraph, edge_nodes: Iterable[int]) -> Cut:
    """The cut whose edge side is ``edge_nodes`` (assumed closed under ancestors)."""
    edge = frozenset(edge_nodes)
    outputs = {o.name for o in graph.outputs}
    order: dict[str, float] = {}
    for t in graph.inputs:
        if any(not graph.nodes[c].const and c not in edge for c in graph.consumers.get(t.name, [])):
            order[t.name] = -1.0
    for i in sorted(edge):
        for t in graph.nodes[i].outputs:
            cloud_reads = any(c not in edge and not graph.nodes[c].const for c in graph.consumers.get(t, []))
            if cloud_reads or t in outputs:
                order[t] = i
    return Cut(tuple(sorted(order, key=lambda t: (order[t], t))), edge)


def cut_from_tensors(graph: ModelGraph, names: Sequence[str]) -> Cut:
    """The cut that sends exactly ``names``; raises :class:`CutError` unless it is closed."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise CutError("a forced cut needs at least one tensor name")
    for n in names:
        if n in graph.const:
            raise CutError(f"cut tensor {n!r} depends only on constants: it is recomputed on each side and never cut")
        if n not in graph.tensors and n not in graph.producer:
            close = difflib.get_close_matches(n, list(graph.tensors), n=3)
            raise CutError(f"cut tensor {n!r} is not a tensor of the model" +
                           (f"; did you mean {close}?" if close else ""))
        if n not in graph.tensors:
            raise CutError(f"cut tensor {n!r} has no static shape or a dtype splitinfer does not carry")
    cut = cut_from_edge_nodes(graph, graph.ancestors(names))
    missing = [t for t in cut.tensors if t not in names]
    if missing:
        t = missing[0]
        readers = [graph.nodes[c].name for c in graph.consumers.get(t, []) if c not in cut.edge_nodes]
        maker = graph.nodes[graph.producer[t]].name if t in graph.producer else "the model input"
        if readers:
            why = f"it is made on the edge side (by {maker}) and read on the cloud side (by {readers[0]})"
        else:
            why = f"it is a model output made on the edge side (by {maker})"
        raise CutError(f"cut {names} is not closed: tensor {t!r} must cross too, because {why}; "
                       f"a closed cut here is {list(cut.tensors)}")
    extra = [n for n in names if n not in cut.tensors]
    if extra:
        raise CutError(f"cut {names}: tensor {extra[0]!r} does not cross the cut (every reader of it is on the "
                       f"edge side); the closed cut for these tensors is {list(cut.tensors)}")
    return cut


def _flow_graph(graph: ModelGraph) -> tuple[nx.DiGraph, list[tuple[object, object, int, str]]]:
    """The flow graph's structure, and its finite edges as (u, v, node index or -1, tensor name).

    Capacities are set per sweep point by :func:`_min_cut`; edges without one are infinite."""
    g = nx.DiGraph()
    g.add_node("s")
    g.add_node("t")
    finite: list[tuple[object, object, int, str]] = []
    direct: set[tuple[object, object]] = set()
    for n in graph.compute_nodes():
        finite.append(("s", n.index, n.index, "cloud"))
        finite.append((n.index, "t", n.index, "edge"))
    for name in list(graph.tensors):
        if name in graph.const:
            continue
        readers = [c for c in graph.consumers.get(name, []) if not graph.nodes[c].const]
        if not readers:
            continue
        src: str | int = graph.producer.get(name, "s")
        if len(readers) == 1 and src != "s" and (src, readers[0]) not in direct:
            # one reader: the transfer edge goes straight to it (unless that pair has an edge already)
            direct.add((src, readers[0]))
            finite.append((src, readers[0], -1, name))
            g.add_edge(readers[0], src)  # infinite: no cloud -> edge flow
            continue
        tx = ("x", name)
        finite.append((src, tx, -1, name))
        g.add_edge(tx, src)  # infinite: the producer cannot be on the cloud side of its tensor
        for c in readers:
            g.add_edge(tx, c)  # infinite: a cloud reader forces the transfer
            g.add_edge(c, tx)  # infinite: no reader on the edge side of a cloud tensor
    for u, v, _, _ in finite:
        g.add_edge(u, v)
    return g, finite


def _min_cut(g: nx.DiGraph, finite: list[tuple[object, object, int, str]], edge_ms: Mapping[int, float],
             cloud_ms: Mapping[int, float], transfer_ms: Callable[[str], float]) -> frozenset[int]:
    # networkx's max-flow is exact only on integers: capacities in nanoseconds.
    for u, v, i, what in finite:
        ms = cloud_ms[i] if what == "cloud" else edge_ms[i] if what == "edge" else transfer_ms(what)
        g[u][v]["capacity"] = max(1, int(round(ms * 1e6)))
    _, (source_side, _) = nx.minimum_cut(g, "s", "t", flow_func=boykov_kolmogorov)
    return frozenset(i for i in source_side if isinstance(i, int))


def modelled_latency(graph: ModelGraph, cut: Cut, node_ms: Mapping[int, float], ratio: float,
                     mbps: float, tensor_bytes: Mapping[str, float] | None = None) -> float:
    """The flow model's latency of ``cut`` (ms): edge nodes at ``node_ms``, cloud nodes ``ratio``
    times faster, cut tensors (``tensor_bytes``, else raw) at ``mbps``."""
    edge = sum(node_ms[i] for i in cut.edge_nodes)
    cloud = sum(v for i, v in node_ms.items() if i not in cut.edge_nodes) / ratio
    sent = 0 if len(cut.edge_nodes) == len(node_ms) else cut.nbytes(graph, tensor_bytes)  # all-edge sends nothing
    return edge + cloud + sent * 8 / (mbps * 1e3)


def find_candidates(graph: ModelGraph, node_ms: Mapping[int, float], *, max_candidates: int = 8,
                    bandwidths_mbps: Sequence[float] = DEFAULT_BANDWIDTHS_MBPS,
                    speed_ratios: Sequence[float] = DEFAULT_SPEED_RATIOS,
                    tensor_bytes: Mapping[str, float] | None = None,
                    forced: Sequence[Cut] = ()) -> list[Cut]:
    """Candidate cuts, all-cloud first and all-edge last, at most ``max_candidates`` (``forced``
    cuts are kept whatever their rank, and count towards the limit).

    ``node_ms`` is each non-constant node's cost on the edge (measured, or estimated from FLOPs);
    the cloud runs a node ``ratio`` times faster for each ratio in the sweep. ``tensor_bytes`` is
    what each tensor costs on the wire (``wire_bytes.TensorBytes.sweep_bytes``: measured, encoded);
    without it, raw bytes.
    """
    if max_candidates < 2:
        raise CutError(f"--candidates must be at least 2 (the two ends), got {max_candidates}")
    compute = [n.index for n in graph.compute_nodes()]
    eps = 1e-6  # keeps capacities positive so ties break toward the smaller edge side
    base = {i: max(float(node_ms.get(i, 0.0)), 0.0) + eps for i in compute}
    cloud_end = cut_from_edge_nodes(graph, ())
    edge_end = cut_from_edge_nodes(graph, compute)
    wins: dict[tuple[str, ...], int] = {}
    cuts: dict[tuple[str, ...], Cut] = {cloud_end.tensors: cloud_end, edge_end.tensors: edge_end}
    flow, finite = _flow_graph(graph)
    for ratio in speed_ratios:
        cloud = {i: v / ratio for i, v in base.items()}
        for mbps in bandwidths_mbps:
            def transfer(name: str, mbps: float = mbps) -> float:
                b = graph.tensors[name].nbytes if tensor_bytes is None else tensor_bytes.get(name, graph.tensors[name].nbytes)
                return b * 8 / (mbps * 1e3)

            edge_nodes = _min_cut(flow, finite, base, cloud, transfer)
            cut = cut_from_edge_nodes(graph, edge_nodes)
            cuts.setdefault(cut.tensors, cut)
    # Rank the split cuts by how many sweep points they are the best of all found cuts at.
    for ratio in speed_ratios:
        for mbps in bandwidths_mbps:
            best = min(cuts.values(), key=lambda c: modelled_latency(graph, c, base, ratio, mbps, tensor_bytes))
            wins[best.tensors] = wins.get(best.tensors, 0) + 1
    ends = (cloud_end.tensors, edge_end.tensors)
    kept = [c for c in dict((c.tensors, c) for c in forced).values() if c.tensors not in ends]
    if len(kept) > max_candidates - 2:
        raise CutError(f"{len(kept)} forced cuts and the two ends exceed --candidates {max_candidates}")
    middle = [c for c in cuts.values() if c.tensors not in ends and c.tensors not in {k.tensors for k in kept}]
    middle.sort(key=lambda c: (-wins.get(c.tensors, 0), c.nbytes(graph, tensor_bytes)))
    chosen = kept + middle[: max_candidates - 2 - len(kept)]
    chosen.sort(key=lambda c: (sum(base[i] for i in c.edge_nodes), c.nbytes(graph, tensor_bytes)))
    return [cloud_end, *chosen, edge_end]

