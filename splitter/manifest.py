"""The manifest's schema, checked field by field before anything in it is used.

A manifest is read from disk and may have been written by anyone: :func:`validate_manifest`
checks every field :class:`~splitinfer.splitter.plan.Plan` relies on (types, dtypes, shapes and
their sizes, unique ids and names, file paths, hashes, how segments and cuts refer to each
other) and raises :class:`~splitinfer.errors.PlanFormatError` naming the first field that is
wrong, e.g. ``candidates[2].cut[0].shape[1]: expected an integer in [0, 2147483647], got -3``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .._types import DTYPES, PixelFormat
from ..codecs import CODEC_NAMES
from ..errors import CodecError, PlanFormatError
from ..rans import SymbolTables

__all__ = ["validate_manifest", "MAX_TENSOR_BYTES", "MAX_RANK"]

MAX_RANK = 8  # dimensions of a tensor in a plan (the wire's limit too)
MAX_DIM = (1 << 31) - 1
MAX_TENSOR_BYTES = 1 << 32  # one cut tensor, input or output: 4 GiB (ONNX models stop at 2 GiB)
MAX_CANDIDATES = 256
_KINDS = ("cloud", "split", "edge")
_WIRE_CODECS = frozenset(CODEC_NAMES)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# a bottleneck's entropy tables are expanded to channels x 2**precision decoding slots (24 bytes
# each): bounded here, so a manifest cannot make a decoder allocate gigabytes
MAX_TABLE_SLOTS = 1 << 22
_DISTILLED = ("outputs", "features")
_ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "int16": 2, "int8": 1, "uint8": 1,
             "bool": 1}


def _fail(where: str, expected: str, got: Any) -> PlanFormatError:
    shown = repr(got)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return PlanFormatError(f"manifest field {where}: expected {expected}, got {shown}")


def _get(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise PlanFormatError(f"manifest field {where}.{key} is missing" if where else
                              f"manifest field {key} is missing")
    return d[key]


def _str(value: Any, where: str, *, nonempty: bool = True, max_len: int = 4096) -> str:
    if not isinstance(value, str) or (nonempty and not value) or len(value) > max_len:
        raise _fail(where, f"a {'non-empty ' if nonempty else ''}string of at most {max_len} characters", value)
    return value


def _int(value: Any, where: str, low: int = 0, high: int = 1 << 62) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, f"an integer in [{low}, {high}]", value)
    return value


def _list(value: Any, where: str, max_len: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > max_len:
        raise _fail(where, f"a list of at most {max_len} items", value)
    return value


def _tensor(t: Any, where: str) -> str:
    if not isinstance(t, dict):
        raise _fail(where, "an object {name, shape, dtype}", t)
    name = _str(_get(t, "name", where), f"{where}.name")
    dtype = _get(t, "dtype", where)
    if dtype not in DTYPES:
        raise _fail(f"{where}.dtype", f"one of {sorted(DTYPES)}", dtype)
    shape = _list(_get(t, "shape", where), f"{where}.shape", MAX_RANK)
    nbytes = _ITEMSIZE[dtype]
    for k, d in enumerate(shape):
        nbytes *= _int(d, f"{where}.shape[{k}]", 0, MAX_DIM)
    if nbytes > MAX_TENSOR_BYTES:
        raise _fail(f"{where}.shape", f"a tensor of at most {MAX_TENSOR_BYTES} bytes", f"{shape} ({nbytes} bytes)")
    if "bytes" in t and t["bytes"] != nbytes:
        raise _fail(f"{where}.bytes", f"{nbytes} (shape x dtype size)", t["bytes"])
    if t.get("pixels") is not None:
        _pixels(t["pixels"], f"{where}.pixels", shape, dtype)
    return name


def _pixels(px: Any, where: str, shape: list[Any], dtype: str) -> None:
    """An image input's pixel format: {scale, mean[3], std[3], order}, on a float (1, 3, H, W) tensor."""
    if len(shape) != 4 or shape[:2] != [1, 3] or dtype not in ("float32", "float16"):
        raise _fail(where, "a pixel format only on a float (1, 3, H, W) input", f"{dtype} {shape}")
    if not isinstance(px, dict) or set(px) != {"scale", "mean", "std", "order"}:
        raise _fail(where, "an object {scale, mean, std, order}", px)
    try:
        PixelFormat.from_json(px)
    except (TypeError, ValueError) as exc:
        raise _fail(where, f"a valid pixel format ({exc})", px) from None


def _file(value: Any, where: str) -> str:
    path = _str(value, where, max_len=255)
    parts = path.replace("\\", "/").split("/")
    if path.startswith(("/", "\\")) or ".." in parts or ":" in path or "\x00" in path:
        raise _fail(where, "a relative path inside the plan directory", path)
    return path


