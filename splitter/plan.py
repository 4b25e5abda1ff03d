"""The plan on disk: the contract between edge and cloud.

A plan is a directory::

    manifest.json        readable, versioned; hashes of every file below
    model.onnx           the whole model as given (the edge's local fallback)
    segments/<id>_edge.onnx, segments/<id>_cloud.onnx
    report.png           predicted latency of each candidate against bandwidth

``plan_hash`` is the sha256 of the manifest's canonical JSON without ``profiles``, ``plan_hash``
and ``created_at``: it names what is computed, so re-profiling a plan on a device keeps its hash
and edge and cloud still agree. Loading checks the format version, every field, and every file's
sha256; writing is atomic (a temporary sibling directory renamed into place, or a temporary
manifest replaced), so a failure never leaves a half-written plan.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._types import TensorSpec
from ..errors import PlanError, PlanFormatError, PlanIntegrityError
from ..rans import SymbolTables
from .manifest import validate_manifest

__all__ = ["Plan", "Candidate", "Rung", "BottleneckRecord", "SegmentRef", "FORMAT", "FORMAT_VERSION", "plan_hash", "sha256_file",
           "atomic_directory", "check_destination", "external_data_files"]

FORMAT = "splitinfer-plan"
FORMAT_VERSION = 1
_UNHASHED = ("profiles", "plan_hash", "created_at")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def external_data_files(model_bytes: bytes, name: str = "model") -> set[str]:
    """Files an ONNX model (its serialised bytes) keeps tensors in outside itself
    (``data_location: EXTERNAL``). onnxruntime would open these next to the model, unhashed."""
    import onnx

    try:
        model = onnx.load_model_from_string(model_bytes)
    except Exception as exc:
        raise PlanIntegrityError(f"{name}: not a readable ONNX model: {type(exc).__name__}: {exc}") from exc
    found: set[str] = set()

    def tensors(graph: Any) -> Iterator[Any]:
        yield from graph.initializer
        for sp in graph.sparse_initializer:
            yield sp.values
            yield sp.indices
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from tensors(attr.g)
                for g in attr.graphs:
                    yield from tensors(g)

    for t in tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in t.external_data if e.key == "location")
    return found


def plan_hash(manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k not in _UNHASHED}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class SegmentRef:
    file: str  # path relative to the plan directory
    sha256: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    batch_dynamic: bool = False  # cloud segments: dim 0 of every input/output is "batch"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "batch_dynamic": self.batch_dynamic}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "SegmentRef | None":
        if d is None:
            return None
        return cls(str(d["file"]), str(d["sha256"]), tuple(d["inputs"]), tuple(d["outputs"]),
                   bool(d.get("batch_dynamic", False)))


@dataclass(frozen=True)
class Rung:
    """One codec setting of a candidate: mean bytes of a frame's cut tensors, and fidelity."""

    codec: str
    nbytes: int
    fidelity: float
    quality: int | None = None  # JPEG only

    @property
    def label(self) -> str:
        return f"{self.codec} q{self.quality}" if self.quality is not None else self.codec

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"codec": self.codec, "bytes": self.nbytes, "fidelity": round(self.fidelity, 6)}
        if self.quality is not None:
            d["quality"] = self.quality
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Rung":
        q = d.get("quality")
        return cls(str(d["codec"]), int(d["bytes"]), float(d["fidelity"]), None if q is None else int(q))


@dataclass(frozen=True)
class BottleneckRecord:
    """What a learned bottleneck candidate is (``splitinfer bottleneck``): the model tensor it
    stands in for, its latent (the candidate's one cut tensor, integers sent ``rans``-coded), the
    entropy tables of its prior (hashed with the manifest), its shape parameters and how it was
    trained (``distilled``: ``outputs`` through the frozen back segment, or ``features`` alone)."""

    at: str  # the model tensor the decoder restores in the cloud
    latent: str  # the cut tensor's name
    channels: int
    stride: int
    hidden: int
    tables: SymbolTables
    distilled: str  # "outputs" | "features"
    training: dict[str, Any] = field(default_factory=dict, compare=False)  # frames, seconds, steps, rate_weight...

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "latent": self.latent, "channels": self.channels, "stride": self.stride,
                "hidden": self.hidden, "entropy": self.tables.to_json(), "distilled": self.distilled,
                "training": dict(self.training)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BottleneckRecord":
        return cls(str(d["at"]), str(d["latent"]), int(d["channels"]), int(d["stride"]), int(d["hidden"]),
                   SymbolTables.from_json(d["entropy"]), str(d["distilled"]), dict(d.get("training") or {}))


