"""Loading models: ONNX files and PyTorch modules in; every bad input gets a named error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import make_model
from splitinfer import ModelLoadError, ShapeError
from splitinfer.splitter import load_model, parse_input_shape


def _dynamic_model(dims):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])


def test_loads_onnx_file_with_static_shapes_everywhere(yolo_onnx):
    lm = load_model(yolo_onnx)
    assert lm.inputs[0].shape == (1, 3, 64, 64)
    assert lm.outputs[0].shape[:2] == (1, 8)  # 4 box + 4 classes
    for vi in lm.static.graph.value_info:
        assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), vi.name
    # the source keeps its dynamic batch for the cloud and the fallback
    src = onnx.load_model_from_string(lm.source)
    assert src.graph.input[0].type.tensor_type.shape.dim[0].dim_param


def test_torch_module_is_exported_with_dynamic_batch():
    torch = pytest.importorskip("torch")
    from splitinfer.models import build

    model, x = build("chain", (1, 3, 32, 32))
    lm = load_model(model, example_input=x)
    assert lm.inputs[0].shape == (1, 3, 32, 32)
    src = onnx.load_model_from_string(lm.source)
    assert src.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # batch is symbolic
    import onnxruntime as ort

    sess = ort.InferenceSession(lm.source, providers=["CPUExecutionProvider"])
    xb = torch.rand(3, 3, 32, 32)
    got = sess.run(None, {sess.get_inputs()[0].name: xb.numpy()})[0]
    with torch.no_grad():
        want = model(xb).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_not_an_onnx_file(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        load_model(p)


def test_truncated_file(tmp_path, chain_onnx):
    data = chain_onnx.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"truncated|not an ONNX"):
        load_model(p)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "e.onnx").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model(tmp_path / "e.onnx")
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(tmp_path / "missing.onnx")


def test_dynamic_spatial_dims_need_input_shape():
    model = _dynamic_model(["N", 3, "H", "W"])
    with pytest.raises(ShapeError, match=r"dynamic dims.*--input-shape x="):
        load_model(model)
    lm = load_model(model, input_shapes={"x": (1, 3, 8, 8)})
    assert lm.inputs[0].shape == (1, 3, 8, 8) and lm.outputs[0].shape == (1, 3, 8, 8)


def test_dynamic_batch_alone_is_fixed_to_one():
    lm = load_model(_dynamic_model(["N", 3, 4, 4]))
    assert lm.inputs[0].shape == (1, 3, 4, 4)


@pytest.mark.parametrize("shapes,match", [
    ({"nope": (1, 3, 4, 4)}, r"names \['nope'\] but the model's inputs are \['x'\]"),
    ({"x": (1, 3, 4)}, "has rank 4, --input-shape gave rank 3"),
    ({"x": (1, 5, 4, 4)}, "dim 1 is fixed at 3 in the model, --input-shape gave 5"),
])
def test_wrong_input_shapes_are_named(shapes, match):
    with pytest.raises(ShapeError, match=match):
        load_model(_dynamic_model(["N", 3, 4, 4]), input_shapes=shapes)


@pytest.mark.parametrize("text", ["x", "x=", "x=1,a", "=1,2", "x=0,3"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ShapeError, match="NAME=D0,D1"):
        parse_input_shape(text)


def test_parse_input_shape():
    assert parse_input_shape("images=1,3,640,640") == ("images", (1, 3, 640, 640))


def test_shapes_that_inference_cannot_reach_come_from_one_onnxruntime_pass():
    # Reshape to a shape computed at run time from the data (x * 0 + [2, 8]): ONNX inference gives up.
    nodes = [
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.INT64, [2], [2, 8])),
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT64),
        helper.make_node("Mul", ["mi", "zero"], ["z"]),
        helper.make_node("Add", ["z", "k"], ["shape"]),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    zero = onnx.numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["d0", "d1"])], [zero])
    lm = load_model(model)
    assert lm.outputs[0].shape == (2, 8)


def test_unsupported_operator_is_named():
    from splitinfer import UnsupportedModelError

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Frobnicate", ["r"], ["y"], domain="com.example")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 9
    with pytest.raises(UnsupportedModelError, match="Frobnicate"):
        load_model(model)