def _segment(seg: Any, where: str, files: dict[str, str]) -> None:
    if seg is None:
        return
    if not isinstance(seg, dict):
        raise _fail(where, "an object {file, sha256, inputs, outputs} or null", seg)
    path = _file(_get(seg, "file", where), f"{where}.file")
    digest = _get(seg, "sha256", where)
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise _fail(f"{where}.sha256", "64 lowercase hex digits", digest)
    if path in files and files[path] != digest:
        raise _fail(f"{where}.file", "a file listed once with one sha256", path)
    files[path] = digest
    for key in ("inputs", "outputs"):
        names = _list(_get(seg, key, where), f"{where}.{key}", 4096)
        for k, n in enumerate(names):
            _str(n, f"{where}.{key}[{k}]")
        if len(set(names)) != len(names):
            raise _fail(f"{where}.{key}", "unique tensor names", names)
    if "batch_dynamic" in seg and not isinstance(seg["batch_dynamic"], bool):
        raise _fail(f"{where}.batch_dynamic", "true or false", seg["batch_dynamic"])


def _wire(rungs: Any, where: str, local: bool) -> None:
    """A candidate's measured codec settings: [{codec, bytes, fidelity[, quality]}]."""
    items = _list(rungs, where, 64)
    if local and items:
        raise _fail(where, "no codec settings for a candidate that sends nothing", items)
    seen: set[tuple[str, Any]] = set()
    for j, r in enumerate(items):
        at = f"{where}[{j}]"
        if not isinstance(r, dict) or not {"codec", "bytes", "fidelity"} <= set(r) \
                or set(r) - {"codec", "bytes", "fidelity", "quality"}:
            raise _fail(at, "an object {codec, bytes, fidelity[, quality]}", r)
        codec = r["codec"]
        if codec not in _WIRE_CODECS:
            raise _fail(f"{at}.codec", f"one of {sorted(_WIRE_CODECS)}", codec)
        _int(r["bytes"], f"{at}.bytes", 0, MAX_TENSOR_BYTES * 1024)
        fid = r["fidelity"]
        if isinstance(fid, bool) or not isinstance(fid, (int, float)) or not 0.0 <= fid <= 1.0:
            raise _fail(f"{at}.fidelity", "a number in [0, 1]", fid)
        q = r.get("quality")
        if (codec == "jpeg") != (q is not None):
            raise _fail(f"{at}.quality", "a quality for jpeg and only for jpeg", q)
        if q is not None:
            _int(q, f"{at}.quality", 1, 95)
        if (codec, q) in seen:
            raise _fail(at, "each codec setting once", r)
        seen.add((codec, q))


def _bottleneck(b: Any, where: str, cut: list[dict[str, Any]], wire: Any) -> None:
    """A learned bottleneck: {at, latent, channels, stride, hidden, entropy, distilled[, training]};
    its one cut tensor is the latent (float, channels on axis 1), and it travels rans only."""
    keys = {"at", "latent", "channels", "stride", "hidden", "entropy", "distilled"}
    if not isinstance(b, dict) or not keys <= set(b) or set(b) - keys - {"training"}:
        raise _fail(where, "an object {at, latent, channels, stride, hidden, entropy, distilled[, training]}", b)
    _str(b["at"], f"{where}.at")
    latent = _str(b["latent"], f"{where}.latent")
    channels = _int(b["channels"], f"{where}.channels", 1, 4096)
    ent = b["entropy"]
    precision = ent.get("precision") if isinstance(ent, dict) else None
    if isinstance(precision, int) and channels << min(max(precision, 0), 16) > MAX_TABLE_SLOTS:
        raise _fail(f"{where}.entropy", f"tables of at most {MAX_TABLE_SLOTS} slots (channels x 2**precision)",
                    f"{channels} x 2**{precision}")
    _int(b["stride"], f"{where}.stride", 1, 64)
    _int(b["hidden"], f"{where}.hidden", 1, 4096)
    if b["distilled"] not in _DISTILLED:
        raise _fail(f"{where}.distilled", f"one of {list(_DISTILLED)}", b["distilled"])
    if b.get("training") is not None and not isinstance(b["training"], dict):
        raise _fail(f"{where}.training", "an object", b["training"])
    if len(cut) != 1 or cut[0].get("name") != latent:
        raise _fail(f"{where}.latent", "the name of the candidate's one cut tensor", latent)
    spec = cut[0]
    if spec["dtype"] not in ("float32", "float16") or len(spec["shape"]) < 2 or spec["shape"][1] != channels:
        raise _fail(f"{where}.latent", f"a float tensor of {channels} channels on axis 1",
                    f"{spec['dtype']} {spec['shape']}")
    try:
        tables = SymbolTables.from_json(ent)
    except CodecError as exc:
        raise _fail(f"{where}.entropy", f"valid entropy tables ({exc})", "...") from None
    if tables.lo.shape[0] != channels:
        raise _fail(f"{where}.entropy", f"tables of {channels} channels", f"{tables.lo.shape[0]} channels")
    codecs = [r.get("codec") for r in wire or () if isinstance(r, dict)]
    if any(c != "rans" for c in codecs):
        raise _fail(f"{where}", "a bottleneck whose codec settings are rans only", codecs)


