"""Codec-aware plans: every candidate priced at the bytes it really sends, measured on sample frames
per codec (JPEG for an image input), recorded with its fidelity; the cut search ranks cuts by
those bytes; ``--cut`` adds a candidate; the edge agent's prior is the plan's measurement."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import make_model
from test_cli import last_json, run

from splitinfer.errors import PlanFormatError, SplitinferError
from splitinfer.splitter import Plan, split_model
from splitinfer.splitter.wire_settings import codec_settings, nominal_ratio, wire_ratios


def sparse_then_heavy(channels: int = 32, size: int = 24) -> "object":
    """x (1, 3, S, S) -> a 1x1 conv to ``channels`` channels whose bias puts nearly every value below
    zero -> Relu (``sparse``: raw it is ~11x the input, encoded nearly nothing) -> four 3x3 convs
    (the heavy part) -> y. Priced raw, a cut at ``sparse`` can never beat sending the input; priced
    as it travels, it is the cheapest thing to send."""
    rng = np.random.default_rng(0)
    w0 = numpy_helper.from_array((rng.standard_normal((channels, 3, 1, 1)) * 0.1).astype(np.float32), "w0")
    b0 = numpy_helper.from_array(np.full(channels, -5.0, np.float32), "b0")
    inits = [w0, b0]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["pre"], name="squeeze"),
             helper.make_node("Relu", ["pre"], ["sparse"], name="relu0")]
    prev = "sparse"
    for k in range(4):
        w = numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32), f"w{k + 1}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [prev, f"w{k + 1}"], [f"h{k}"], name=f"conv{k}", pads=[1, 1, 1, 1]))
        prev = f"h{k}"
    nodes.append(helper.make_node("ReduceMean", [prev], ["y"], name="pool", axes=[2, 3], keepdims=0))
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels])], inits, opset=17)


@pytest.fixture(scope="module")
def sparse_onnx(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("m") / "sparse.onnx"
    onnx.save_model(sparse_then_heavy(), path)
    return path


def test_every_remote_candidate_records_what_it_sends_per_codec(yolo_plan):
    plan = Plan.load(yolo_plan)
    assert plan.manifest["wire_samples"] == {"source": "scene", "frames": 4}
    for c in plan.candidates:
        if c.local:
            assert c.wire == ()
            continue
        by = {r.label: r for r in c.wire}
        assert {"fp16", "int8", "int8+lz4", "int8+zstd"} <= set(by), c.id
        assert by["fp16"].nbytes == c.cut_bytes // 2  # fp16 is exactly half of fp32
        assert by["int8"].nbytes < by["fp16"].nbytes
        assert by["int8+zstd"].nbytes <= by["int8"].nbytes + 64  # zstd adds a frame header at most
        assert all(0.0 <= r.fidelity <= 1.0 for r in c.wire)
        assert by["fp16"].fidelity >= by["int8"].fidelity - 1e-6
    cloud = plan.candidate("cloud")  # the image input (pixel format known): a JPEG ladder
    jpeg = sorted((r for r in cloud.wire if r.codec == "jpeg"), key=lambda r: r.quality)
    assert [r.quality for r in jpeg] == [30, 50, 70, 90]
    assert jpeg[0].nbytes < jpeg[-1].nbytes < cloud.rung("int8+zstd").nbytes


def test_the_cut_search_prices_tensors_as_they_travel(tmp_path, sparse_onnx):
    """A mid-network tensor 11x the input's raw size but nearly all zeros: raw pricing never cuts
    there; pricing by measured bytes does, and the plan's table says why."""
    raw = split_model(sparse_onnx, tmp_path / "raw", measure_wire=False, report=False, budget_s=0.02)
    assert [c.kind for c in raw.plan.candidates] == ["cloud", "edge"]
    assert "wire_samples" not in raw.plan.manifest
    measured = split_model(sparse_onnx, tmp_path / "measured", report=False, budget_s=0.02)
    assert measured.plan.manifest["wire_samples"]["source"] == "scene"  # an image-shaped input
    splits = [c for c in measured.plan.candidates if c.kind == "split"]
    assert splits and [t.name for t in splits[0].cut] == ["sparse"]
    c = splits[0]
    assert c.cut_bytes > 10 * measured.plan.candidate("cloud").cut_bytes
    assert c.rung("int8+zstd").nbytes < measured.plan.candidate("cloud").rung("int8+zstd").nbytes / 5
    assert measured.verification.ok


