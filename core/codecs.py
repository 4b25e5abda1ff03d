"""Tensor codecs: how a tensor's values become bytes on the wire, chosen per request.

A codec name is a base, optionally followed by a compressor: ``raw``, ``fp16``, ``int8``,
``raw+lz4``, ``fp16+zstd``, ``int8+lz4``, ... Lossy bases apply to floating-point tensors only;
integer and bool tensors travel ``raw`` (with the same compressor) whatever the request asked.

Error bounds (``x`` the original value, ``x'`` the decoded one; tested in tests/test_codecs.py):

* ``raw``: exact; the decoded array is a zero-copy view of the received frame.
* ``fp16``: round to nearest half precision. ``|x - x'| <= 2**-11 * |x|`` for
  ``|x| >= 2**-14`` and ``|x - x'| <= 2**-25`` below; values beyond ±65504 cannot be encoded
  (:class:`~splitinfer.errors.CodecError`, not a silent ``inf``).
* ``int8``: per-channel affine quantisation to 256 levels (channel axis 1 for rank >= 2, the whole
  tensor otherwise). For channel ``c`` with range ``[lo_c, hi_c]``, ``scale_c = (hi_c - lo_c) / 255``
  and ``|x - x'| <= scale_c / 2`` (plus float32 rounding, ``<= 1e-6 * max(|lo_c|, |hi_c|)``).
  Scales and minimums travel in the frame as float32. Non-finite values cannot be encoded.
* ``jpeg``: for image inputs ``(1, 3, H, W)`` (the all-cloud candidate sends what a camera would
  send anyway), quality 90 unless asked. The input goes back to its camera pixels by its
  :class:`~splitinfer._types.PixelFormat` (the plan's: scale, mean/std, channel order; the default
  is an RGB input in [0, 1]), is quantised to 8 bits and compressed perceptually, and the
  receiver applies the same format to the decoded pixels. No fixed bound: values a camera pixel
  cannot hold are clipped (a normalised input encoded with the wrong format would be).
  Other tensors asked to travel as ``jpeg`` go ``fp16``.
* ``rans``: a learned bottleneck's latent (integers in a float tensor), entropy-coded with the
  plan's per-channel tables (:class:`~splitinfer.rans.SymbolTables`, ``tables=``): exact for values
  in each channel's range; a value outside it is clipped to the range (the prior calls it near
  impossible). Both sides must pass the same tables; decoding does the work of the shape it is
  given (the plan's), whatever the payload says.
* ``lz4``/``zstd``: lossless; the decoder knows the exact decoded size and refuses anything else
  (no decompression bombs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._types import DTYPES, PixelFormat
from .errors import CodecError, TensorError
from .rans import SymbolTables, rans_decode, rans_encode

__all__ = ["Codec", "Encoded", "encode_tensor", "decode_tensor", "compressed", "CODEC_NAMES", "FP16_MAX"]

BASES = ("raw", "fp16", "int8")
COMPRESSORS = ("lz4", "zstd")
IMAGE_CODECS = ("jpeg",)  # for image inputs (1, 3, H, W): what a camera would send anyway
ENTROPY_CODECS = ("rans",)  # a learned bottleneck's latent, with the plan's tables
CODEC_NAMES: tuple[str, ...] = (*(b + (f"+{c}" if c else "") for b in BASES for c in ("", *COMPRESSORS)),
                                *IMAGE_CODECS, *ENTROPY_CODECS)
JPEG_QUALITY = 90
_DEFAULT_PIXELS = PixelFormat()  # an RGB input in [0, 1]
FP16_MAX = 65504.0
_ZSTD_LEVEL = 3  # fast; level 3 is zstd's default speed/ratio balance


@dataclass(frozen=True)
class Codec:
    base: str  # raw | fp16 | int8
    compressor: str | None = None  # lz4 | zstd | None

    @classmethod
    def parse(cls, name: str) -> "Codec":
        if name in IMAGE_CODECS or name in ENTROPY_CODECS:
            return cls(str(name), None)
        base, _, comp = str(name).partition("+")
        if base not in BASES or (comp and comp not in COMPRESSORS) or name.count("+") > 1:
            raise TensorError(f"codec {name!r} is unknown; expected one of {list(CODEC_NAMES)}")
        return cls(base, comp or None)

    @property
    def name(self) -> str:
        return self.base + (f"+{self.compressor}" if self.compressor else "")

    def for_dtype(self, dtype: np.dtype[Any]) -> "Codec":
        """The codec actually used for a tensor of ``dtype`` (lossy bases only touch floats)."""
        return self if dtype.kind == "f" or self.base == "raw" else Codec("raw", self.compressor)

    def for_tensor(self, arr: np.ndarray) -> "Codec":
        """As :meth:`for_dtype`; ``jpeg`` applies to (1, 3, H, W) float images only, others travel fp16."""
        if self.base == "jpeg" and not (arr.dtype.kind == "f" and arr.ndim == 4 and arr.shape[:2] == (1, 3)):
            return Codec("fp16").for_dtype(arr.dtype)
        return self.for_dtype(arr.dtype)


@dataclass
class Encoded:
    """A tensor as it travels: the original dtype and shape, the codec used, the payload, and for
    ``int8`` the per-channel quantisation (axis, float32 scales and minimums as bytes)."""

    dtype: str
    shape: tuple[int, ...]
    codec: str
    payload: Any  # bytes-like: memoryview of the array for raw, bytes otherwise
    quant: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        return memoryview(self.payload).nbytes + (len(self.quant["scale"]) * 2 if self.quant else 0)


def _quant_axis(shape: tuple[int, ...]) -> int | None:
    return 1 if len(shape) >= 2 else None


def _int8_encode(x: np.ndarray) -> tuple[bytes, dict[str, Any]]:
    if x.size and not np.isfinite(x).all():
        raise CodecError("int8 codec: the tensor has NaN or infinite values; use raw or fp16")
    axis = _quant_axis(x.shape)
    xf = np.ascontiguousarray(x, dtype=np.float32)
    if axis is None:
        view = xf.reshape(1, 1, xf.size)
    else:
        view = xf.reshape(x.shape[0], x.shape[1], int(np.prod(x.shape[2:], dtype=np.int64)))  # (N, C, rest)
    if xf.size:
        lo = view.min(axis=(0, 2))
        hi = view.max(axis=(0, 2))
    else:
        lo = hi = np.zeros(view.shape[1], np.float32)
    scale = (hi - lo) / 255.0
    scale[scale < np.finfo(np.float32).tiny] = 1.0  # a constant channel (or a subnormal range)
    inv = (1.0 / scale.astype(np.float64)).astype(np.float32)
    tmp = view - lo[None, :, None]
    tmp *= inv[None, :, None]
    tmp += 0.5  # values are >= 0: truncation below rounds to nearest
    np.clip(tmp, 0, 255, out=tmp)
    q = tmp.astype(np.uint8)
    return q.tobytes(), {"axis": -1 if axis is None else axis, "scale": scale.astype(np.float32).tobytes(),
                         "min": lo.astype(np.float32).tobytes()}


def _int8_decode(buf: Any, shape: tuple[int, ...], dtype: str, quant: dict[str, Any]) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):  # a peer's odd scales give inf/nan, not warnings
        return _int8_dequant(buf, shape, dtype, quant)


def _int8_dequant(buf: Any, shape: tuple[int, ...], dtype: str, quant: dict[str, Any]) -> np.ndarray:
    q = np.frombuffer(buf, dtype=np.uint8)
    scale = np.frombuffer(quant["scale"], dtype=np.float32)
    lo = np.frombuffer(quant["min"], dtype=np.float32)
    if quant["axis"] == -1:
        out = q.astype(np.float32) * scale[0] + lo[0]
    else:
        v = q.reshape(shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64)))
        out = v.astype(np.float32)
        out *= scale[None, :, None]
        out += lo[None, :, None]
    return out.reshape(shape).astype(dtype, copy=False)


def _compress(data: Any, compressor: str) -> bytes:
    if compressor == "lz4":
        import lz4.block

        return bytes(lz4.block.compress(data, store_size=False))
    import zstandard

    return bytes(zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data))


def _decompress(data: Any, compressor: str, expected: int) -> bytes:
    try:
        if compressor == "lz4":
            import lz4.block

            out = lz4.block.decompress(data, uncompressed_size=expected)
        else:
            import zstandard

            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=expected)
    except Exception as exc:
        raise TensorError(f"{compressor} payload does not decompress to {expected} bytes: {exc}") from exc
    if len(out) != expected:
        raise TensorError(f"{compressor} payload decompressed to {len(out)} bytes, expected {expected}")
    return bytes(out)


def encode_tensor(array: np.ndarray, codec: str | Codec = "raw", *, pixels: PixelFormat | None = None,
                  quality: int | None = None, tables: SymbolTables | None = None) -> Encoded:
    """Encode one array. ``raw`` without compression makes no copy of a contiguous array.
    ``pixels`` and ``quality`` apply to ``jpeg``: how the input maps to camera pixels (default an
    RGB input in [0, 1]) and the JPEG quality (1-95, default 90). ``tables`` applies to ``rans``
    (required): the plan's entropy tables of this latent."""
    arr = np.asarray(array)
    if arr.dtype.name not in DTYPES:
        raise CodecError(f"dtype {arr.dtype.name} cannot travel; expected one of {sorted(DTYPES)}")
    c = (codec if isinstance(codec, Codec) else Codec.parse(codec)).for_tensor(arr)
    shape = tuple(int(d) for d in arr.shape)
    quant = None
    if c.base == "raw":
        payload: Any = memoryview(np.ascontiguousarray(arr)).cast("B") if arr.size else b""
    elif c.base == "jpeg":
        payload = _jpeg_encode(arr, pixels or _DEFAULT_PIXELS, JPEG_QUALITY if quality is None else quality)
    elif c.base == "rans":
        payload = _rans_encode(arr, tables)
    elif c.base == "fp16":
        peak = float(np.max(np.abs(arr))) if arr.size else 0.0  # one pass; NaN/inf travel as themselves
        if peak > FP16_MAX and np.isfinite(peak):
            raise CodecError(f"fp16 codec: values up to {peak:.4g} exceed ±{FP16_MAX:g}; use raw or int8")
        if not np.isfinite(peak) and np.abs(arr[np.isfinite(arr)]).max(initial=0.0) > FP16_MAX:
            raise CodecError(f"fp16 codec: finite values exceed ±{FP16_MAX:g}; use raw or int8")
        payload = arr.astype(np.float16).tobytes()
    else:
        payload, quant = _int8_encode(arr)
    if c.compressor:
        payload = _compress(payload, c.compressor)
    return Encoded(arr.dtype.name, shape, c.name, payload, quant)


