"""The reference models: shapes, sizes, the YOLO family's structure."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from splitinfer.models import REFERENCE_MODELS, build  # noqa: E402
from splitinfer.models.yolo import YoloConfig, YoloDetector  # noqa: E402


def test_yolo_output_layout_and_levels():
    model, x = build("yolo-n", (2, 3, 96, 96))
    with torch.no_grad():
        feats = model.features(x)
        y = model(x)
    assert [f.shape[-1] for f in feats] == [12, 6, 3]  # P3/P4/P5 at strides 8/16/32
    assert y.shape == (2, 4 + 4, 12 * 12 + 6 * 6 + 3 * 3)
    boxes, scores = y[:, :4], y[:, 4:]
    assert torch.all((scores >= 0) & (scores <= 1))
    assert torch.all(boxes[:, 2:] >= 0)  # widths and heights


def test_width_multiplier_sizes():
    n = sum(p.numel() for p in YoloDetector(YoloConfig("n", input_size=64)).parameters())
    s = sum(p.numel() for p in YoloDetector(YoloConfig("s", input_size=64)).parameters())
    assert 2.5e6 < n < 3.5e6 and 3 * n < s  # YOLOv8n is 3.2M, s about 11M


def test_bad_configs():
    with pytest.raises(ValueError, match="multiple of 32"):
        YoloConfig(input_size=100)
    with pytest.raises(ValueError, match="size must be one of"):
        YoloConfig(size="xl")
    with pytest.raises(ValueError, match="unknown reference model"):
        build("resnet")


@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS))
def test_every_reference_model_builds(name):
    shape = {"transformer": (1, 8, 32), "chain": (1, 3, 32, 32)}.get(name, (1, 3, 64, 64))
    model, x = build(name, shape)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
