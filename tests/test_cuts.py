"""Candidate cuts: closed, optimal (against brute force on a small DAG), multi-tensor where the
graph asks for it, and forced cuts validated with errors that name the problem."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import diamond_model
from splitinfer import CutError
from splitinfer.splitter import analyse, cut_from_tensors, find_candidates, load_model
from splitinfer.splitter.cuts import _flow_graph, _min_cut, cut_from_edge_nodes


def _closed(g, cut):
    """No tensor made on the cloud side is read on the edge side, and the edge side is closed
    under ancestors; every tensor a cloud node reads from the edge side is in the cut."""
    edge = cut.edge_nodes
    for i in edge:
        for t in g.nodes[i].inputs:
            p = g.producer.get(t)
            if p is not None and not g.nodes[p].const and p not in edge:
                return False
    for n in g.compute_nodes():
        if n.index in edge:
            continue
        for t in n.inputs:
            p = g.producer.get(t)
            from_edge = (p in edge) or (t in {x.name for x in g.inputs})
            if from_edge and t not in cut.tensors:
                return False
    return True


def _down_sets(g):
    nodes = [n.index for n in g.compute_nodes()]
    for r in range(len(nodes) + 1):
        for subset in itertools.combinations(nodes, r):
            s = set(subset)
            if all(g.producer.get(t) in s for i in s for t in g.nodes[i].inputs
                   if g.producer.get(t) is not None and not g.nodes[g.producer[t]].const):
                yield frozenset(s)


def _flow_cost(g, edge_nodes, edge_ms, cloud_ms, mbps):
    cost = sum(edge_ms[i] if i in edge_nodes else cloud_ms[i] for i in edge_ms)
    sent = 0
    for name, spec in g.tensors.items():
        if name in g.const:
            continue
        p = g.producer.get(name)
        on_edge = p is None or p in edge_nodes
        read_in_cloud = any(c not in edge_nodes and not g.nodes[c].const for c in g.consumers.get(name, []))
        if on_edge and read_in_cloud:
            sent += spec.nbytes
    return cost + sent * 8 / (mbps * 1e3)


@pytest.mark.parametrize("seed", range(6))
def test_min_cut_matches_brute_force_on_a_dag(seed):
    g = analyse(load_model(diamond_model()).static)
    rng = np.random.default_rng(seed)
    edge_ms = {n.index: float(rng.uniform(0.01, 1.0)) for n in g.compute_nodes()}
    flow, finite = _flow_graph(g)
    for ratio in (1.0, 3.0, 30.0):
        cloud_ms = {i: v / ratio for i, v in edge_ms.items()}
        for mbps in (0.05, 0.5, 5.0, 50.0):
            def transfer(name, mbps=mbps):
                return g.tensors[name].nbytes * 8 / (mbps * 1e3)

            found = _min_cut(flow, finite, edge_ms, cloud_ms, transfer)
            best = min(_flow_cost(g, s, edge_ms, cloud_ms, mbps) for s in _down_sets(g))
            got = _flow_cost(g, found, edge_ms, cloud_ms, mbps)
            assert got == pytest.approx(best, rel=1e-6, abs=1e-5), (ratio, mbps, sorted(found))
            assert _closed(g, cut_from_edge_nodes(g, found))


def test_a_tensor_read_twice_is_sent_once():
    g = analyse(load_model(diamond_model()).static)
    relu = g.node_by_name["relu"]
    cut = cut_from_edge_nodes(g, {relu})
    assert cut.tensors == ("a",)  # read by mm1 and sig on the cloud side, sent once


def test_yolo_candidates_are_closed_and_bounded(yolo_onnx):
    g = analyse(load_model(yolo_onnx).static)
    ms = {n.index: n.flops / 1e7 + 1e-3 for n in g.compute_nodes()}
    cands = find_candidates(g, ms, max_candidates=8)
    assert 2 <= len(cands) <= 8
    assert cands[0].kind(g) == "cloud" and cands[0].tensors == ("input",)
    assert cands[-1].kind(g) == "edge" and cands[-1].tensors == tuple(o.name for o in g.outputs)
    assert len({c.tensors for c in cands}) == len(cands)
    for c in cands:
        assert _closed(g, c)
    two = find_candidates(g, ms, max_candidates=2)
    assert [c.kind(g) for c in two] == ["cloud", "edge"]
    with pytest.raises(CutError, match="at least 2"):
        find_candidates(g, ms, max_candidates=1)


def _neck_cut(g):
    """The closed cut just before the neck's first concat: crosses P4 and P5 (and what P3 needs)."""
    concat = next(n for n in g.nodes if n.op_type == "Concat" and any(
        g.nodes[g.producer[t]].op_type == "Resize" for t in n.inputs if t in g.producer))
    return cut_from_edge_nodes(g, g.ancestors([t for t in concat.inputs if t in g.producer]))


def test_forced_multi_tensor_cut_in_the_yolo_neck(yolo_onnx):
    g = analyse(load_model(yolo_onnx).static)
    neck = _neck_cut(g)
    assert len(neck.tensors) >= 2, neck.tensors  # skip connections cross too
    cut = cut_from_tensors(g, list(neck.tensors))
    assert cut == neck and _closed(g, cut)


def test_forced_cut_that_is_not_closed(yolo_onnx):
    g = analyse(load_model(yolo_onnx).static)
    neck = _neck_cut(g)
    with pytest.raises(CutError, match=r"is not closed: tensor .* must cross too, because it is made on the edge side"):
        cut_from_tensors(g, list(neck.tensors[1:]))


def test_forced_cut_errors_name_the_problem(yolo_onnx):
    g = analyse(load_model(yolo_onnx).static)
    with pytest.raises(CutError, match="'no_such_tensor' is not a tensor of the model"):
        cut_from_tensors(g, ["no_such_tensor"])
    const = next(t for t in g.const if g.producer.get(t) is not None) if any(
        g.producer.get(t) is not None for t in g.const) else next(iter(g.const))
    with pytest.raises(CutError, match="depends only on constants"):
        cut_from_tensors(g, [const])
    with pytest.raises(CutError, match="at least one tensor"):
        cut_from_tensors(g, [" "])
