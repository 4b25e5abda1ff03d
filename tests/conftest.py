"""Shared fixtures: small reference models exported once per session, small plans, and tiny
hand-built ONNX graphs for the cases a real model does not reach."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def _export(name: str, shape: tuple[int, ...], path: Path) -> Path:
    torch = pytest.importorskip("torch")
    from splitinfer.models import build
    from splitinfer.splitter import export_torch

    model, x = build(name, shape)
    with torch.no_grad():
        path.write_bytes(export_torch(model, x))
    return path


@pytest.fixture(scope="session")
def yolo_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """YOLO-style n model at 64x64, batch dynamic, as one ONNX file."""
    return _export("yolo-n", (1, 3, 64, 64), tmp_path_factory.mktemp("models") / "yolo64.onnx")


@pytest.fixture(scope="session")
def chain_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export("chain", (1, 3, 32, 32), tmp_path_factory.mktemp("models") / "chain32.onnx")


@pytest.fixture(scope="session")
def transformer_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export("transformer", (1, 16, 32), tmp_path_factory.mktemp("models") / "tf16.onnx")


@pytest.fixture(scope="session")
def yolo_plan(tmp_path_factory: pytest.TempPathFactory, yolo_onnx: Path) -> Path:
    from splitinfer.splitter import split_model

    out = tmp_path_factory.mktemp("plans") / "yolo"
    # the reference models take RGB in [0, 1]; priced as they travel, no cut in the middle of this
    # small model sends less than a JPEG of its input, so one is added (--cut) for the tests of splits
    split_model(yolo_onnx, out, budget_s=0.05, normalize="0-1", cut=["getitem_20"])
    return out


@pytest.fixture
def plan_copy(tmp_path: Path, yolo_plan: Path) -> Path:
    """A private copy of the YOLO plan that a test may damage."""
    import shutil

    dst = tmp_path / "plan"
    shutil.copytree(yolo_plan, dst)
    return dst


def make_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
               initializers: list[onnx.TensorProto] = (), opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def diamond_model() -> onnx.ModelProto:
    """x -> a=Relu(x) -> {b=Conv-ish MatMul(a, W1), c=Sigmoid(a)} -> d=Add(b, c) -> y=MatMul(d, W2)

    A small DAG with a tensor read by two nodes: the brute-force check of the min-cut."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.random((8, 8), dtype=np.float32), "W1")
    w2 = numpy_helper.from_array(rng.random((8, 2), dtype=np.float32), "W2")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "W1"], ["b"], name="mm1"),
        helper.make_node("Sigmoid", ["a"], ["c"], name="sig"),
        helper.make_node("Add", ["b", "c"], ["d"], name="add"),
        helper.make_node("MatMul", ["d", "W2"], ["y"], name="mm2"),
    ]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2])], [w1, w2])


def arun(coro, timeout: float = 60.0):
    """Run a coroutine in a fresh event loop with a hard timeout (no pytest-asyncio needed)."""
    import asyncio

    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost, made with cryptography."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("splitinfer test CA")).issuer_name(name("splitinfer test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return files