@dataclass(frozen=True)
class Candidate:
    """One way to run the model: which tensors cross, and the two segments around them."""

    id: str  # "cloud", "c1".., "b1".. (a learned bottleneck), "edge"
    kind: str  # "cloud" (all-cloud), "split", "edge" (all-edge)
    cut: tuple[TensorSpec, ...]  # what the edge sends (empty for all-edge)
    edge: SegmentRef | None
    cloud: SegmentRef | None
    passthrough: tuple[str, ...]  # model outputs that are cut tensors
    flops_edge: int
    flops_cloud: int
    edge_nodes: int = 0
    wire: tuple[Rung, ...] = ()  # codec settings measured at split time (wire_bytes.py); () for old plans
    bottleneck: BottleneckRecord | None = None  # a learned bottleneck: its cut is the latent, sent rans

    @property
    def tables(self) -> dict[str, SymbolTables]:
        """Entropy tables per cut tensor that travels ``rans`` (a bottleneck's latent)."""
        return {self.bottleneck.latent: self.bottleneck.tables} if self.bottleneck is not None else {}

    @property
    def cut_bytes(self) -> int:
        return sum(t.nbytes for t in self.cut) if self.cloud is not None else 0

    @property
    def local(self) -> bool:
        """Runs entirely on the edge (nothing is sent)."""
        return self.cloud is None

    def cut_feed(self, inputs: Mapping[str, np.ndarray], edge_outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The tensors to send: edge outputs, and model inputs that the cloud reads directly."""
        return {t.name: edge_outputs[t.name] if t.name in edge_outputs else inputs[t.name] for t in self.cut}

    def finish(self, cut: Mapping[str, np.ndarray], cloud_outputs: Mapping[str, np.ndarray],
               output_names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The model outputs: the cloud's, and those that crossed the cut unchanged."""
        return {n: cloud_outputs[n] if n in cloud_outputs else cut[n] for n in output_names}

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind,
            "cut": [t.to_json() for t in self.cut], "cut_bytes": sum(t.nbytes for t in self.cut),
            "edge": self.edge.to_json() if self.edge else None,
            "cloud": self.cloud.to_json() if self.cloud else None,
            "passthrough": list(self.passthrough),
            "flops": {"edge": self.flops_edge, "cloud": self.flops_cloud},
            "edge_nodes": self.edge_nodes,
            **({"wire": [r.to_json() for r in self.wire]} if self.wire else {}),
            **({"bottleneck": self.bottleneck.to_json()} if self.bottleneck is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Candidate":
        return cls(str(d["id"]), str(d["kind"]), tuple(TensorSpec.from_json(t) for t in d["cut"]),
                   SegmentRef.from_json(d["edge"]), SegmentRef.from_json(d["cloud"]),
                   tuple(d["passthrough"]), int(d["flops"]["edge"]), int(d["flops"]["cloud"]),
                   int(d.get("edge_nodes", 0)), tuple(Rung.from_json(r) for r in d.get("wire") or ()),
                   BottleneckRecord.from_json(d["bottleneck"]) if d.get("bottleneck") is not None else None)

    def rung(self, codec: str, quality: int | None = None) -> Rung | None:
        """The measured setting for ``codec`` (JPEG: the nearest measured quality), if any."""
        if codec == "jpeg":
            jp = [r for r in self.wire if r.codec == "jpeg" and r.quality is not None]
            q = 90 if quality is None else quality
            return min(jp, key=lambda r: abs(r.quality - q)) if jp else None  # type: ignore[operator]
        return next((r for r in self.wire if r.codec == codec), None)


@dataclass
class Plan:
    """A loaded plan. ``Plan.load(path)`` checks everything; see the module docstring."""

    path: Path
    manifest: dict[str, Any]
    candidates: list[Candidate]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def hash(self) -> str:
        return str(self.manifest["plan_hash"])

    @property
    def name(self) -> str:
        return str(self.manifest["model"]["name"])

    @property
    def model_file(self) -> Path:
        return self.path / self.manifest["model"]["file"]

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    def file(self, ref: SegmentRef) -> Path:
        return self.path / ref.file

    def candidate(self, cid: str) -> Candidate:
        for c in self.candidates:
            if c.id == cid:
                return c
        raise PlanError(f"plan {self.name}: no candidate {cid!r}; the candidates are {[c.id for c in self.candidates]}")

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, check_files: bool = True) -> "Plan":
        root = Path(path)
        mpath = root / "manifest.json"
        if not root.is_dir():
            raise PlanFormatError(f"{root}: not a plan directory (expected a directory with manifest.json)")
        if not mpath.is_file():
            raise PlanFormatError(f"{root}: no manifest.json; is this a plan directory?")
        try:
            manifest = json.loads(mpath.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PlanFormatError(f"{mpath}: not valid JSON: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            raise PlanFormatError(f"{mpath}: expected format {FORMAT!r}, got {got!r}")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise PlanFormatError(f"{mpath}: plan format version {version!r}; this splitinfer reads version {FORMAT_VERSION}")
        try:
            validate_manifest(manifest)
        except PlanFormatError as exc:
            raise PlanFormatError(f"{mpath}: {exc}") from None
        try:
            candidates = [Candidate.from_json(c) for c in manifest["candidates"]]
            inputs = tuple(TensorSpec.from_json(t) for t in manifest["inputs"])
            outputs = tuple(TensorSpec.from_json(t) for t in manifest["outputs"])
            recorded = manifest["plan_hash"]
            model_ref = manifest["model"]
            files = {str(model_ref["file"]): str(model_ref["sha256"])}
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFormatError(f"{mpath}: malformed manifest, missing or bad field {exc}") from exc
        actual = plan_hash(manifest)
        if recorded != actual:
            raise PlanIntegrityError(f"{mpath}: plan_hash is {recorded}, but the manifest hashes to {actual}; "
                                     "the manifest was edited")
        for c in candidates:
            for ref in (c.edge, c.cloud):
                if ref is not None:
                    files[ref.file] = ref.sha256
        if check_files:
            for rel, expected in files.items():
                fpath = (root / rel).resolve()
                if root.resolve() not in fpath.parents:
                    raise PlanFormatError(f"{mpath}: file {rel!r} lies outside the plan directory")
                if not fpath.is_file():
                    raise PlanIntegrityError(f"{root}: {rel} is missing (listed in manifest.json)")
                data = fpath.read_bytes()  # read once: hashed, then parsed from the same bytes
                got = hashlib.sha256(data).hexdigest()
                if got != expected:
                    raise PlanIntegrityError(f"{root}: {rel} has sha256 {got[:16]}…, the manifest expects "
                                             f"{expected[:16]}…; the file was changed or corrupted")
                external = external_data_files(data, rel)
                if external:
                    raise PlanIntegrityError(f"{root}: {rel} keeps weights in external data {sorted(external)}, "
                                             "which the plan's hashes do not cover; a plan's ONNX files must be "
                                             "self-contained (split the model again)")
        return cls(root, manifest, candidates, inputs, outputs, dict(manifest.get("profiles") or {}))

    def set_profile(self, device: str, profile: Mapping[str, Any]) -> None:
        """Store (or replace) a device's profile and rewrite manifest.json atomically."""
        self.profiles[device] = dict(profile)
        self.manifest["profiles"] = self.profiles
        write_json_atomic(self.path / "manifest.json", self.manifest)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # as any file the user writes (mkstemp makes 0600)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


_PLAN_ENTRIES = {"manifest.json", "model.onnx", "segments", "report.png"}


def check_destination(target: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Where a new plan may be written: a path that does not exist, or (with ``force``) a plan
    directory holding nothing but a plan's files. Anything else, a user's folder or file, is
    refused whatever the flags: nothing the user owns is deleted. Raises :class:`PlanError`."""
    dest = Path(target).absolute()
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise PlanError(f"-o {target}: exists and is not a plan directory; choose a new path")
    if dest.exists():
        manifest = dest / "manifest.json"
        try:
            is_plan = json.loads(manifest.read_text()).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            is_plan = False
        if not is_plan:
            raise PlanError(f"-o {target}: {dest} exists and is not a plan directory (no splitinfer manifest.json); "
                            "a plan is written only to a new path or over a previous plan (--force)")
        others = sorted(p.name for p in dest.iterdir() if p.name not in _PLAN_ENTRIES and not p.name.startswith("."))
        if others:
            raise PlanError(f"-o {target}: the plan directory also holds {others[:5]}, which are not a plan's "
                            "files; move them or choose a new path")
        if not force:
            raise PlanError(f"-o {target}: a plan exists there; choose another directory or pass --force to replace it")
    parent = dest.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PlanError(f"-o {target}: cannot create it: {parent} is not a writable directory")
    return dest


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``target`` to fill; on success it becomes ``target``.

    On any exception the temporary directory is removed and ``target`` is untouched. ``target``
    must pass :func:`check_destination` (with ``force``, an existing plan there is replaced only
    after the new one is complete).
    """
    dest = check_destination(target, force=force)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # as any directory the user makes (mkdtemp makes 0700)
    try:
        yield tmp
        if dest.exists():
            check_destination(target, force=force)  # still a plan (nothing moved in meanwhile)
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / "plan")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
