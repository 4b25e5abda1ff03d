"""The wire format: versioned msgpack frames carrying messages and tensors.

A frame is::

    u32 header length (big-endian) | msgpack header (a map) | tensor payloads, back to back

The header holds ``v`` (the frame format version), ``kind`` and the message's fields; each tensor
is described in the header (name, dtype, shape, codec, offset and length in the payload area,
quantisation for int8) and its bytes follow the header. Payloads are written from the arrays'
own buffers (memoryviews, no packing copy) and raw tensors are decoded with ``numpy.frombuffer``
on the received frame (no copy): see benchmarks/transport_codecs.py.

Decoding validates everything and raises a specific :class:`~splitinfer.errors.ProtocolError`
subclass naming the field; arbitrary bytes never raise anything else (tests/test_wire.py fuzzes it).
Channels add their own framing around a frame (TCP: a u32 length prefix).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import msgpack
import numpy as np

from .._types import DTYPES, PixelFormat
from ..errors import FieldError, FrameError, LimitError, ProtocolError, TensorError, VersionError
from ..codecs import CODEC_NAMES, Codec, Encoded, decode_tensor, decoded_size, encode_tensor
from ..rans import SymbolTables

__all__ = [
    "PROTOCOL_VERSION", "FRAME_VERSION", "Limits", "FrameInfo", "ServerTimings", "Message", "Hello", "Welcome",
    "Refusal", "InferRequest", "Result", "Error", "Ping", "Pong", "Bye", "encode", "encode_bytes", "decode",
    "ERROR_CODES", "MESSAGE_KINDS", "HELLO_LIMITS", "DEFAULT_LIMITS", "decode_tensors",
]

FRAME_VERSION = 1  # layout of a frame (header + payloads)
PROTOCOL_VERSION = 1  # the conversation: message kinds and their fields; sent in Hello

# Error codes an Error frame may carry.
ERROR_CODES = frozenset({"busy", "deadline", "bad_request", "unknown_plan", "unknown_candidate", "shape",
                         "protocol", "unauthorized", "internal", "shutdown"})

_U32 = struct.Struct(">I")


@dataclass(frozen=True)
class Limits:
    """What a decoder accepts. The defaults fit a 640x640 YOLO's cut tensors many times over.

    ``max_decoded`` bounds what one frame may turn into once decoded, summed over its tensors and
    counting every codec (decompressed bytes, JPEG pixels from the image header): it is checked
    on the header, before any payload is decompressed. A receiver that knows what it expects
    (the cloud knows the plan's cut) checks tighter bounds itself, with ``decode(tensors=False)``.
    """

    max_frame: int = 64 << 20  # bytes in one frame
    max_header: int = 256 << 10  # bytes of msgpack header (int8 scales: 8 B per channel): bounds its parse time
    max_tensors: int = 64  # tensors in one frame
    max_rank: int = 8  # dimensions of one tensor
    max_dim: int = 1 << 31  # size of one dimension
    max_str: int = 4096  # characters in a string field
    max_decoded: int = 256 << 20  # bytes all of a frame's tensors decode to


DEFAULT_LIMITS = Limits()
# What a server accepts before a hello is accepted: a hello is a few hundred bytes, and nothing
# with tensors is decoded for a peer that has not said who it is.
HELLO_LIMITS = Limits(max_frame=16 << 10, max_header=16 << 10, max_tensors=0, max_decoded=0)


@dataclass
class FrameInfo:
    """Size and timing of one frame as a channel saw it (monotonic seconds). For a received frame,
    ``start`` is the arrival of its first byte and ``end`` of its last; for a sent frame, the
    start and end of writing it."""

    nbytes: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)


@dataclass
class ServerTimings:
    """The cloud's side of a request, in ms: frame receive (first to last byte), queue wait, compute."""

    recv_ms: float = 0.0
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    batch_size: int = 1


@dataclass
class Message:
    KIND: ClassVar[str] = ""
    info: FrameInfo | None = field(default=None, compare=False, repr=False, kw_only=True)


@dataclass
class Hello(Message):
    KIND: ClassVar[str] = "hello"
    plan_hash: str
    client_id: str
    token: str | None = None
    protocol: int = PROTOCOL_VERSION
    # the output format the edge wants for every frame ("" the model's outputs, "yolo" detections);
    # None: not said (the service's default applies)
    postprocess: str | None = None


@dataclass
class Welcome(Message):
    KIND: ClassVar[str] = "welcome"
    session: str
    server: str = ""
    protocol: int = PROTOCOL_VERSION
    max_frame: int = DEFAULT_LIMITS.max_frame
    postprocess: str = ""  # what results carry: "" the model's outputs, else the post-processor's (e.g. "yolo")


@dataclass
class Refusal(Message):
    KIND: ClassVar[str] = "refusal"
    reason: str  # version | plan | token | ...
    message: str


@dataclass
class InferRequest(Message):
    KIND: ClassVar[str] = "infer"
    request_id: int
    plan_hash: str
    candidate: str
    tensors: dict[str, Any]  # name -> ndarray (encoded with ``codec``) or Encoded; decoded: ndarray
    codec: str = "raw"  # codec of the request's tensors
    deadline_ms: float | None = None  # budget from the server's receipt; past it, answer "deadline"
    result_codec: str = "raw"  # codec the result's tensors should use


@dataclass
class Result(Message):
    KIND: ClassVar[str] = "result"
    request_id: int
    outputs: dict[str, Any]
    codec: str = "raw"
    timings: ServerTimings = field(default_factory=ServerTimings)


@dataclass
class Error(Message):
    KIND: ClassVar[str] = "error"
    request_id: int | None
    code: str
    message: str


@dataclass
class Ping(Message):
    """Keep-alive, RTT and (with ``padding`` bytes) an active bandwidth probe."""

    KIND: ClassVar[str] = "ping"
    seq: int
    sent_at: float  # sender's clock, echoed
    padding: int = 0


@dataclass
class Pong(Message):
    KIND: ClassVar[str] = "pong"
    seq: int
    sent_at: float  # the ping's, echoed
    recv_ms: float = 0.0  # how long the ping took from first to last byte at the receiver
    nbytes: int = 0  # the ping's frame size


@dataclass
class Bye(Message):
    KIND: ClassVar[str] = "bye"
    reason: str = ""


MESSAGE_KINDS: dict[str, type[Message]] = {
    cls.KIND: cls for cls in (Hello, Welcome, Refusal, InferRequest, Result, Error, Ping, Pong, Bye)
}
_TENSOR_FIELD = {"infer": "tensors", "result": "outputs"}
_CODEC_FIELD = {"infer": "codec", "result": "codec"}


# ------------------------------------------------------------------ encode

def encode(msg: Message) -> list[Any]:
    """The frame as a list of buffers (header first, then the tensors' own buffers)."""
    header: dict[str, Any] = {"v": FRAME_VERSION, "kind": msg.KIND}
    payloads: list[Any] = []
    for f in fields(msg):
        if f.name == "info":
            continue
        value = getattr(msg, f.name)
        if f.name == _TENSOR_FIELD.get(msg.KIND):
            codec = getattr(msg, _CODEC_FIELD[msg.KIND])
            descs, offset = [], 0
            for name, arr in value.items():
                enc = arr if isinstance(arr, Encoded) else encode_tensor(arr, codec)
                n = memoryview(enc.payload).nbytes
                d = {"name": name, "dtype": enc.dtype, "shape": list(enc.shape), "codec": enc.codec,
                     "off": offset, "len": n}
                if enc.quant is not None:
                    d["q"] = enc.quant
                descs.append(d)
                payloads.append(enc.payload)
                offset += n
            header[f.name] = descs
        elif isinstance(value, ServerTimings):
            header[f.name] = {"recv_ms": value.recv_ms, "queue_ms": value.queue_ms,
                              "compute_ms": value.compute_ms, "batch_size": value.batch_size}
        else:
            header[f.name] = value
    if isinstance(msg, Ping) and msg.padding:
        payloads.append(bytes(msg.padding))
    head = msgpack.packb(header, use_bin_type=True)
    return [_U32.pack(len(head)), head, *payloads]


def encode_bytes(msg: Message) -> bytes:
    """The frame as one bytes object (copies; channels use :func:`encode`)."""
    return b"".join(bytes(b) if not isinstance(b, bytes) else b for b in encode(msg))


# ------------------------------------------------------------------ decode

def _field(h: Mapping[str, Any], name: str, kinds: type | tuple[type, ...], kind: str, *,
           optional: bool = False, limits: Limits = DEFAULT_LIMITS) -> Any:
    if name not in h or h[name] is None:
        if optional:
            return None
        raise FieldError(f"{kind} frame: field {name!r} is missing")
    value = h[name]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise FieldError(f"{kind} frame: field {name!r} must be {_names(kinds)}, got bool")
    if not isinstance(value, kinds):
        raise FieldError(f"{kind} frame: field {name!r} must be {_names(kinds)}, got {type(value).__name__}")
    if isinstance(value, str) and len(value) > limits.max_str:
        raise LimitError(f"{kind} frame: field {name!r} is {len(value)} characters, the limit is {limits.max_str}")
    return value


def _names(kinds: type | tuple[type, ...]) -> str:
    ks = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in ks)


