"""The ONNX-in-torch interpreter a bottleneck is trained through: the same outputs as
onnxruntime on the models and segments the project splits, gradients to the inputs, and the
operators it does not cover named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import make_model

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from splitinfer.errors import SplitinferError  # noqa: E402
from splitinfer.splitter import Plan  # noqa: E402
from splitinfer.splitter.onnx_torch import OnnxModule, unsupported  # noqa: E402


def _compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    """The largest difference between the interpreter and onnxruntime, relative to the outputs' scale."""
    mod = OnnxModule(model)
    with torch.no_grad():
        got = mod({k: torch.from_numpy(v) for k, v in feeds.items()})
    sess = ort.InferenceSession(model.SerializeToString())
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert set(got) == set(want)
    return max(float(np.abs(got[k].numpy() - want[k]).max()) / max(float(np.abs(want[k]).max()), 1e-6) for k in want)


def test_every_segment_of_a_yolo_plan_runs_as_onnxruntime_runs_it(yolo_plan):
    plan = Plan.load(yolo_plan)
    rng = np.random.default_rng(0)
    x = {t.name: rng.random(t.shape, dtype=np.float32) for t in plan.inputs}
    assert _compare(onnx.load(plan.model_file), x) < 1e-5
    for c in plan.candidates:
        for ref in (c.edge, c.cloud):
            if ref is None:
                continue
            m = onnx.load(plan.file(ref))
            feeds = {i.name: rng.random([d.dim_value or 1 for d in i.type.tensor_type.shape.dim], dtype=np.float32)
                     for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}}
            assert _compare(m, feeds) < 1e-5, (c.id, ref.file)


def test_a_transformer_runs_too(transformer_onnx):
    m = onnx.load(transformer_onnx)
    x = np.random.default_rng(1).standard_normal((1, 16, 32)).astype(np.float32)
    assert unsupported(m) == []
    assert _compare(m, {m.graph.input[0].name: x}) < 1e-5


def test_gradients_reach_the_inputs(yolo_plan):
    plan = Plan.load(yolo_plan)
    mod = OnnxModule(onnx.load(plan.model_file))
    x = torch.rand(*plan.inputs[0].shape, requires_grad=True)
    out = mod({plan.inputs[0].name: x})
    sum(v.square().mean() for v in out.values()).backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0
    assert not any(p.requires_grad for p in mod.parameters())  # the segment stays frozen


def test_operators_it_does_not_run_are_named_before_any_work():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Einsum", ["a", "a"], ["y"], equation="ij,ij->ij")]
    m = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    assert unsupported(m) == ["Einsum"]
    with pytest.raises(SplitinferError, match=r"\['Einsum'\]"):
        OnnxModule(m)
