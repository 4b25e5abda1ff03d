"""splitinfer: edge-cloud split inference.

The parts are subpackages: :mod:`splitinfer.splitter` (model → verified split plan),
:mod:`splitinfer.transport` (frames on the wire), :mod:`splitinfer.cloud` (the server side),
:mod:`splitinfer.edge` (the device side). The package root holds only what every part shares:
the error tree and tensor types. It stays import-light so the edge install stays small.
"""

from __future__ import annotations

from ._types import PixelFormat, TensorSpec
from .errors import (
    ChannelClosed,
    ChannelError,
    CodecError,
    CutError,
    FieldError,
    FrameError,
    LimitError,
    MissingExtraError,
    ModelError,
    ModelLoadError,
    PlanError,
    PlanFormatError,
    PlanIntegrityError,
    ProtocolError,
    RefusedError,
    ShapeError,
    SourceError,
    SplitinferError,
    TensorError,
    TlsError,
    UnsupportedModelError,
    VerificationError,
    VersionError,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "TensorSpec",
    "PixelFormat",
    "SplitinferError",
    "MissingExtraError",
    "SourceError",
    "TlsError",
    "ModelError",
    "ModelLoadError",
    "ShapeError",
    "UnsupportedModelError",
    "CutError",
    "PlanError",
    "PlanFormatError",
    "PlanIntegrityError",
    "VerificationError",
    "CodecError",
    "ProtocolError",
    "VersionError",
    "FrameError",
    "FieldError",
    "LimitError",
    "TensorError",
    "ChannelError",
    "ChannelClosed",
    "RefusedError",
]