def test_a_forced_cut_is_added_to_the_automatic_candidates(tmp_path, sparse_onnx):
    res = split_model(sparse_onnx, tmp_path / "p", cut=["h1"], report=False, budget_s=0.02)
    cuts = [[t.name for t in c.cut] for c in res.plan.candidates if c.kind == "split"]
    assert ["sparse"] in cuts and ["h1"] in cuts  # the search's pick stays


def test_the_agents_prior_is_the_plans_measurement(yolo_plan):
    plan = Plan.load(yolo_plan)
    ratios = wire_ratios(plan, "int8+zstd")  # the all-cloud input goes as JPEG q90 (pixel format known)
    for c, r in zip(plan.candidates, ratios):
        if c.local:
            assert r == 1.0
        elif c.edge is None:
            assert r * c.cut_bytes == pytest.approx(c.rung("jpeg", 90).nbytes)
        else:
            assert r * c.cut_bytes == pytest.approx(c.rung("int8+zstd").nbytes)
    cloud = [c.id for c in plan.candidates].index("cloud")
    assert wire_ratios(plan, "fp16", input_codec="fp16+zstd")[cloud] == nominal_ratio("fp16+zstd")  # not measured


@pytest.mark.parametrize("rung,field", [
    ({"codec": "int8", "bytes": -1, "fidelity": 1.0}, "wire[0].bytes"),
    ({"codec": "zip", "bytes": 1, "fidelity": 1.0}, "wire[0].codec"),
    ({"codec": "int8", "bytes": 1, "fidelity": 1.5}, "wire[0].fidelity"),
    ({"codec": "jpeg", "bytes": 1, "fidelity": 1.0}, "wire[0].quality"),
    ({"codec": "int8", "bytes": 1}, "wire[0]"),
])
def test_a_plan_with_a_bad_codec_setting_is_refused_naming_it(plan_copy, rung, field):
    from splitinfer.splitter.plan import plan_hash

    mpath = plan_copy / "manifest.json"
    m = json.loads(mpath.read_text())
    m["candidates"][0]["wire"] = [rung]
    m["plan_hash"] = plan_hash(m)
    mpath.write_text(json.dumps(m))
    with pytest.raises(PlanFormatError, match=re.escape(f"candidates[0].{field}")):
        Plan.load(plan_copy)


def test_split_measures_on_a_directory_of_images_and_refuses_a_bad_one(tmp_path, yolo_onnx):
    from PIL import Image

    frames = tmp_path / "frames"
    frames.mkdir()
    yy, xx = np.mgrid[0:48, 0:80]
    for k in range(3):  # smooth pictures (a camera's, not noise), of another size than the model's input
        rgb = np.stack([xx * 3 + k * 20, yy * 5, (xx + yy) * 2], -1) % 256
        Image.fromarray(rgb.astype(np.uint8)).save(frames / f"{k}.png")
    p = run("split", yolo_onnx, "-o", tmp_path / "plan", "--normalize", "0-1", "--frames", frames, "--samples", "2",
            "--json")
    assert p.returncode == 0, p.stderr
    out = last_json(p)
    assert out["wire_samples"] == {"source": "frames", "frames": 2}
    cloud = next(c for c in out["candidates"] if c["id"] == "cloud")
    assert cloud["sends_codec"].startswith("jpeg q") and 0 < cloud["sends"] < cloud["bytes"] / 20
    (frames / "3.png").write_bytes(b"not a png")
    p = run("split", yolo_onnx, "-o", tmp_path / "plan2", "--normalize", "0-1", "--frames", frames)
    assert p.returncode == 2 and "3.png: not a readable image" in p.stderr
    assert not (tmp_path / "plan2").exists()


