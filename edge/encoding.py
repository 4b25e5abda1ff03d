"""How each candidate's cut travels from this edge: the codec setting per candidate, the
candidates the fidelity floor admits, the byte ratios the controller starts from, and the
encoding itself (a model input sent as JPEG goes back to its camera pixels first; a learned
bottleneck's latent is entropy-coded with the plan's tables).

>>> enc = CutEncoder(plan, codec="auto", min_fidelity=0.98)   # doctest: +SKIP
>>> enc.setting(k), enc.encode(k, "images", frame)           # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from ..codecs import Codec, Encoded, encode_tensor
from ..errors import CodecError, SplitinferError
from ..splitter.plan import Plan
from ..splitter.wire_settings import DEFAULT_MIN_FIDELITY, below_floor, codec_settings, default_input_codec, \
    input_codec_for, wire_ratios

__all__ = ["CutEncoder"]


class CutEncoder:
    """``codec`` (``auto``: each candidate's cheapest setting measured at split time that keeps
    ``min_fidelity``; else one codec for every cut), ``input_codec`` and ``jpeg_quality`` for an
    all-cloud candidate's inputs. Bad arguments raise :class:`SplitinferError` naming them."""

    def __init__(self, plan: Plan, codec: str = "auto", input_codec: str | None = None,
                 jpeg_quality: int | None = None, min_fidelity: float = DEFAULT_MIN_FIDELITY) -> None:
        if jpeg_quality is not None and not 1 <= jpeg_quality <= 95:
            raise SplitinferError(f"jpeg_quality must be 1-95, got {jpeg_quality}")
        if not 0.0 <= min_fidelity <= 1.0:  # (NaN too)
            raise SplitinferError(f"min_fidelity must be in [0, 1], got {min_fidelity}")
        if codec != "auto":
            try:
                Codec.parse(codec)
            except (CodecError, ValueError) as exc:
                raise SplitinferError(f"codec: {exc}") from None
        if jpeg_quality is not None and input_codec is None and default_input_codec(plan, "fp16") == "jpeg":
            input_codec = "jpeg"  # a quality asked for is the all-cloud input's, not the ladder's pick
        self.plan, self.codec = plan, codec
        self.jpeg_quality = 90 if jpeg_quality is None else jpeg_quality
        self.input_codec = input_codec_for(plan, input_codec, "fp16" if codec == "auto" else codec)
        # fewer bytes for the same cut are never slower: with "auto", the cheapest that keeps the floor
        self.settings = codec_settings(plan, codec, input_codec, self.jpeg_quality, min_fidelity)
        low = set(below_floor(plan, min_fidelity))  # bottlenecks below the floor: only when pinned
        # the candidates the controller may choose from (None: all)
        self.usable = [i for i in range(len(plan.candidates)) if i not in low] if low else None
        # until a candidate's wire size is measured here: what the plan measured at split time
        self.prior_ratio = wire_ratios(plan, codec, input_codec, self.jpeg_quality, min_fidelity)
        self._pixels = {t.name: t.pixels for t in plan.inputs if t.pixels is not None}

    def setting(self, i: int) -> tuple[str, int | None]:
        """Candidate ``i``'s codec and JPEG quality (a local candidate sends nothing: raw if asked)."""
        return self.settings[i] or ("raw", None)

    def encode(self, i: int, name: str, value: np.ndarray) -> Encoded:
        """One tensor of candidate ``i``'s cut for the wire, in that candidate's setting."""
        codec, quality = self.setting(i)
        return encode_tensor(value, codec, pixels=self._pixels.get(name), quality=quality,
                             tables=self.plan.candidates[i].tables.get(name))
