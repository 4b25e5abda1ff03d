"""Types shared by every part: tensor specs and the dtype names used on disk and on the wire.

This module imports nothing of splitinfer but the error root, so transport/ may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TensorSpec", "DTYPES", "dtype_name", "numpy_dtype", "onnx_elem_to_dtype"]

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
class TensorSpec:
    """A named tensor with a fixed shape and dtype. ``shape[0]`` is the batch dimension
    where the tensor has one."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "bytes": self.nbytes}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(name=str(d["name"]), shape=tuple(int(x) for x in d["shape"]), dtype=str(d["dtype"]))

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
