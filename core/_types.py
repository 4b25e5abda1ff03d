"""Types shared by every part: tensor specs and the dtype names used on disk and on the wire.

This module imports nothing of splitinfer but the error root, so transport/ may use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TensorSpec", "PixelFormat", "DTYPES", "dtype_name", "numpy_dtype", "onnx_elem_to_dtype"]

# The dtypes a tensor may have in a plan or on the wire, by their numpy name.
DTYPES: frozenset[str] = frozenset(
    {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}
)

# ONNX TensorProto element types we accept -> numpy dtype names.
_ONNX_ELEM: dict[int, str] = {
    1: "float32",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
}


def onnx_elem_to_dtype(elem_type: int) -> str | None:
    """The numpy dtype name of an ONNX element type, or None when we do not carry it."""
    return _ONNX_ELEM.get(elem_type)


def dtype_name(dtype: Any) -> str:
    """Normalise a numpy dtype (or its name) to the name used in manifests and frames."""
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; expected one of {sorted(DTYPES)}")
    return name


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for a manifest/wire dtype name."""
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; expected one of {sorted(DTYPES)}")
    return np.dtype(name)


@dataclass(frozen=True)
class PixelFormat:
    """How 8-bit camera pixels become an image input ``(1, 3, H, W)``:
    ``x[c] = (pixel[c] * scale - mean[c]) / std[c]``, the channels in ``order`` (``rgb`` or ``bgr``).

    ``PixelFormat()`` is an input in [0, 1]; ImageNet-normalised models take
    ``PixelFormat(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))``.

    >>> PixelFormat.parse("mean=0.485,0.456,0.406,std=0.229,0.224,0.225").std
    (0.229, 0.224, 0.225)
    """

    scale: float = 1 / 255
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    order: str = "rgb"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"pixel scale must be a positive number, got {self.scale!r}")
        for name, vals in (("mean", self.mean), ("std", self.std)):
            if len(vals) != 3 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
                raise ValueError(f"pixel {name} must be 3 finite numbers (one per channel), got {vals!r}")
        if not all(v > 0 for v in self.std):
            raise ValueError(f"pixel std must be positive, got {self.std!r}")
        if self.order not in ("rgb", "bgr"):
            raise ValueError(f"pixel order must be 'rgb' or 'bgr', got {self.order!r}")

    NAMED = {"0-1": {}, "0-255": {"scale": 1.0},
             "imagenet": {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}}

    @classmethod
    def parse(cls, text: str) -> "PixelFormat":
        """``0-1``, ``0-255``, ``imagenet``, or ``mean=A,B,C,std=A,B,C[,scale=S][,order=bgr]``
        (``scale`` defaults to 1/255: mean and std are on the [0, 1] scale, as torchvision writes them)."""
        text = text.strip()
        if text in cls.NAMED:
            return cls(**cls.NAMED[text])  # type: ignore[arg-type]
        fields: dict[str, list[str]] = {}
        key = None
        for part in text.split(","):
            part = part.strip()
            if "=" in part:
                key, _, part = part.partition("=")
                key = key.strip()
                if key not in ("mean", "std", "scale", "order") or key in fields:
                    raise ValueError(f"normalisation {text!r}: unexpected or repeated field {key!r}; expected "
                                     "mean=A,B,C,std=A,B,C[,scale=S][,order=rgb|bgr] or one of "
                                     f"{sorted(cls.NAMED)}")
                fields[key] = []
            if key is None:
                raise ValueError(f"normalisation {text!r}: expected mean=…,std=… or one of {sorted(cls.NAMED)}")
            fields[key].append(part.strip())
        try:
            kw: dict[str, Any] = {}
            for name in ("mean", "std"):
                if name in fields:
                    vals = tuple(float(v) for v in fields[name])
                    kw[name] = vals * 3 if len(vals) == 1 else vals
            if "scale" in fields:
                (sv,) = fields["scale"]
                num, _, den = sv.partition("/")
                kw["scale"] = float(num) / float(den) if den else float(num)
            if "order" in fields:
                (kw["order"],) = fields["order"]
            return cls(**kw)
        except ValueError as exc:
            raise ValueError(f"normalisation {text!r}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {"scale": self.scale, "mean": list(self.mean), "std": list(self.std), "order": self.order}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PixelFormat":
        return cls(float(d["scale"]), tuple(float(v) for v in d["mean"]),  # type: ignore[arg-type]
                   tuple(float(v) for v in d["std"]), str(d["order"]))  # type: ignore[arg-type]

    def _affine(self) -> tuple[np.ndarray, np.ndarray]:
        mean = np.asarray(self.mean, np.float32).reshape(3, 1, 1)
        std = np.asarray(self.std, np.float32).reshape(3, 1, 1)
        return mean, std

    def to_pixels(self, x: np.ndarray) -> np.ndarray:
        """A model input ``(1, 3, H, W)`` back to camera pixels: uint8 ``(H, W, 3)`` RGB."""
        mean, std = self._affine()
        p = (x[0].astype(np.float32) * std + mean) / np.float32(self.scale)  # (3, H, W), this order
        if self.order == "bgr":
            p = p[::-1]
        return np.clip(p.transpose(1, 2, 0) + 0.5, 0, 255).astype(np.uint8)

    def from_pixels(self, rgb: np.ndarray, dtype: str = "float32") -> np.ndarray:
        """Camera pixels uint8 ``(H, W, 3)`` RGB to the model input ``(1, 3, H, W)``."""
        mean, std = self._affine()
        p = rgb.transpose(2, 0, 1)
        if self.order == "bgr":
            p = p[::-1]
        x = p.astype(np.float32, order="C")  # in place from here: one array for the whole conversion
        x *= np.float32(self.scale)
        x -= mean
        x /= std
        return x[None].astype(dtype, copy=False)


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor with a fixed shape and dtype. ``shape[0]`` is the batch dimension
    where the tensor has one."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    pixels: PixelFormat | None = None  # an image input: how camera pixels become it (None: not known)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize

    @property
    def is_image(self) -> bool:
        """A float ``(1, 3, H, W)`` tensor: what a camera frame becomes."""
        return len(self.shape) == 4 and self.shape[:2] == (1, 3) and self.dtype in ("float32", "float16")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "bytes": self.nbytes}
        if self.pixels is not None:
            d["pixels"] = self.pixels.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TensorSpec":
        px = d.get("pixels")
        return cls(name=str(d["name"]), shape=tuple(int(x) for x in d["shape"]), dtype=str(d["dtype"]),
                   pixels=PixelFormat.from_json(px) if px is not None else None)

    def check(self, array: np.ndarray, *, what: str = "input") -> None:
        """Raise :class:`~splitinfer.errors.ShapeError` unless ``array`` fits this spec."""
        from .errors import ShapeError

        if array.dtype.name != self.dtype:
            raise ShapeError(
                f"{what} {self.name!r}: expected dtype {self.dtype}, got {array.dtype.name}"
            )
        if tuple(array.shape) != self.shape:
            raise ShapeError(
                f"{what} {self.name!r}: expected shape {list(self.shape)}, got {list(array.shape)}"
            )
