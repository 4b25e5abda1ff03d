"""Learned bottleneck training (work in progress): on a small model's cut, a few seconds of
distillation through the frozen back segment lower both the rate and the restoration error."""

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
