"""Learned bottleneck training: on a small model's cut, a few seconds of distillation through the
frozen back segment lower both the rate and the restoration error; the trained parts as ONNX
compute what the module does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from splitinfer.frames import scene_frames  # noqa: E402
from splitinfer.splitter import Plan  # noqa: E402
from splitinfer.splitter.bottleneck import BottleneckConfig, build_bottleneck, train_bottleneck  # noqa: E402
from splitinfer.splitter.onnx_torch import OnnxModule  # noqa: E402


def test_a_few_seconds_of_distillation_lower_the_rate_and_the_error(yolo_plan):
    plan = Plan.load(yolo_plan)
    cand = next(c for c in plan.candidates if c.kind == "split" and len(c.cut) == 1)
    cut = cand.cut[0]
    front = ort.InferenceSession(str(plan.file(cand.edge)))
    frames = list(scene_frames(plan.inputs, 32, seed=5))
    xs = np.concatenate([front.run([cut.name], f)[0] for f in frames])  # (32, C, H, W)
    back = OnnxModule(onnx.load(plan.file(cand.cloud)))

    def batches():
        rng = np.random.default_rng(0)
        while True:
            yield torch.from_numpy(xs[rng.choice(len(xs), 8, replace=False)])

    cfg = BottleneckConfig(channels=8, hidden=32, seconds=6.0, feature_share=0.3, rate_weight=0.05)
    model = build_bottleneck(cut.shape[1], cfg)
    report = train_bottleneck(model, back, batches, cut.name, cfg)
    first, last = report.history[0], report.history[-1]
    assert report.steps > 20
    assert last["feature"] < 0.5 * first["feature"], report.history
    assert last["bits"] < first["bits"], report.history
    assert not np.isnan(report.output_mse)  # the output term was on for the second part


@pytest.mark.parametrize("height,width,stride", [(8, 8, 2), (7, 9, 2), (6, 6, 1), (10, 6, 3)])
def test_the_onnx_parts_compute_what_the_trained_module_does(height, width, stride):
    """The encoder spliced onto an edge segment and the decoder onto a cloud segment, run by
    onnxruntime, give the module's rounded latent exactly and its restoration to float precision
    (odd sizes: the decoder's crop)."""
    from onnx import TensorProto, helper

    from splitinfer._types import TensorSpec
    from splitinfer.splitter.bottleneck_graph import cloud_with_decoder, edge_with_encoder, latent_hw, weights_of

    c = 5
    model = build_bottleneck(c, BottleneckConfig(channels=3, stride=stride, hidden=8))
    shape = [1, c, height, width]

    def graph(op, x, y):
        g = helper.make_graph([helper.make_node(op, [x], [y])], op, [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, shape)])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])

    latent = TensorSpec("b1.latent", (1, 3, *latent_hw(height, width, stride)), "float32")
    w = weights_of(model)
    edge = edge_with_encoder(graph("Relu", "x", "at"), w, "b1", "at", latent, stride)
    cloud = cloud_with_decoder(graph("Sigmoid", "at", "y"), w, "b1", TensorSpec("at", tuple(shape), "float32"),
                               latent, stride)
    x = 3 * np.random.default_rng(0).normal(size=shape).astype(np.float32)
    y_latent = ort.InferenceSession(edge.SerializeToString()).run(None, {"x": x})[0]
    y = ort.InferenceSession(cloud.SerializeToString()).run(None, {"b1.latent": y_latent})[0]
    with torch.no_grad():
        restored, want_latent = model(torch.relu(torch.from_numpy(x)), noisy=False)
    assert y_latent.shape == latent.shape and np.array_equal(y_latent, want_latent.numpy())
    np.testing.assert_allclose(y, torch.sigmoid(restored).numpy(), atol=1e-6)