def validate_manifest(m: Mapping[str, Any]) -> None:
    """Raise :class:`PlanFormatError` naming the first field of ``m`` that is missing or wrong."""
    model = _get(m, "model", "")
    if not isinstance(model, dict):
        raise _fail("model", "an object", model)
    _str(_get(model, "name", "model"), "model.name")
    files: dict[str, str] = {}
    digest = _get(model, "sha256", "model")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise _fail("model.sha256", "64 lowercase hex digits", digest)
    files[_file(_get(model, "file", "model"), "model.file")] = digest
    _str(_get(m, "plan_hash", ""), "plan_hash")
    ios: dict[str, set[str]] = {}
    for key in ("inputs", "outputs"):
        items = _list(_get(m, key, ""), key, 1024)
        if not items:
            raise _fail(key, "at least one tensor", items)
        ios[key] = {_tensor(t, f"{key}[{k}]") for k, t in enumerate(items)}
        if len(ios[key]) != len(items):
            raise _fail(key, "unique tensor names", [t.get("name") for t in items])
    cands = _list(_get(m, "candidates", ""), "candidates", MAX_CANDIDATES)
    if not cands:
        raise _fail("candidates", "at least one candidate", cands)
    ids: set[str] = set()
    for k, c in enumerate(cands):
        where = f"candidates[{k}]"
        if not isinstance(c, dict):
            raise _fail(where, "an object", c)
        cid = _str(_get(c, "id", where), f"{where}.id", max_len=64)
        if cid in ids:
            raise _fail(f"{where}.id", "an id no other candidate has", cid)
        ids.add(cid)
        kind = _get(c, "kind", where)
        if kind not in _KINDS:
            raise _fail(f"{where}.kind", f"one of {list(_KINDS)}", kind)
        cut = [_tensor(t, f"{where}.cut[{j}]") for j, t in enumerate(_list(_get(c, "cut", where), f"{where}.cut", 1024))]
        if len(set(cut)) != len(cut):
            raise _fail(f"{where}.cut", "unique tensor names", cut)
        edge, cloud = _get(c, "edge", where), _get(c, "cloud", where)
        _segment(edge, f"{where}.edge", files)
        _segment(cloud, f"{where}.cloud", files)
        if edge is None and cloud is None:
            raise _fail(where, "an edge segment, a cloud segment or both", "neither")
        if cloud is not None and set(cloud["inputs"]) - set(cut):
            raise _fail(f"{where}.cloud.inputs", f"names among the cut {cut}", cloud["inputs"])
        if cloud is None and kind != "edge":
            raise _fail(f"{where}.cloud", f"a cloud segment for a {kind!r} candidate", None)
        passthrough = _list(_get(c, "passthrough", where), f"{where}.passthrough", 1024)
        for j, n in enumerate(passthrough):
            if n not in cut or n not in ios["outputs"]:
                raise _fail(f"{where}.passthrough[{j}]", "a model output that is a cut tensor", n)
        flops = _get(c, "flops", where)
        if not isinstance(flops, dict):
            raise _fail(f"{where}.flops", "an object {edge, cloud}", flops)
        for side in ("edge", "cloud"):
            _int(_get(flops, side, f"{where}.flops"), f"{where}.flops.{side}")
        if "edge_nodes" in c:
            _int(c["edge_nodes"], f"{where}.edge_nodes")
        if c.get("wire") is not None:
            _wire(c["wire"], f"{where}.wire", cloud is None)
        if c.get("bottleneck") is not None:
            if kind != "split" or edge is None or cloud is None:
                raise _fail(f"{where}.bottleneck", "a bottleneck only on a split candidate (edge and cloud segments)",
                            kind)
            _bottleneck(c["bottleneck"], f"{where}.bottleneck", c["cut"], c.get("wire"))
        elif any(isinstance(r, dict) and r.get("codec") == "rans" for r in c.get("wire") or ()):
            raise _fail(f"{where}.wire", "rans only for a bottleneck candidate's latent", "rans")
    samples = m.get("wire_samples")
    if samples is not None:
        if not isinstance(samples, dict):
            raise _fail("wire_samples", "an object {source, frames}", samples)
        _str(_get(samples, "source", "wire_samples"), "wire_samples.source", max_len=255)
        _int(_get(samples, "frames", "wire_samples"), "wire_samples.frames", 1, 1 << 20)
    profiles = m.get("profiles")
    if profiles is not None and not isinstance(profiles, dict):
        raise _fail("profiles", "an object", profiles)
