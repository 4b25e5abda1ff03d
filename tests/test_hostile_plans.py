"""Plans and the command line against hostile files and careless flags (issue 10's table): every
byte loaded is hashed, every manifest field is checked and named, a user's folder is never
deleted, plans are reproducible, and a missing extra or a busy port is a message, not a traceback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from splitinfer.errors import PlanError, PlanFormatError, PlanIntegrityError
from splitinfer.splitter import Plan, split_model
from splitinfer.splitter.plan import plan_hash, sha256_file


def run(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "splitinfer", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def rewrite(plan_dir: Path, edit) -> None:
    """Edit the manifest and recompute its plan_hash: a consistent, hostile manifest."""
    m = json.loads((plan_dir / "manifest.json").read_text())
    edit(m)
    m["plan_hash"] = plan_hash(m)
    (plan_dir / "manifest.json").write_text(json.dumps(m))


def test_a_segment_with_external_weights_is_refused(plan_copy):
    m = json.loads((plan_copy / "manifest.json").read_text())
    cand = next(c for c in m["candidates"] if c["cloud"] is not None)
    seg = plan_copy / cand["cloud"]["file"]
    model = onnx.load(str(seg))
    onnx.save_model(model, str(seg), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (plan_copy / "segments" / "weights.bin").is_file()

    def edit(m):
        for c in m["candidates"]:
            if c["id"] == cand["id"]:
                c["cloud"]["sha256"] = sha256_file(seg)

    rewrite(plan_copy, edit)
    with pytest.raises(PlanIntegrityError, match="external data.*weights.bin"):
        Plan.load(plan_copy)
    p = run("inspect", plan_copy)
    assert p.returncode == 2 and "weights.bin" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("edit,field", [
    (lambda m: m["candidates"][1]["cut"][0].update(shape=[1, 10 ** 12, 10 ** 6]), "candidates[1].cut[0]"),
    (lambda m: m["candidates"][1]["cut"][0].update(shape=[1, -3]), "candidates[1].cut[0].shape[1]"),
    (lambda m: m["inputs"][0].update(dtype="object"), "inputs[0].dtype"),
    (lambda m: m["candidates"][2].update(id=m["candidates"][1]["id"]), "candidates[2].id"),
    (lambda m: m["candidates"][1].update(kind="teleport"), "candidates[1].kind"),
    (lambda m: m["candidates"][1]["cloud"].update(file="/etc/passwd"), "candidates[1].cloud.file"),
    (lambda m: m["candidates"][1]["cloud"].update(sha256="xyz"), "candidates[1].cloud.sha256"),
    (lambda m: m["candidates"][1].update(flops={"edge": "many", "cloud": 1}), "candidates[1].flops.edge"),
    (lambda m: m.update(candidates=[]), "candidates"),
    (lambda m: m["outputs"].append(dict(m["outputs"][0])), "outputs"),
], ids=["huge-shape", "negative-dim", "dtype-object", "duplicate-id", "kind", "absolute-file", "sha256", "flops",
        "no-candidates", "duplicate-output"])
def test_manifest_fields_are_validated_and_named(plan_copy, edit, field):
    rewrite(plan_copy, edit)
    with pytest.raises(PlanFormatError) as info:
        Plan.load(plan_copy)
    assert field in str(info.value), info.value
    p = run("inspect", plan_copy, "--json")
    assert p.returncode == 2, p.stderr
    assert field in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_split_never_replaces_a_users_folder(tmp_path, chain_onnx):
    users = tmp_path / "photos"
    users.mkdir()
    (users / "holiday.jpg").write_bytes(b"precious")
    for flags in ([], ["--force"]):
        p = run("split", chain_onnx, "-o", users, *flags)
        assert p.returncode == 2, p.stderr
        assert "not a plan directory" in p.stderr
    assert (users / "holiday.jpg").read_bytes() == b"precious"
    assert sorted(x.name for x in users.iterdir()) == ["holiday.jpg"]
    # "-o ." in a user's folder: refused before any work, nothing written or deleted
    p = run("split", chain_onnx, "-o", ".", "--force", cwd=users)
    assert p.returncode == 2 and "not a plan directory" in p.stderr, p.stderr
    assert sorted(x.name for x in users.iterdir()) == ["holiday.jpg"]
    # a file as the destination, and a plan directory holding a user's file
    p = run("split", chain_onnx, "-o", users / "holiday.jpg", "--force")
    assert p.returncode == 2 and (users / "holiday.jpg").read_bytes() == b"precious"
    plan = tmp_path / "plan"
    split_model(chain_onnx, plan, profile=False, verify=False, report=False)
    (plan / "notes.txt").write_text("mine")
    with pytest.raises(PlanError, match="notes.txt"):
        split_model(chain_onnx, plan, profile=False, verify=False, report=False, force=True)
    assert (plan / "notes.txt").read_text() == "mine"
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []


def test_plan_files_follow_the_umask(tmp_path, chain_onnx):
    old = os.umask(0o022)
    try:
        res = split_model(chain_onnx, tmp_path / "plan", budget_s=0.01, verify=False, report=False)
    finally:
        os.umask(old)
    root = res.plan.path
    assert root.stat().st_mode & 0o777 == 0o755
    for f in root.rglob("*"):
        want = 0o755 if f.is_dir() else 0o644
        assert f.stat().st_mode & 0o777 == want, (f, oct(f.stat().st_mode))


def test_the_same_model_gives_the_same_plan_hash_with_profiling(tmp_path, yolo_onnx):
    """Profiled node times differ between runs on a busy machine; the cuts (and the hash) must not."""
    hashes = {split_model(yolo_onnx, tmp_path / f"p{k}", budget_s=0.01, verify=False, report=False).plan.hash
              for k in range(2)}
    assert len(hashes) == 1


def test_a_missing_extra_is_named(yolo_plan, tmp_path):
    """Run the command with aiohttp made unimportable, as on a base install."""
    code = ("import sys; sys.modules['aiohttp'] = None; sys.modules['prometheus_client'] = None\n"
            "from splitinfer.cli import main\n"
            f"sys.exit(main(['cloud', 'serve', {str(yolo_plan)!r}, '--no-advertise']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert 'pip install "splitinfer[cloud]"' in p.stderr and "Traceback" not in p.stderr, p.stderr
    code = ("import sys; sys.modules['torch'] = None\nfrom splitinfer.cli import main\n"
            f"sys.exit(main(['split', 'ref:chain', '-o', {str(tmp_path / 'p')!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and 'splitinfer[torch]' in p.stderr, p.stderr


def test_a_busy_port_names_the_flag(yolo_plan):
    pytest.importorskip("aiohttp")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run("cloud", "serve", yolo_plan, "--listen", "127.0.0.1:0", "--http", f"127.0.0.1:{port}",
                "--no-advertise")
        assert p.returncode == 2 and "--http" in p.stderr and "Traceback" not in p.stderr, p.stderr
        p = run("cloud", "serve", yolo_plan, "--listen", f"127.0.0.1:{port}", "--http", "127.0.0.1:0",
                "--no-advertise")
        assert p.returncode == 2 and "--listen" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_split_checks_the_output_path_before_working(tmp_path, yolo_onnx):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = run("split", yolo_onnx, "-o", blocker / "plan")
    assert p.returncode == 2 and ("writable directory" in p.stderr or "not a plan" in p.stderr), p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["file"]


def test_tampered_weights_in_a_self_contained_segment_are_caught(plan_copy):
    """The reverse of the external-data case: the weights live in the hashed file itself."""
    m = json.loads((plan_copy / "manifest.json").read_text())
    cand = next(c for c in m["candidates"] if c["cloud"] is not None)
    seg = plan_copy / cand["cloud"]["file"]
    model = onnx.load(str(seg))
    init = model.graph.initializer[0]
    init.CopyFrom(numpy_helper.from_array(np.asarray(numpy_helper.to_array(init)) * 3, init.name))
    onnx.save(model, str(seg))
    with pytest.raises(PlanIntegrityError, match="sha256"):
        Plan.load(plan_copy)
    shutil.rmtree(plan_copy)
