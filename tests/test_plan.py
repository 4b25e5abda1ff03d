"""The plan on disk: contents, hashes, atomic writes, segments that run and batch, verification,
profiles that keep the hash, and corrupted plans refused with named errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from splitinfer import PlanError, PlanFormatError, PlanIntegrityError, ShapeError, SplitinferError
from splitinfer.splitter import Plan, analyse, load_model, profile_plan, split_model, verify_plan
from splitinfer.splitter.plan import plan_hash, sha256_file


def test_manifest_has_the_contract_fields(yolo_plan, yolo_onnx):
    m = json.loads((yolo_plan / "manifest.json").read_text())
    assert m["format"] == "splitinfer-plan" and m["format_version"] == 1
    assert m["model"]["sha256"] == sha256_file(yolo_onnx) == sha256_file(yolo_plan / "model.onnx")
    assert m["inputs"] == [{"name": "input", "shape": [1, 3, 64, 64], "dtype": "float32", "bytes": 49152,
                            "pixels": {"scale": 1 / 255, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
                                       "order": "rgb"}}]
    assert m["plan_hash"] == plan_hash(m)
    ids = [c["id"] for c in m["candidates"]]
    assert ids[0] == "cloud" and ids[-1] == "edge" and len(ids) <= 8
    for c in m["candidates"]:
        assert {"id", "kind", "cut", "cut_bytes", "edge", "cloud", "flops", "passthrough"} <= set(c)
        for t in c["cut"]:
            assert t["bytes"] == int(np.prod(t["shape"])) * 4
        for side in ("edge", "cloud"):
            if c[side]:
                assert sha256_file(yolo_plan / c[side]["file"]) == c[side]["sha256"]
        assert c["flops"]["edge"] + c["flops"]["cloud"] == m["model"]["flops"]
    prof = m["profiles"]["split-host"]
    assert prof["role"] == "both" and prof["whole_ms"] > 0
    assert set(prof["candidates"]) == set(ids)
    assert all(v >= 0 for times in prof["candidates"].values() for v in times.values())
    assert prof["node_ms"]  # per-node costs from ORT's profiler
    assert (yolo_plan / "report.png").stat().st_size > 10_000


def test_segments_pass_the_checker_and_cloud_segments_take_any_batch(yolo_plan):
    plan = Plan.load(yolo_plan)
    for c in plan.candidates:
        for ref in (c.edge, c.cloud):
            if ref:
                onnx.checker.check_model(str(plan.file(ref)))
        if c.cloud:
            assert c.cloud.batch_dynamic
            sess = ort.InferenceSession(str(plan.file(c.cloud)), providers=["CPUExecutionProvider"])
            feeds = {t.name: np.random.default_rng(0).random((5, *t.shape[1:]), dtype=np.float32) for t in c.cut}
            outs = sess.run(None, feeds)
            assert all(o.shape[0] == 5 for o in outs)


def test_verify_passes_on_random_and_given_inputs(yolo_plan):
    plan = Plan.load(yolo_plan)
    x = {"input": np.full((1, 3, 64, 64), 0.5, np.float32)}
    report = verify_plan(plan, extra_inputs=[x])
    assert report.ok and report.inputs[-1] == "given[0]"
    assert all(c.max_abs_diff <= 1e-5 for c in report.checks)
    with pytest.raises(ShapeError, match=r"expected shape \[1, 3, 64, 64\], got \[1, 3, 32, 32\]"):
        verify_plan(plan, extra_inputs=[{"input": np.zeros((1, 3, 32, 32), np.float32)}])


def test_verify_detects_a_wrong_segment(plan_copy):
    # Replace c1's cloud segment by one that adds 1 to its first output, re-hash, and verify.
    plan = Plan.load(plan_copy)
    cand = next(c for c in plan.candidates if c.kind == "split")
    path = plan.file(cand.cloud)
    model = onnx.load(path)
    out = model.graph.output[0].name
    model.graph.node[-1].output[0] = out + "_pre"
    one = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one_")
    model.graph.initializer.append(one)
    model.graph.node.append(onnx.helper.make_node("Add", [out + "_pre", "one_"], [out]))
    onnx.save(model, path)
    m = json.loads((plan_copy / "manifest.json").read_text())
    for c in m["candidates"]:
        if c["id"] == cand.id:
            c["cloud"]["sha256"] = sha256_file(path)
    m["plan_hash"] = plan_hash(m)
    (plan_copy / "manifest.json").write_text(json.dumps(m))
    report = verify_plan(Plan.load(plan_copy))
    bad = [c for c in report.checks if not c.ok]
    assert not report.ok and [c.id for c in bad] == [cand.id]
    assert "differ from the whole model by 1" in bad[0].problem


def test_tampered_segment_is_refused(plan_copy):
    seg = next((plan_copy / "segments").glob("*_cloud.onnx"))
    data = bytearray(seg.read_bytes())
    data[-10] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(PlanIntegrityError, match=rf"{seg.name} has sha256 .* the manifest expects"):
        Plan.load(plan_copy)


def test_missing_segment_is_refused(plan_copy):
    seg = next((plan_copy / "segments").glob("*_edge.onnx"))
    seg.unlink()
    with pytest.raises(PlanIntegrityError, match=f"{seg.name} is missing"):
        Plan.load(plan_copy)


def test_edited_manifest_is_refused(plan_copy):
    m = json.loads((plan_copy / "manifest.json").read_text())
    m["candidates"][1]["cut_bytes"] = 1
    (plan_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PlanIntegrityError, match="the manifest was edited"):
        Plan.load(plan_copy)


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update(format_version=99), "plan format version 99; this splitinfer reads version 1"),
    (lambda m: m.update(format="other"), "expected format 'splitinfer-plan', got 'other'"),
    (lambda m: m.pop("candidates"), "manifest field candidates is missing"),
])
def test_malformed_manifests(plan_copy, edit, match):
    m = json.loads((plan_copy / "manifest.json").read_text())
    edit(m)
    (plan_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PlanFormatError, match=match):
        Plan.load(plan_copy)


def test_not_a_plan(tmp_path):
    with pytest.raises(PlanFormatError, match="not a plan directory"):
        Plan.load(tmp_path / "nothing")
    with pytest.raises(PlanFormatError, match="no manifest.json"):
        Plan.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(PlanFormatError, match="not valid JSON"):
        Plan.load(tmp_path)


def test_failed_split_leaves_nothing(tmp_path, yolo_onnx):
    out = tmp_path / "plan"
    # an extra verification input of the wrong shape fails the last step, inside the temporary directory
    with pytest.raises(Exception):  # noqa: B017 - whatever onnxruntime raises for it
        split_model(yolo_onnx, out, budget_s=0.01, verify_inputs=[{"x": np.zeros((1, 3, 7, 7), np.float32)}])
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SplitinferError, match="tolerance"):  # checked before any work
        split_model(yolo_onnx, out, tolerance=-1.0, budget_s=0.01)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary directory left either


def test_existing_plan_is_kept_unless_forced(tmp_path, chain_onnx):
    out = tmp_path / "plan"
    # profile=False: node costs from FLOPs and bytes, not timings, so the cuts cannot differ
    # between the two runs on a busy machine (with profiling they may, and the hash with them)
    first = split_model(chain_onnx, out, budget_s=0.01, report=False, profile=False).plan
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(PlanError, match="a plan exists there; choose another directory or pass --force"):
        split_model(chain_onnx, out, budget_s=0.01)
    assert (out / "manifest.json").read_bytes() == before
    second = split_model(chain_onnx, out, budget_s=0.01, report=False, force=True, profile=False).plan
    assert second.hash == first.hash  # same model, same cuts: same plan hash
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]


def test_profile_on_another_device_keeps_the_hash(plan_copy):
    plan = Plan.load(plan_copy)
    before = plan.hash
    name, info = profile_plan(plan, role="edge", device="jetson-test", budget_s=0.01)
    again = Plan.load(plan_copy)
    assert again.hash == before and name == "jetson-test"
    prof = again.profiles["jetson-test"]
    assert prof["role"] == "edge" and set(prof["candidates"]) == {c.id for c in again.candidates}
    assert all("edge_ms" in v and "cloud_ms" not in v for v in prof["candidates"].values())


def test_forced_cut_through_a_transformer_block(tmp_path, transformer_onnx):
    g = analyse(load_model(transformer_onnx).static)
    from splitinfer.splitter.cuts import cut_from_edge_nodes

    mid = next(n for n in g.nodes if n.op_type == "Softmax")
    closed = cut_from_edge_nodes(g, g.ancestors([mid.outputs[0]])).tensors
    res = split_model(transformer_onnx, tmp_path / "tf", cut=list(closed), budget_s=0.01)
    assert res.verification and res.verification.ok
    forced = [c for c in res.plan.candidates if c.kind == "split"]
    assert len(forced) == 1 and mid.outputs[0] in [t.name for t in forced[0].cut]
    assert len(forced[0].cut) >= 2  # the residual stream and V cross too
    ops = {n.op_type for n in load_model(transformer_onnx).static.graph.node}
    assert {"MatMul", "Softmax", "LayerNormalization"} <= ops


def test_split_without_profiling_uses_flops(tmp_path, chain_onnx):
    res = split_model(chain_onnx, tmp_path / "p", profile=False)
    assert res.plan.profiles == {} and res.verification.ok
    assert not (tmp_path / "p" / "report.png").exists()
