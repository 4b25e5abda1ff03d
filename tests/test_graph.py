"""Graph analysis: bytes, FLOPs of the heavy ops, constant-only tensors."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conftest import diamond_model, make_model
from splitinfer.splitter import analyse, load_model


def test_flops_of_conv_matmul_gemm_by_hand():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.random((8, 3, 3, 3), dtype=np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    wm = numpy_helper.from_array(rng.random((5, 4), dtype=np.float32), "wm")
    wg = numpy_helper.from_array(rng.random((6, 2), dtype=np.float32), "wg")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),  # (1, 8, 4, 5)
        helper.make_node("MatMul", ["c", "wm"], ["m"], name="mm"),  # (1, 8, 4, 4)
        helper.make_node("Flatten", ["x"], ["f"], axis=1, name="flat"),  # (1, 60)
        helper.make_node("Gemm", ["g_in", "wg"], ["g"], name="gemm"),  # (3, 2)
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5]),
         helper.make_tensor_value_info("g_in", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 8, 4, 4]),
         helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 60]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, [3, 2])],
        [w, b, wm, wg])
    g = analyse(load_model(model).static)
    flops = {n.name: n.flops for n in g.nodes}
    out = 8 * 4 * 5
    assert flops["conv"] == 2 * out * 3 * 3 * 3 + out  # 2 x MACs + bias
    assert flops["mm"] == 2 * (8 * 4 * 4) * 5
    assert flops["gemm"] == 2 * 3 * 2 * 6
    assert flops["flat"] == 0


def test_tensor_bytes_and_constant_only_tensors():
    c = helper.make_tensor("c", TensorProto.FLOAT, [1, 4, 8], np.ones(32, np.float32))
    nodes = [
        helper.make_node("Constant", [], ["k"], value=c, name="const"),
        helper.make_node("Exp", ["k"], ["k2"], name="exp_const"),  # still constant-only
        helper.make_node("Add", ["x", "k2"], ["y"], name="add"),
    ]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])])
    g = analyse(load_model(model).static)
    assert {"k", "k2"} <= g.const and "y" not in g.const and "x" not in g.const
    assert g.tensors["y"].nbytes == 4 * 8 * 4
    assert [n.name for n in g.compute_nodes()] == ["add"]


def test_yolo_analysis_counts_flops_like_the_formula(yolo_onnx):
    g = analyse(load_model(yolo_onnx).static)
    convs = [n for n in g.nodes if n.op_type == "Conv"]
    assert len(convs) > 50 and all(n.flops > 0 for n in convs)
    # every non-constant tensor has a static shape
    for n in g.compute_nodes():
        for t in n.outputs:
            assert t in g.tensors
    assert g.total_flops > sum(n.flops for n in convs) > 0.9 * g.total_flops


def test_diamond_consumers():
    g = analyse(load_model(diamond_model()).static)
    assert sorted(g.nodes[i].name for i in g.consumers["a"]) == ["mm1", "sig"]