def compressed(enc: Encoded, compressor: str) -> Encoded:
    """``enc`` (encoded without a compressor) with ``compressor`` applied: the same bytes as encoding
    with ``base+compressor`` in the first place, without quantising again (for measuring one tensor
    under several compressors)."""
    c = Codec.parse(enc.codec)
    if c.compressor is not None or c.base == "jpeg" or compressor not in COMPRESSORS:
        raise CodecError(f"compressed(): expected an uncompressed tensor codec and one of {COMPRESSORS}, "
                         f"got {enc.codec!r} and {compressor!r}")
    return Encoded(enc.dtype, enc.shape, f"{c.base}+{compressor}", _compress(enc.payload, compressor), enc.quant)


def _rans_encode(arr: np.ndarray, tables: SymbolTables | None) -> bytes:
    if tables is None:
        raise CodecError("rans codec: a latent is coded with its plan's entropy tables; none were given")
    if arr.ndim < 2 or arr.shape[1] != tables.lo.shape[0]:
        raise CodecError(f"rans codec: the tables code {tables.lo.shape[0]} channels (axis 1), the tensor has shape "
                         f"{list(arr.shape)}")
    if arr.size and not np.isfinite(arr).all():
        raise CodecError("rans codec: the latent has NaN or infinite values")
    shape = [1] * arr.ndim
    shape[1] = -1
    q = np.clip(np.rint(arr), tables.lo.reshape(shape), tables.hi().reshape(shape)).astype(np.int64)
    return rans_encode(q, tables, channel_axis=1)


