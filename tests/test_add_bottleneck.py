"""A learned bottleneck added to a plan (``splitinfer bottleneck``): the plan is rewritten whole or
not at all, the candidate is verified and priced as it travels (rans with the plan's tables), and it
runs like any other candidate: over a real TCP link to a real cloud service, and refused where a
peer or a manifest misuses its codec."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from conftest import arun
from test_cli import last_json, run

pytest.importorskip("torch")

from splitinfer.errors import PlanFormatError  # noqa: E402
from splitinfer.frames import scene_frames  # noqa: E402
from splitinfer.splitter import Plan, add_bottleneck  # noqa: E402
from splitinfer.splitter.profiler import make_session  # noqa: E402
from splitinfer.splitter.wire_bytes import rel_error  # noqa: E402
from splitinfer.splitter.wire_settings import below_floor, codec_settings  # noqa: E402

QUICK = dict(frames="scene", train_frames=16, eval_frames=4, minutes=0.08, channels=8, hidden=32)


@pytest.fixture(scope="module")
def bottleneck_plan(tmp_path_factory, yolo_plan):
    dst = tmp_path_factory.mktemp("bplan") / "plan"
    shutil.copytree(yolo_plan, dst)
    add_bottleneck(dst, "c1", **QUICK)
    return dst


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_the_command_adds_a_verified_candidate_and_rehashes_the_plan(tmp_path, yolo_plan):
    plan_dir = tmp_path / "plan"
    shutil.copytree(yolo_plan, plan_dir)
    before = Plan.load(plan_dir)
    p = run("bottleneck", plan_dir, "--at", "c1", "--frames", "scene", "--minutes", "0.08", "--train-frames", "16",
            "--eval-frames", "4", "--channels", "8", "--hidden", "32", "--json")
    assert p.returncode == 0, p.stderr
    out = last_json(p)
    after = Plan.load(plan_dir)  # every file hashed again
    assert out["ok"] and out["candidate"] == "b1" and out["at"] == "getitem_20"
    assert out["plan_hash"] == after.hash != before.hash
    ids = [c.id for c in after.candidates]
    assert ids == [c.id for c in before.candidates if c.id != "edge"] + ["b1", "edge"]
    for old in before.candidates:  # the other candidates are as they were
        assert after.candidate(old.id).to_json() == old.to_json()
    b1 = after.candidate("b1")
    assert b1.bottleneck is not None and b1.bottleneck.at == "getitem_20" and b1.bottleneck.distilled == "outputs"
    assert [r.codec for r in b1.wire] == ["rans"]
    c1_cheapest = min(r.nbytes for r in after.candidate("c1").wire)
    assert b1.wire[0].nbytes < c1_cheapest / 4, (b1.wire, after.candidate("c1").wire)
    assert all("b1" in prof["candidates"] for prof in after.profiles.values())
    assert [e.name for e in plan_dir.parent.iterdir()] == ["plan"]  # no temporary directory left

    v = run("verify", plan_dir, "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    checks = {c["id"]: c for c in last_json(v)["candidates"]}
    assert checks["b1"]["ok"] and 0.0 <= checks["b1"]["fidelity"] <= 1.0
    assert "fidelity" not in checks["c1"]  # the others are still checked bit for bit
    i = run("inspect", plan_dir, "--json")
    assert i.returncode == 0 and "b1" in [c["id"] for c in last_json(i)["candidates"]]


@pytest.mark.parametrize("args,match", [
    (["--at", "input"], "a bottleneck goes after a cut in the middle"),
    (["--at", "edge"], "sends nothing"),
    (["--at", "no_such_tensor"], "not a tensor of the model"),
    (["--at", "cat_16"], "a model output"),
    (["--at", "getitem_20", "--frames", "/nonexistent/video.mp4"], "--frames"),
])
def test_bad_input_is_exit_2_naming_it_and_the_plan_is_untouched(tmp_path, yolo_plan, args, match):
    plan_dir = tmp_path / "plan"
    shutil.copytree(yolo_plan, plan_dir)
    before = _snapshot(plan_dir)
    if "--frames" not in args:
        args = [*args, "--frames", "scene"]
    p = run("bottleneck", plan_dir, *args, "--minutes", "0.05", "--train-frames", "4", "--eval-frames", "2")
    assert p.returncode == 2, p.stderr
    assert match in p.stderr
    assert _snapshot(plan_dir) == before
    assert [e.name for e in tmp_path.iterdir()] == ["plan"]


def test_a_bottleneck_frame_crosses_a_real_link_rans_coded(bottleneck_plan):
    """Pinned to the bottleneck, a frame's latent travels rans over TCP to a real service, which
    decodes it with the plan's tables and runs decoder + back; the outputs are the whole model's
    within what the candidate's recorded fidelity allows."""
    pytest.importorskip("aiohttp")
    from splitinfer.cloud import CloudService
    from splitinfer.edge import EdgeAgent

    plan = Plan.load(bottleneck_plan)
    b1 = plan.candidate("b1")
    assert codec_settings(plan)[[c.id for c in plan.candidates].index("b1")] == ("rans", None)
    frame = next(scene_frames(plan.inputs, 1, seed=11))

    async def main():
        async with CloudService([bottleneck_plan], listen=("127.0.0.1", 0), http=None, advertise=False) as svc:
            async with EdgeAgent(plan, f"tcp://127.0.0.1:{svc.port}", candidate="b1") as ag:
                return await ag.infer(frame)
    r = arun(main())
    assert r.candidate == "b1" and r.cloud_segment == "cloud" and not r.fallback, r
    assert r.bytes_sent < b1.cut_bytes / 4  # the coded latent, not its floats
    whole = make_session(str(plan.model_file))
    want = dict(zip(plan.output_names, whole.run(list(plan.output_names), frame)))
    err = max(rel_error(r.outputs[n], want[n]) for n in plan.output_names)
    assert err <= (1.0 - b1.wire[0].fidelity) + 0.05, err