def _tensors(h: Mapping[str, Any], fname: str, kind: str, payload: memoryview, limits: Limits,
             decode_payloads: bool) -> dict[str, Any]:
    descs = _field(h, fname, list, kind, limits=limits)
    if len(descs) > limits.max_tensors:
        raise LimitError(f"{kind} frame: {len(descs)} tensors, the limit is {limits.max_tensors}")
    out: dict[str, Encoded] = {}
    total = 0
    for i, d in enumerate(descs):
        where = f"{kind} frame: tensor {i}"
        if not isinstance(d, dict):
            raise FieldError(f"{where} must be a map, got {type(d).__name__}")
        name = _field(d, "name", str, where, limits=limits)
        where = f"{kind} frame: tensor {name!r}"
        if name in out:
            raise FieldError(f"{where} appears twice")
        dtype = _field(d, "dtype", str, where, limits=limits)
        if dtype not in DTYPES:
            raise TensorError(f"{where}: dtype {dtype!r} is not allowed; expected one of {sorted(DTYPES)}")
        shape = _field(d, "shape", list, where, limits=limits)
        if len(shape) > limits.max_rank:
            raise LimitError(f"{where}: rank {len(shape)}, the limit is {limits.max_rank}")
        numel = 1
        for k, dim in enumerate(shape):
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0 or dim > limits.max_dim:
                raise TensorError(f"{where}: shape[{k}] must be an integer in [0, {limits.max_dim}], got {dim!r}")
            numel *= dim
        codec_name = _field(d, "codec", str, where, limits=limits)
        if codec_name not in CODEC_NAMES:
            raise TensorError(f"{where}: codec {codec_name!r} is unknown; expected one of {list(CODEC_NAMES)}")
        codec = Codec.parse(codec_name)
        if codec.base == "jpeg" and (len(shape) != 4 or shape[:2] != [1, 3]):
            raise TensorError(f"{where}: codec jpeg is for (1, 3, H, W) images, the shape is {shape}")
        if codec.base != "raw" and np.dtype(dtype).kind != "f":
            raise TensorError(f"{where}: codec {codec_name} is for floating-point tensors, the tensor is {dtype}")
        off = _field(d, "off", int, where, limits=limits)
        length = _field(d, "len", int, where, limits=limits)
        if off < 0 or length < 0 or off + length > payload.nbytes:
            raise TensorError(f"{where}: bytes [{off}, {off + length}) lie outside the frame's "
                              f"{payload.nbytes} payload bytes")
        expected = decoded_size(codec, dtype, numel)
        total += numel * np.dtype(dtype).itemsize
        if total > limits.max_decoded:
            raise LimitError(f"{where}: the frame's tensors decode to {total} bytes or more, the limit is "
                             f"{limits.max_decoded}")
        if not codec.compressor and codec.base not in ("jpeg", "rans") and length != expected:
            raise TensorError(f"{where}: {length} bytes for shape {shape} {dtype} with codec {codec_name}; "
                              f"expected {expected}")
        quant = None
        if codec.base == "int8":
            q = _field(d, "q", dict, where, limits=limits)
            axis = _field(q, "axis", int, where + " q", limits=limits)
            channels = shape[1] if len(shape) >= 2 and axis == 1 else 1
            if axis != (1 if len(shape) >= 2 else -1):
                raise TensorError(f"{where}: int8 axis {axis} does not fit rank {len(shape)}")
            for key in ("scale", "min"):
                b = _field(q, key, bytes, where + " q", limits=limits)
                if len(b) != 4 * channels:
                    raise TensorError(f"{where}: int8 {key} has {len(b)} bytes, expected {4 * channels} "
                                      f"(float32 per channel)")
            quant = q
        out[name] = Encoded(dtype, tuple(shape), codec_name, payload[off:off + length], quant)
    return decode_tensors(out) if decode_payloads else out


