"""The splitinfer command, run as a user runs it: exit codes, --json, errors that name the
problem, nothing written on failure."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "splitinfer", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_split_verify_inspect_profile(tmp_path, chain_onnx):
    out = tmp_path / "plan"
    p = run("split", chain_onnx, "-o", out, "--candidates", "4", "--json")
    assert p.returncode == 0, p.stderr
    summary = last_json(p)
    assert summary["ok"] and summary["verification"]["ok"]
    assert 2 <= len(summary["candidates"]) <= 4
    assert (out / "manifest.json").exists() and (out / "report.png").exists()

    p = run("verify", out, "--json")
    assert p.returncode == 0 and last_json(p)["ok"]
    np.save(tmp_path / "x.npy", np.ones((1, 3, 32, 32), np.float32))
    p = run("verify", out, "--input", tmp_path / "x.npy")
    assert p.returncode == 0 and "all candidates match" in p.stdout

    p = run("inspect", out, "--json")
    assert p.returncode == 0 and last_json(p)["plan_hash"] == summary["plan_hash"]
    p = run("inspect", out)
    assert "candidates" in p.stdout and "all-cloud" in p.stdout

    p = run("profile", out, "--role", "edge", "--name", "jetson", "--json")
    assert p.returncode == 0, p.stderr
    assert last_json(p)["device"] == "jetson"
    assert "jetson" in last_json(run("inspect", out, "--json"))["profiles"]


def test_verify_fails_with_exit_1(plan_copy):
    """A consistent plan (hashes recomputed) whose cloud segment computes something else."""
    import json

    import onnx
    from onnx import numpy_helper

    from splitinfer.splitter.plan import plan_hash, sha256_file

    manifest = json.loads((plan_copy / "manifest.json").read_text())
    cand = next(c for c in manifest["candidates"] if c["id"] == "cloud")
    seg = plan_copy / cand["cloud"]["file"]
    model = onnx.load(str(seg))
    init = model.graph.initializer[0]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2 + 1, init.name))
    onnx.save(model, str(seg))
    cand["cloud"]["sha256"] = sha256_file(seg)
    manifest["plan_hash"] = plan_hash(manifest)
    (plan_copy / "manifest.json").write_text(json.dumps(manifest))
    p = run("verify", plan_copy, "--json")
    assert p.returncode == 1, p.stderr
    assert not last_json(p)["ok"]


@pytest.mark.parametrize("flag,value", [("--tolerance", "-1"), ("--tolerance", "nan"), ("--threads", "0")])
def test_bad_numbers_exit_2_naming_the_flag(yolo_plan, flag, value):
    p = run("verify", yolo_plan, flag, value)
    assert p.returncode == 2
    assert flag in p.stderr


@pytest.mark.parametrize("content", [b"", b"garbage" * 100])
def test_bad_model_exit_2_and_nothing_written(tmp_path, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    p = run("split", bad, "-o", tmp_path / "plan", "--json")
    assert p.returncode == 2
    assert "error:" in p.stderr and "bad.onnx" in p.stderr
    assert last_json(p)["ok"] is False
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad.onnx"]


def test_dynamic_shape_without_input_shape_exit_2(tmp_path):
    from onnx import TensorProto, helper

    from conftest import make_model

    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])])
    path = tmp_path / "dyn.onnx"
    path.write_bytes(model.SerializeToString())
    p = run("split", path, "-o", tmp_path / "plan")
    assert p.returncode == 2 and "--input-shape x=" in p.stderr
    assert not (tmp_path / "plan").exists()
    p = run("split", path, "-o", tmp_path / "plan", "--input-shape", "x=1,3,8,8", "--json")
    assert p.returncode == 0, p.stderr


def test_forced_cut_not_closed_exit_2(tmp_path, yolo_onnx):
    p = run("split", yolo_onnx, "-o", tmp_path / "plan", "--cut", "no_such")
    assert p.returncode == 2 and "'no_such' is not a tensor of the model" in p.stderr
    assert not (tmp_path / "plan").exists()


def test_corrupted_plan_exit_2(plan_copy):
    seg = next((plan_copy / "segments").glob("*.onnx"))
    seg.write_bytes(seg.read_bytes()[:-5])
    for cmd in ("verify", "inspect"):
        p = run(cmd, plan_copy)
        assert p.returncode == 2 and "sha256" in p.stderr


def test_runs_from_the_repo_root_and_elsewhere(tmp_path):
    from conftest import REPO

    for cwd in (REPO, tmp_path):
        p = run("--version", cwd=cwd)
        assert p.returncode == 0 and p.stdout.startswith("splitinfer ")