def test_a_bottleneck_below_the_fidelity_floor_is_left_out(bottleneck_plan):
    """The floor (--min-fidelity) leaves out a bottleneck measured below it: the agent never
    chooses it unless pinned. (This untrained test model's outputs barely notice the bottleneck,
    so its measured fidelity is set lower here.)"""
    from splitinfer.edge import EdgeAgent
    from splitinfer.splitter.plan import Rung

    plan = Plan.load(bottleneck_plan)
    k = [c.id for c in plan.candidates].index("b1")
    b1 = plan.candidates[k]
    plan.candidates[k] = dataclasses.replace(b1, wire=(Rung("rans", b1.wire[0].nbytes, 0.9),))
    assert below_floor(plan, 0.95) == [k] and below_floor(plan, 0.9) == []
    ag = EdgeAgent(plan, None, min_fidelity=0.95, warmup=False)
    assert ag.usable is not None and k not in ag.usable and len(ag.usable) == len(plan.candidates) - 1
    assert EdgeAgent(plan, None, min_fidelity=0.9, warmup=False).usable is None


def test_rans_is_refused_for_a_candidate_without_a_latent(bottleneck_plan):
    from splitinfer.cloud.admission import RequestError, check_request
    from splitinfer.codecs import encode_tensor
    from splitinfer.transport import wire

    plan = Plan.load(bottleneck_plan)
    b1, c1 = plan.candidate("b1"), plan.candidate("c1")
    latent = np.zeros(b1.cut[0].shape, np.float32)
    ok = wire.InferRequest(1, plan.hash, "b1", {b1.cut[0].name: encode_tensor(latent, "rans", tables=b1.bottleneck.tables)})
    assert check_request(plan, ok, 8) is b1
    spec = c1.cut[0]
    bad = wire.InferRequest(2, plan.hash, "c1", {spec.name: encode_tensor(np.zeros(spec.shape, np.float32)[:, :8],
                                                                         "rans", tables=b1.bottleneck.tables)})
    bad.tensors[spec.name].shape = spec.shape  # a header that fits the cut, carrying a rans payload
    with pytest.raises(RequestError, match="rans, which is for a learned bottleneck"):
        check_request(plan, bad, 8)


@pytest.mark.parametrize("edit,match", [
    (lambda b: b["bottleneck"].update(channels=4096, entropy={**b["bottleneck"]["entropy"], "precision": 16}),
     "tables of at most"),
    (lambda b: b["bottleneck"]["entropy"].update(freqs=[[1, 0]] * 8), "valid entropy tables"),
    (lambda b: b["bottleneck"].update(latent="getitem_20"), "the name of the candidate's one cut tensor"),
    (lambda b: b.update(wire=[{"codec": "int8", "bytes": 10, "fidelity": 1.0}]), "rans only"),
])
def test_a_forged_bottleneck_record_is_refused_naming_the_field(tmp_path, bottleneck_plan, edit, match):
    plan_dir = tmp_path / "plan"
    shutil.copytree(bottleneck_plan, plan_dir)
    m = json.loads((plan_dir / "manifest.json").read_text())
    edit(next(c for c in m["candidates"] if c["id"] == "b1"))
    (plan_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PlanFormatError, match=match):
        Plan.load(plan_dir)


def test_rans_on_a_candidate_that_is_not_a_bottleneck_is_refused(plan_copy):
    m = json.loads((plan_copy / "manifest.json").read_text())
    c1 = next(c for c in m["candidates"] if c["id"] == "c1")
    c1["wire"] = [{"codec": "rans", "bytes": 10, "fidelity": 1.0}]
    (plan_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PlanFormatError, match="rans only for a bottleneck"):
        Plan.load(plan_copy)


def test_weights_saved_once_attach_to_another_copy_without_torch(tmp_path, yolo_plan):
    """--save writes the trained weights; --weights attaches them to another copy of the plan
    without training and without importing torch (a demo or a deployment ships the weights, not a
    training run): the same candidate, byte for byte."""
    import subprocess
    import sys

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(yolo_plan, a)
    shutil.copytree(yolo_plan, b)
    npz = tmp_path / "b1.npz"
    add_bottleneck(a, "c1", save=npz, **QUICK)
    code = ("import sys\n"
            "from splitinfer.splitter import add_bottleneck\n"
            f"add_bottleneck({str(b)!r}, None, weights={str(npz)!r}, frames='scene', eval_frames=4)\n"
            "assert 'torch' not in sys.modules, 'attaching imported torch'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    pa, pb = Plan.load(a), Plan.load(b)
    ca, cb = pa.candidate("b1"), pb.candidate("b1")
    assert (ca.edge.sha256, ca.cloud.sha256) == (cb.edge.sha256, cb.cloud.sha256)
    assert ca.bottleneck.tables.to_json() == cb.bottleneck.tables.to_json()
    assert cb.bottleneck.training["weights"] == "b1.npz"

    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    p = run("bottleneck", b, "--weights", tmp_path / "bad.npz", "--frames", "scene")
    assert p.returncode == 2 and "not a bottleneck weights file" in p.stderr
    p = run("bottleneck", b, "--frames", "scene")
    assert p.returncode == 2 and "--at" in p.stderr