def decode_tensors(tensors: Mapping[str, Encoded], pixels: Mapping[str, PixelFormat] | None = None,
                   tables: Mapping[str, SymbolTables] | None = None) -> dict[str, np.ndarray]:
    """Decode the payloads of a message received with ``tensors=False``, once the receiver has
    checked their headers (names, dtypes, shapes) against what it expects. ``pixels``: per image
    input, how a JPEG's camera pixels become it; ``tables``: per bottleneck latent, its entropy
    tables (``rans``). Raises :class:`~splitinfer.errors.TensorError` for a payload that does not
    decode to its header."""
    px, tb = pixels or {}, tables or {}
    try:
        return {name: decode_tensor(enc, pixels=px.get(name), tables=tb.get(name)) for name, enc in tensors.items()}
    except ProtocolError:
        raise
    except Exception as exc:
        raise TensorError(f"tensor payload does not decode: {type(exc).__name__}: {exc}") from exc


def decode(frame: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS,
           info: FrameInfo | None = None, tensors: bool = True) -> Message:
    """Decode one frame. Raises a :class:`ProtocolError` subclass, never anything else.

    With ``tensors=False`` an infer or result frame's tensors are validated as far as their
    headers go (dtype, shape, codec, byte ranges, ``limits.max_decoded``) but left as
    :class:`~splitinfer.codecs.Encoded` views of the frame: nothing is decompressed
    until the receiver has checked them and calls :func:`decode_tensors`."""
    try:
        return _decode(frame, limits, info, tensors)
    except ProtocolError:
        raise
    except Exception as exc:  # a check we did not foresee: still a protocol error, never a crash
        raise FrameError(f"malformed frame: {type(exc).__name__}: {exc}") from exc


