"""The one exception root of splitinfer and the tree below it.

Every error the SDK raises on purpose derives from :class:`SplitinferError`; errors of the
libraries underneath (onnx, onnxruntime, protobuf, sockets) are translated at the boundary with
``raise ... from exc`` so callers catch one family. Messages say what was expected and what came.

    SplitinferError
    ├── ModelError                 the model given cannot be used as it is
    │   ├── ModelLoadError         not an ONNX file, truncated, fails the checker
    │   ├── ShapeError             shapes that cannot be fixed, wrong input shapes or dtypes
    │   └── UnsupportedModelError  an operator or construct the splitter cannot handle
    ├── CutError                   a requested cut is unknown, not closed, or empty
    ├── PlanError                  a plan directory is unusable
    │   ├── PlanFormatError        manifest missing, malformed, or of an unknown version
    │   └── PlanIntegrityError     a file does not match the hash in the manifest
    ├── VerificationError          a split composition does not reproduce the whole model
    ├── CodecError                 a tensor a codec cannot encode (non-finite values, fp16 overflow)
    ├── ProtocolError              a frame that breaks the wire format
    │   ├── VersionError           a protocol version this side does not speak
    │   ├── FrameError             not a frame: bad framing, not msgpack, unknown message kind
    │   ├── FieldError             a field missing or of the wrong type or value (names the field)
    │   ├── LimitError             over a size limit: frame bytes, tensor count, rank, dims
    │   └── TensorError            dtype not allowed, shape and byte length disagree, bad codec
    └── ChannelError               a channel cannot carry frames
        ├── ChannelClosed          the peer closed or the connection was lost
        ├── TlsError               the TLS handshake failed (an untrusted certificate, say)
        └── RefusedError           the peer refused our hello (version, plan, token)
    SourceError                    a frame source failed (a video that cannot be read, a generator that raised)
    MissingExtraError              a feature needs an optional extra that is not installed
"""

from __future__ import annotations

__all__ = [
    "SplitinferError",
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
    "TlsError",
    "RefusedError",
    "MissingExtraError",
    "SourceError",
]


class SplitinferError(Exception):
    """Root of every error splitinfer raises on purpose."""


class ModelError(SplitinferError):
    """The model given cannot be used as it is."""


class ModelLoadError(ModelError):
    """The file is not an ONNX model, is truncated, or fails ``onnx.checker``."""


class ShapeError(ModelError):
    """Input shapes are dynamic and not given, or an input has the wrong shape or dtype."""


class UnsupportedModelError(ModelError):
    """The model uses something the splitter does not handle (say, control flow at a cut)."""


class CutError(SplitinferError):
    """A requested cut names unknown tensors, is not closed, or cuts nothing."""


class PlanError(SplitinferError):
    """A plan directory cannot be used."""


class PlanFormatError(PlanError):
    """The manifest is missing, not valid JSON, of an unknown version, or lacks a field."""


class PlanIntegrityError(PlanError):
    """A file of the plan does not match the sha256 recorded in the manifest."""


class VerificationError(SplitinferError):
    """A candidate's edge → cloud composition does not reproduce the whole model."""


class CodecError(SplitinferError, ValueError):
    """A tensor that a codec cannot encode within its documented error bound."""


class ProtocolError(SplitinferError):
    """A frame on the wire breaks the protocol; subclasses say which rule, messages name the field."""


class VersionError(ProtocolError):
    """A protocol or frame version this side does not speak."""


class FrameError(ProtocolError):
    """Not a frame: broken framing, a header that is not msgpack, an unknown message kind."""


class FieldError(ProtocolError):
    """A field is missing or has the wrong type or value."""


class LimitError(ProtocolError):
    """A frame is over a size limit (bytes, tensor count, rank, dimension)."""


class TensorError(ProtocolError):
    """A tensor's dtype is not allowed, its shape and bytes disagree, or its codec is unknown."""


class ChannelError(SplitinferError):
    """A channel cannot carry frames."""


class ChannelClosed(ChannelError):
    """The peer closed the channel or the connection was lost."""


class RefusedError(ChannelError):
    """The peer refused the hello; ``reason`` is its code (version, plan, token, ...)."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


class TlsError(ChannelError):
    """The TLS handshake failed: the server's certificate is not trusted, or the peers disagree."""


class MissingExtraError(SplitinferError):
    """A feature needs an optional extra that is not installed; ``extra`` names it."""

    def __init__(self, message: str, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class SourceError(SplitinferError):
    """A frame source failed: a video that cannot be opened or read, a generator that raised."""