def test_a_sample_source_that_does_not_fit_the_model_is_an_error(tmp_path, transformer_onnx):
    with pytest.raises(SplitinferError, match=r"the scene source needs a model with one \(1, 3, H, W\) float input"):
        split_model(transformer_onnx, tmp_path / "p", frames="scene", report=False, budget_s=0.01)
    assert not (tmp_path / "p").exists()


def test_auto_takes_each_candidates_cheapest_setting_that_keeps_the_fidelity_floor(yolo_plan):
    plan = Plan.load(yolo_plan)
    for floor in (0.0, 0.99, 1.0):
        for c, st in zip(plan.candidates, codec_settings(plan, "auto", min_fidelity=floor)):
            if c.local:
                assert st is None
                continue
            ok = [r for r in c.wire if r.fidelity >= floor]
            if ok:
                assert c.rung(*st).nbytes == min(r.nbytes for r in ok)
                assert c.rung(*st).fidelity >= floor
            else:  # nothing measured keeps the floor: the safe default
                assert st == (("jpeg", 90) if c.edge is None else ("fp16", None))
    explicit = codec_settings(plan, "int8+lz4")
    assert explicit[0] == ("jpeg", 90) and set(explicit[1:-1]) == {("int8+lz4", None)} and explicit[-1] is None
    assert codec_settings(plan, "auto", input_codec="fp16")[0] == ("fp16", None)  # an asked input codec stands


def test_a_jpeg_ladder_rung_is_chosen_by_its_fidelity(tmp_path, yolo_onnx):
    """The all-cloud JPEG qualities are rungs like any other: a floor below a lower quality's
    fidelity picks it (fewer bytes); a floor above every JPEG's keeps a codec that has it."""
    plan = Plan.load(split_model(yolo_onnx, tmp_path / "p", normalize="0-1", report=False, budget_s=0.02).plan.path)
    cloud = plan.candidate("cloud")
    jpeg = sorted((r for r in cloud.wire if r.codec == "jpeg"), key=lambda r: r.nbytes)
    i = [c.id for c in plan.candidates].index("cloud")
    assert codec_settings(plan, min_fidelity=jpeg[0].fidelity)[i] == ("jpeg", jpeg[0].quality)
    best = max(r.fidelity for r in cloud.wire)
    picked = codec_settings(plan, min_fidelity=best)[i]
    assert cloud.rung(*picked).fidelity == best


def test_the_agent_sends_each_cut_in_its_setting_and_the_cloud_decodes_it(yolo_plan):
    """Against a real cloud, each remote candidate pinned in turn: the frame's bytes are what the
    plan measured for the setting auto picks (the split measured these very scene frames), and
    the outputs are the whole model's within that setting's fidelity."""
    from conftest import arun

    pytest.importorskip("aiohttp")
    import onnxruntime as ort

    from splitinfer.cloud import CloudService
    from splitinfer.edge import EdgeAgent
    from splitinfer.frames import scene_frames

    plan = Plan.load(yolo_plan)
    frames = list(scene_frames(plan.inputs, 2))
    whole = ort.InferenceSession(str(plan.model_file))
    want = [whole.run(None, f)[0] for f in frames]
    settings = codec_settings(plan, "auto")

    async def main():
        got = {}
        async with CloudService([yolo_plan], listen=("127.0.0.1", 0), http=None, advertise=False) as svc:
            for c in plan.candidates:
                if c.local:
                    continue
                async with EdgeAgent(plan, f"tcp://127.0.0.1:{svc.port}", candidate=c.id) as ag:
                    got[c.id] = [await ag.infer(f) for f in frames]
        return got

    got = arun(main(), timeout=120)
    for i, c in enumerate(plan.candidates):
        if c.local:
            continue
        rung = c.rung(*settings[i])
        for r, w in zip(got[c.id], want):
            assert r.placement in ("cloud", "split") and r.candidate == c.id and not r.fallback
            assert abs(r.bytes_sent - rung.nbytes) <= 0.1 * rung.nbytes + 64, (c.id, settings[i], r.bytes_sent)
            y = r.outputs[plan.output_names[0]]
            err = np.linalg.norm(y - w) / np.linalg.norm(w)
            assert err <= (1 - rung.fidelity) * 1.5 + 1e-5, (c.id, settings[i], err)
