"""The traffic-camera demo: the renderer's ground truth, the headless run end to end (cloud,
link emulator, edge, tracking, counts), and the dashboard in headless Chromium, stopped with
Ctrl-C (SIGINT) leaving no process or port behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from splitinfer.demos.traffic_camera.app import DEFAULT_TRACE, default_model, load_classes
from splitinfer.demos.traffic_camera.scene import CLASSES, TrafficScene

pytest.importorskip("supervision")
pytest.importorskip("trackers")

MODEL = default_model()
needs_model = pytest.mark.skipif(not MODEL.is_file(), reason=f"no trained detector at {MODEL} "
                                 "(python demos/traffic_camera/train.py makes it)")


def test_scenes_have_exact_boxes_of_every_class_and_vary():
    seen = set()
    a, b = TrafficScene(160, seed=1), TrafficScene(160, seed=2)
    for _ in range(40):
        img, boxes, classes = a.step()
        assert img.shape == (160, 160, 3) and img.dtype == np.uint8
        assert boxes.shape == (len(classes), 4)
        assert ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).all()
        assert (boxes >= 0).all() and (boxes <= 160).all()
        seen |= set(classes.tolist())
    assert seen <= set(range(len(CLASSES))) and len(seen) >= 3
    assert not np.array_equal(a.step()[0], b.step()[0])  # different cameras, light and traffic


def test_class_names_come_from_the_model_metadata_or_a_file(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 7, 10])
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])
    g = helper.make_graph([], "g", [x], [out])
    m = helper.make_model(g)
    onnx.save(m, tmp_path / "plain.onnx")
    assert load_classes(tmp_path / "plain.onnx") == ["class0", "class1", "class2"]
    entry = m.metadata_props.add()
    entry.key, entry.value = "names", "{0: 'person', 1: 'bicycle', 2: 'car'}"  # as YOLO exports write it
    onnx.save(m, tmp_path / "named.onnx")
    assert load_classes(tmp_path / "named.onnx") == ["person", "bicycle", "car"]
    (tmp_path / "names.txt").write_text("a\nb\n")
    assert load_classes(tmp_path / "named.onnx", tmp_path / "names.txt") == ["a", "b"]
    assert DEFAULT_TRACE[0][1] > 0 and any(r == 0 for _, r in DEFAULT_TRACE)  # the default trace has a dead spot


@needs_model
def test_the_demo_plan_carries_the_shipped_bottleneck(tmp_path):
    """The shipped bottleneck's weights (train_bottleneck.py) are attached to the demo's plan as
    b1 without training or PyTorch: a mid-network candidate that sends a fraction of the JPEG of
    the frame; and the cached plan is keyed by them."""
    from splitinfer.demos.traffic_camera.app import BOTTLENECK_WEIGHTS, prepare_plan
    from splitinfer.splitter import Plan

    if not BOTTLENECK_WEIGHTS.is_file():
        pytest.skip(f"no bottleneck weights at {BOTTLENECK_WEIGHTS} (demos/traffic_camera/train_bottleneck.py)")
    plan = Plan.load(prepare_plan(MODEL, tmp_path))
    b1 = plan.candidate("b1")
    assert b1.bottleneck is not None and b1.bottleneck.at == "silu_12" and [r.codec for r in b1.wire] == ["rans"]
    jpeg = plan.candidate("cloud").rung("jpeg", 90)
    assert b1.wire[0].nbytes < jpeg.nbytes / 5, (b1.wire, jpeg)
    plain = Plan.load(prepare_plan(MODEL, tmp_path, bottleneck=False))
    assert plain.path != plan.path and "b1" not in [c.id for c in plain.candidates]
    assert [p.name for p in (tmp_path / "demo-plans").iterdir() if p.name.startswith(".")] == []  # no staging left


def _demo(*args: str, cache: Path) -> subprocess.Popen[str]:
    env = os.environ | {"SPLITINFER_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "splitinfer", "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


@needs_model
def test_headless_demo_counts_vehicles_and_reports(tmp_path):
    proc = _demo("--headless", "--frames", "80", "--bandwidth", "20mbit", "--json", cache=tmp_path)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["frames"] == 80
    assert set(summary["vehicles"]) == set(load_classes(MODEL))
    assert sum(summary["vehicles"].values()) >= 1, summary  # 8 s of traffic crosses the line
    assert summary["cuts"] and summary["latency_ms"]["p50"] > 0


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@needs_model
def test_dashboard_in_headless_chromium_updates_and_ctrl_c_stops_everything(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it when it can)")
    proc = _demo("--http", "127.0.0.1:0", "--bandwidth", "20mbit", cache=tmp_path)
    try:
        url = None
        deadline = time.monotonic() + 180
        lines = []
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            lines.append(line)
            m = re.search(r"dashboard: (http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "".join(lines)[-2000:]
        port = int(url.rsplit(":", 1)[1])

        def page() -> tuple[int, int]:
            dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                                  "--dump-dom", url], capture_output=True, text=True, timeout=60).stdout
            frames = int(re.search(r'id="frames">(\d+)<', dom).group(1))  # type: ignore[union-attr]
            counts = sum(int(v) for v in re.findall(r'data-class="[^"]+">(\d+)<', dom))
            assert 'id="video" src="/video.mjpg"' in dom
            return frames, counts

        t = time.monotonic()
        first = page()
        while first[0] == 0 and time.monotonic() - t < 60:  # the page has drawn frames
            first = page()
        second = page()
        while (second[0] <= first[0] or second[1] == 0) and time.monotonic() - t < 120:
            second = page()
        assert second[0] > first[0] > 0, (first, second)  # frames update
        assert second[1] > 0, (first, second)  # vehicles get counted
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:]
    assert _free(port)
