"""Image inputs: the plan records how camera pixels become the model input, JPEG goes through it
both ways, and a model whose input is mean/std-normalised (most pretrained ones) gets the same
outputs over the all-cloud JPEG path as the whole model, within what JPEG itself costs. (Before,
JPEG clipped every input to [0, 1]: a normalised input lost everything below 0 and above 1.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import arun
from splitinfer import PixelFormat
from splitinfer.errors import PlanFormatError, SplitinferError
from splitinfer.splitter import Plan, split_model
from splitinfer.splitter.pixels import read_pixel_format
from splitinfer.codecs import decode_tensor, encode_tensor

IMAGENET = PixelFormat(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def conv_model(prefix: list[onnx.NodeProto] = (), consts: list[onnx.TensorProto] = (), size: int = 32):
    """Two convolutions on an image input; ``prefix`` nodes (reading ``input``, writing ``x``) come first."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "w2")
    first = "x" if prefix else "input"
    nodes = [*prefix,
             helper.make_node("Conv", [first, "w1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["output"], pads=[1, 1, 1, 1], name="conv2")]
    g = helper.make_graph(nodes, "pix", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, size, size])],
                          [w1, w2, *consts])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def camera(size: int = 32, seed: int = 0) -> np.ndarray:
    """A smooth camera image, uint8 (H, W, 3) RGB: JPEG's kind of content."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.stack([0.5 + 0.4 * np.sin(6 * xx + c) * np.cos(4 * yy - c) for c in range(3)], -1)
    return (np.clip(img + rng.normal(0, 0.01, img.shape), 0, 1) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def normalised_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("pix")
    onnx.save(conv_model(), d / "m.onnx")
    return split_model(d / "m.onnx", d / "plan", budget_s=0.02, report=False, normalize="imagenet").plan


def test_pixel_formats_round_trip_and_parse():
    rgb = camera()
    for px in (PixelFormat(), IMAGENET, PixelFormat.parse("mean=123.7,116.3,103.5,std=58.4,57.1,57.4,scale=1,order=bgr")):
        assert (px.to_pixels(px.from_pixels(rgb)) == rgb).all()
    assert PixelFormat.parse("imagenet") == IMAGENET
    assert PixelFormat.parse("0-255").scale == 1.0
    for bad in ("mean=1,2", "std=0,1,1", "order=yuv", "gamma=2", "mean=a,b,c"):
        with pytest.raises(ValueError):
            PixelFormat.parse(bad)


def test_a_normalised_input_over_jpeg_matches_the_whole_model(normalised_plan):
    """The user's path: frames from the camera, normalised by the plan's format, sent all-cloud as
    the default codec (JPEG) to a real cloud, which applies the normalisation."""
    from splitinfer.cloud import CloudService
    from splitinfer.edge import EdgeAgent
    from splitinfer.splitter.profiler import make_session

    plan = normalised_plan
    spec = plan.inputs[0]
    assert spec.pixels == IMAGENET
    x = IMAGENET.from_pixels(camera())
    assert x.min() < -0.5 and x.max() > 1.2  # a normalised input: far outside [0, 1]
    sess = make_session(str(plan.model_file))
    want = sess.run(None, {"input": x})[0]
    clipped = sess.run(None, {"input": decode_tensor(encode_tensor(x, "jpeg"))})[0]  # the old [0, 1] clip
    enc = encode_tensor(x, "jpeg", pixels=IMAGENET)  # what JPEG itself costs: the model on its own pixels
    via_jpeg = sess.run(None, {"input": decode_tensor(enc, pixels=IMAGENET)})[0]

    async def main():
        async with CloudService([plan], listen=("127.0.0.1", 0), http=None, advertise=False) as svc:
            url = f"tcp://127.0.0.1:{svc.port}"
            async with EdgeAgent(plan, url, candidate="cloud", input_codec="jpeg") as ag:
                r = await ag.infer({"input": x})
            async with EdgeAgent(plan, url, candidate="cloud") as ag:  # the defaults: the plan's cheapest setting
                setting = ag.settings[[c.id for c in plan.candidates].index("cloud")]
                return r, await ag.infer({"input": x}), setting
    r, r_auto, setting = arun(main(), timeout=60)
    rung = plan.candidate("cloud").rung(*setting)
    assert rung is not None and rung.fidelity >= 0.98
    assert r_auto.placement == "cloud" and not r_auto.fallback
    err = np.linalg.norm(r_auto.outputs["output"] - want) / np.linalg.norm(want)
    assert err <= 1.5 * (1 - rung.fidelity) + 1e-6, (setting, err)  # what the plan measured for that setting
    assert r.placement == "cloud" and not r.fallback, r.fallback_reason
    got = r.outputs["output"]
    scale = np.abs(want).max()
    assert np.abs(got - via_jpeg).max() <= 1e-4 * scale  # exactly JPEG's cost, nothing more
    assert np.abs(got - want).max() <= 0.1 * scale
    assert np.abs(clipped - want).max() > 5 * np.abs(got - want).max()  # what clipping to [0, 1] did
    assert r.bytes_sent < x.nbytes / 8  # a JPEG, not fp16 of the tensor


def test_the_graphs_own_normalisation_is_read():
    """A graph that begins with (x - mean) / std on 0..255 pixels: its input is plain pixels."""
    mean = numpy_helper.from_array((np.array([0.485, 0.456, 0.406], np.float32) * 255).reshape(1, 3, 1, 1), "mean")
    std = numpy_helper.from_array((np.array([0.229, 0.224, 0.225], np.float32) * 255).reshape(1, 3, 1, 1), "std")
    prefix = [helper.make_node("Sub", ["input", "mean"], ["c"], name="sub"),
              helper.make_node("Div", ["c", "std"], ["x"], name="div")]
    assert read_pixel_format(conv_model(prefix, [mean, std]), "input") == PixelFormat(scale=1.0)
    unit = [numpy_helper.from_array(np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1), "mean"),
            numpy_helper.from_array(np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1), "std")]
    assert read_pixel_format(conv_model(prefix, unit), "input") == PixelFormat()  # on the [0, 1] scale
    assert read_pixel_format(conv_model(), "input") is None  # nothing to read: unknown


def test_split_records_what_the_graph_says(tmp_path):
    s255 = numpy_helper.from_array(np.array(255.0, np.float32), "s255")
    onnx.save(conv_model([helper.make_node("Div", ["input", "s255"], ["x"], name="div")], [s255]), tmp_path / "m.onnx")
    plan = split_model(tmp_path / "m.onnx", tmp_path / "plan", budget_s=0.02, report=False).plan
    assert plan.inputs[0].pixels == PixelFormat(scale=1.0)


def test_jpeg_without_a_known_pixel_format_is_exit_2(tmp_path):
    onnx.save(conv_model(), tmp_path / "m.onnx")
    plan = split_model(tmp_path / "m.onnx", tmp_path / "plan", budget_s=0.02, report=False).plan
    assert plan.inputs[0].pixels is None
    from splitinfer.edge import EdgeAgent

    assert EdgeAgent(plan, None).input_codec == "fp16"  # not JPEG by default
    with pytest.raises(SplitinferError, match="--normalize"):
        EdgeAgent(plan, None, input_codec="jpeg")
    out = tmp_path / "results.jsonl"
    p = subprocess.run([sys.executable, "-m", "splitinfer", "edge", "run", str(plan.path), "--cloud", "none",
                        "--input-codec", "jpeg", "--frames", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "--normalize" in p.stderr and "input" in p.stderr
    assert not out.exists()  # nothing written


def test_a_bad_pixel_format_in_the_manifest_is_named(normalised_plan, tmp_path):
    import shutil

    from splitinfer.splitter.plan import plan_hash

    d = tmp_path / "bad"
    shutil.copytree(normalised_plan.path, d)
    m = json.loads((d / "manifest.json").read_text())
    m["inputs"][0]["pixels"]["std"] = [0.2, 0.0, 0.2]
    m["plan_hash"] = plan_hash(m)
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PlanFormatError, match=r"inputs\[0\]\.pixels"):
        Plan.load(d)