def _jpeg_encode(arr: np.ndarray, pixels: PixelFormat, quality: int) -> bytes:
    import io

    from PIL import Image

    if not 1 <= quality <= 95:
        raise CodecError(f"jpeg quality must be 1-95, got {quality}")
    buf = io.BytesIO()
    Image.fromarray(pixels.to_pixels(arr)).save(buf, format="JPEG", quality=quality)  # (H, W, 3) RGB
    return buf.getvalue()


def _jpeg_decode(buf: Any, shape: tuple[int, ...], dtype: str, pixels: PixelFormat) -> np.ndarray:
    import io

    from PIL import Image

    try:
        img = Image.open(io.BytesIO(bytes(buf)))
        if img.format != "JPEG" or img.size != (shape[3], shape[2]):  # checked before decoding pixels
            raise TensorError(f"jpeg payload is a {img.format} of {img.size[0]}x{img.size[1]}, expected a JPEG of "
                              f"{shape[3]}x{shape[2]}")
        rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except TensorError:
        raise
    except Exception as exc:
        raise TensorError(f"jpeg payload does not decode: {exc}") from exc
    return pixels.from_pixels(rgb, dtype)


def decoded_size(codec: Codec, dtype: str, numel: int) -> int:
    """Bytes of the payload after decompression, before the base codec is undone (0: variable)."""
    if codec.base in ("jpeg", "rans"):
        return 0
    item = {"raw": np.dtype(dtype).itemsize, "fp16": 2, "int8": 1}[codec.base]
    return numel * item