def _finite(value: float, name: str, kind: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise FieldError(f"{kind} frame: field {name!r} must be a finite number >= 0, got {value!r}")
    return value


def _decode(frame: bytes | bytearray | memoryview, limits: Limits, info: FrameInfo | None,
            decode_payloads: bool) -> Message:
    buf = memoryview(frame).cast("B") if not isinstance(frame, memoryview) else frame.cast("B")
    if buf.nbytes > limits.max_frame:
        raise LimitError(f"frame of {buf.nbytes} bytes, the limit is {limits.max_frame}")
    if buf.nbytes < 4:
        raise FrameError(f"frame of {buf.nbytes} bytes is shorter than its 4-byte header length")
    (hlen,) = _U32.unpack_from(buf, 0)
    if hlen > limits.max_header or 4 + hlen > buf.nbytes:
        raise FrameError(f"header length {hlen} does not fit a frame of {buf.nbytes} bytes "
                         f"(header limit {limits.max_header})")
    try:
        header = msgpack.unpackb(buf[4:4 + hlen], raw=False, strict_map_key=True, use_list=True,
                                 max_str_len=limits.max_header, max_array_len=1024, max_map_len=64,
                                 max_ext_len=0)
    except Exception as exc:
        raise FrameError(f"header is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict):
        raise FrameError(f"header must be a msgpack map, got {type(header).__name__}")
    version = header.get("v")
    if version != FRAME_VERSION:
        raise VersionError(f"frame version {version!r}; this side speaks version {FRAME_VERSION}")
    kind = header.get("kind")
    cls = MESSAGE_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FrameError(f"unknown message kind {kind!r}; expected one of {sorted(MESSAGE_KINDS)}")
    payload = buf[4 + hlen:]
    k = cls.KIND
    if cls is Hello:
        msg: Message = Hello(plan_hash=_field(header, "plan_hash", str, k, limits=limits),
                             client_id=_field(header, "client_id", str, k, limits=limits),
                             token=_field(header, "token", str, k, optional=True, limits=limits),
                             protocol=_field(header, "protocol", int, k, limits=limits),
                             postprocess=_field(header, "postprocess", str, k, optional=True, limits=limits))
    elif cls is Welcome:
        msg = Welcome(session=_field(header, "session", str, k, limits=limits),
                      server=_field(header, "server", str, k, limits=limits),
                      protocol=_field(header, "protocol", int, k, limits=limits),
                      max_frame=_field(header, "max_frame", int, k, limits=limits),
                      postprocess=_field(header, "postprocess", str, k, optional=True, limits=limits) or "")
    elif cls is Refusal:
        msg = Refusal(reason=_field(header, "reason", str, k, limits=limits),
                      message=_field(header, "message", str, k, limits=limits))
    elif cls is InferRequest:
        codec = _field(header, "codec", str, k, limits=limits)
        rcodec = _field(header, "result_codec", str, k, limits=limits)
        for fname, c in (("codec", codec), ("result_codec", rcodec)):
            if c not in CODEC_NAMES:
                raise FieldError(f"{k} frame: field {fname!r} is {c!r}; expected one of {list(CODEC_NAMES)}")
        deadline = _field(header, "deadline_ms", (int, float), k, optional=True, limits=limits)
        if deadline is not None:
            deadline = _finite(float(deadline), "deadline_ms", k)
        msg = InferRequest(request_id=_field(header, "request_id", int, k, limits=limits),
                           plan_hash=_field(header, "plan_hash", str, k, limits=limits),
                           candidate=_field(header, "candidate", str, k, limits=limits),
                           tensors=_tensors(header, "tensors", k, payload, limits, decode_payloads), codec=codec,
                           deadline_ms=deadline, result_codec=rcodec)
    elif cls is Result:
        rid = _field(header, "request_id", int, k, limits=limits)
        try:
            t = _field(header, "timings", dict, k, limits=limits)
            timings = ServerTimings(*(_finite(float(_field(t, n, (int, float), k + " timings", limits=limits)), n, k)
                                      for n in ("recv_ms", "queue_ms", "compute_ms")),
                                    batch_size=_field(t, "batch_size", int, k + " timings", limits=limits))
            msg = Result(request_id=rid, outputs=_tensors(header, "outputs", k, payload, limits, decode_payloads),
                         codec=_field(header, "codec", str, k, limits=limits), timings=timings)
        except ProtocolError as exc:  # the receiver can still answer the request this was for
            exc.request_id = rid  # type: ignore[attr-defined]
            raise
    elif cls is Error:
        code = _field(header, "code", str, k, limits=limits)
        if code not in ERROR_CODES:
            raise FieldError(f"{k} frame: field 'code' is {code!r}; expected one of {sorted(ERROR_CODES)}")
        msg = Error(request_id=_field(header, "request_id", int, k, optional=True, limits=limits), code=code,
                    message=_field(header, "message", str, k, limits=limits))
    elif cls is Ping:
        padding = _field(header, "padding", int, k, limits=limits)
        if padding != payload.nbytes:
            raise FieldError(f"{k} frame: field 'padding' says {padding} bytes, the frame carries {payload.nbytes}")
        msg = Ping(seq=_field(header, "seq", int, k, limits=limits),
                   sent_at=float(_field(header, "sent_at", (int, float), k, limits=limits)), padding=padding)
    elif cls is Pong:
        msg = Pong(seq=_field(header, "seq", int, k, limits=limits),
                   sent_at=float(_field(header, "sent_at", (int, float), k, limits=limits)),
                   recv_ms=float(_field(header, "recv_ms", (int, float), k, limits=limits)),
                   nbytes=_field(header, "nbytes", int, k, limits=limits))
    else:
        msg = Bye(reason=_field(header, "reason", str, k, limits=limits))
    if cls not in (InferRequest, Result, Ping) and payload.nbytes:
        raise FrameError(f"{k} frame carries {payload.nbytes} payload bytes; it has no tensors")
    msg.info = info
    return msg
