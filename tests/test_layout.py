"""House rules, checked: the import rules between the parts, the public names, and that every
module imports on its own without dragging heavy dependencies into the edge install."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO

PARTS = ("edge", "cloud", "splitter", "transport")
# folder -> the parts it must never import (DEVELOPERS.md)
FORBIDDEN = {
    "transport": {"edge", "cloud", "splitter", "demos"},
    "splitter": {"edge", "cloud", "transport", "demos"},
    "edge": {"cloud", "demos"},
    "cloud": {"edge", "demos"},
}
# what the shared root may be imported for by transport: only these modules
TRANSPORT_MAY_USE = {"errors", "_types", "codecs", "rans"}


def _imports(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.lineno, node.module or ""
            else:  # relative: resolve against the package the file is in
                pkg = ["splitinfer", path.parent.name] if path.parent.name in PARTS else ["splitinfer"]
                if path.parent.name == "models":
                    pkg = ["splitinfer", "models"]
                base = pkg[: len(pkg) - (node.level - 1)]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
                if not node.module:
                    for a in node.names:
                        yield node.lineno, ".".join(base + [a.name])


def test_import_rules_between_parts():
    broken = []
    for folder, banned in FORBIDDEN.items():
        for path in (REPO / folder).rglob("*.py"):
            for line, mod in _imports(path):
                parts = mod.split(".")
                if parts[0] == "splitinfer" and len(parts) > 1:
                    if parts[1] in banned:
                        broken.append(f"{path.relative_to(REPO)}:{line} imports {mod}")
                    if folder == "transport" and parts[1] not in TRANSPORT_MAY_USE | {"transport"}:
                        broken.append(f"{path.relative_to(REPO)}:{line} imports {mod} (transport uses shared types only)")
                if parts[0] in ("ultralytics", "torchvision"):
                    broken.append(f"{path.relative_to(REPO)}:{line} imports {parts[0]}")
    assert not broken, "import rules broken:\n" + "\n".join(broken)


def test_the_rule_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "transport"
    bad.mkdir()
    f = bad / "x.py"
    f.write_text("from ..splitter import plan\nimport splitinfer.edge.agent\n")
    found = [m for _, m in _imports(f)]
    assert "splitinfer.splitter" in found and "splitinfer.edge.agent" in found


def test_pyproject_maps_the_parts_and_nothing_else():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    st = cfg["tool"]["setuptools"]
    assert {p.split(".")[0] for p in st["packages"]} == {"splitinfer"}
    for part in PARTS:
        assert st["package-dir"][f"splitinfer.{part}"] == part
    # a root folder named splitinfer/ would shadow the installed package from the repo root
    assert not (REPO / "splitinfer").exists()


def test_public_names():
    import splitinfer
    import splitinfer.splitter as sp

    assert set(splitinfer.__all__) == {
        "__version__", "TensorSpec", "PixelFormat", "SplitinferError", "ModelError", "ModelLoadError", "ShapeError",
        "UnsupportedModelError", "CutError", "PlanError", "PlanFormatError", "PlanIntegrityError",
        "VerificationError", "CodecError", "ProtocolError", "VersionError", "FrameError", "FieldError",
        "LimitError", "TensorError", "ChannelError", "ChannelClosed", "RefusedError", "TlsError", "SourceError",
        "MissingExtraError",
    }
    assert set(sp.__all__) == {
        "split_model", "SplitResult", "profile_plan", "SPLIT_HOST", "add_bottleneck", "BottleneckResult", "load_model", "export_torch",
        "parse_input_shape", "LoadedModel", "analyse", "ModelGraph", "Cut", "cut_from_tensors",
        "find_candidates", "Plan", "Candidate", "SegmentRef", "CostModel", "select_profile",
        "verify_plan", "VerifyReport", "plan_summary", "write_report_png",
    }
    import splitinfer.transport as tr

    assert set(tr.__all__) == {
        "PROTOCOL_VERSION", "Message", "Hello", "Welcome", "Refusal", "InferRequest", "Result", "Error", "Ping",
        "Pong", "Bye", "ServerTimings", "FrameInfo", "Limits", "encode", "decode", "CODEC_NAMES", "Codec",
        "Encoded", "encode_tensor", "decode_tensor", "Channel", "TcpChannel", "TcpServer", "server_ssl_context",
        "client_ssl_context", "MemoryChannel", "memory_pair", "BandwidthMonitor", "ActiveProber", "LinkEmulator",
        "RateSchedule", "load_trace", "parse_rate",
    }
    import splitinfer.cloud as cl

    assert set(cl.__all__) == {"CloudService", "load_tokens", "Batcher", "BatchResult", "Busy", "DeadlineExceeded",
                               "SessionPool", "best_providers"}
    import splitinfer.edge as ed

    assert set(ed.__all__) == {"EdgeAgent", "SyncEdgeAgent", "FrameResult", "Controller", "Choice", "CircuitBreaker",
                               "Backend", "OrtBackend"}
    for mod in (splitinfer, sp, tr, cl, ed):
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name} is exported but missing"


def test_every_error_derives_from_the_root():
    import splitinfer

    for name in splitinfer.__all__:
        obj = getattr(splitinfer, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, splitinfer.SplitinferError)


def _modules():
    for folder, pkg in [("core", "splitinfer"), *((p, f"splitinfer.{p}") for p in PARTS),
                        ("demos", "splitinfer.demos"), ("demos/traffic_camera", "splitinfer.demos.traffic_camera")]:
        for path in sorted((REPO / folder).glob("*.py")):
            if path.name == "__main__.py":
                continue
            yield pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"


@pytest.mark.parametrize("module", list(_modules()))
def test_each_module_imports_alone(module):
    # A fresh interpreter per module: catches import cycles and import-order dependencies.
    code = f"import {module}"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_edge_side_imports_stay_light():
    code = ("import sys, splitinfer, splitinfer.transport, splitinfer.edge, splitinfer.splitter.plan, "
            "splitinfer.splitter.cost_model\n"
            "heavy = [m for m in ('torch', 'aiortc', 'aiohttp', 'zeroconf', 'ray', 'tensorrt', 'matplotlib') "
            "if m in sys.modules]\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