def decode_tensor(enc: Encoded, *, pixels: PixelFormat | None = None,
                  tables: SymbolTables | None = None) -> np.ndarray:
    """Decode one tensor. Lengths are checked here too, so a bad payload is a TensorError.
    ``pixels``: for ``jpeg``, how camera pixels become this input (default an RGB input in [0, 1]).
    ``tables``: for ``rans``, the plan's entropy tables of this latent (required)."""
    c = Codec.parse(enc.codec)
    numel = 1
    for d in enc.shape:
        numel *= d
    if c.base == "jpeg":
        if len(enc.shape) != 4 or enc.shape[:2] != (1, 3) or np.dtype(enc.dtype).kind != "f":
            raise TensorError(f"jpeg codec is for (1, 3, H, W) float images, the tensor is {enc.dtype} {list(enc.shape)}")
        return _jpeg_decode(enc.payload, enc.shape, enc.dtype, pixels or _DEFAULT_PIXELS)
    if c.base == "rans":
        if np.dtype(enc.dtype).kind != "f":
            raise TensorError(f"rans codec is for a float latent, the tensor is {enc.dtype}")
        if tables is None:
            raise TensorError("rans tensor, but no entropy tables for it (is it a bottleneck candidate's latent?)")
        try:
            return rans_decode(enc.payload, enc.shape, tables, channel_axis=1, dtype=enc.dtype)
        except CodecError as exc:
            raise TensorError(f"rans payload: {exc}") from None
    expected = decoded_size(c, enc.dtype, numel)
    buf = enc.payload
    if c.compressor:
        buf = _decompress(buf, c.compressor, expected)
    elif memoryview(buf).nbytes != expected:
        raise TensorError(f"tensor payload has {memoryview(buf).nbytes} bytes, expected {expected} "
                          f"for shape {list(enc.shape)} {enc.dtype} with codec {enc.codec}")
    if c.base == "raw":
        return np.frombuffer(buf, dtype=enc.dtype).reshape(enc.shape)
    if np.dtype(enc.dtype).kind != "f":
        raise TensorError(f"codec {enc.codec} is for floating-point tensors, the tensor is {enc.dtype}")
    if c.base == "fp16":
        return np.frombuffer(buf, dtype=np.float16).reshape(enc.shape).astype(enc.dtype)
    if enc.quant is None:
        raise TensorError("int8 tensor without its quantisation parameters (field 'q')")
    return _int8_decode(buf, enc.shape, enc.dtype, enc.quant)
