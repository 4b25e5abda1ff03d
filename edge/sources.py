"""Frame sources for ``splitinfer edge run``: synthetic inputs of the plan's shape, or a video
file decoded with PyAV (resized with Pillow to the model's input)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import SplitinferError
from ..splitter.plan import Plan

__all__ = ["synthetic_frames", "video_frames", "frames_from"]


def synthetic_frames(plan: Plan, n: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """``n`` seeded random inputs of the plan's shapes (floats in [0, 1))."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {t.name: (rng.random(t.shape, dtype=np.float32).astype(t.dtype) if np.dtype(t.dtype).kind == "f"
                        else rng.integers(0, 10, t.shape).astype(t.dtype)) for t in plan.inputs}


def video_frames(path: str | Path, plan: Plan, n: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Frames of a video as the plan's single image input ``(1, 3, H, W)`` float32 in [0, 1]."""
    if len(plan.inputs) != 1 or len(plan.inputs[0].shape) != 4 or plan.inputs[0].shape[1] != 3:
        raise SplitinferError(f"a video source needs a plan with one (1, 3, H, W) input, got "
                              f"{[list(t.shape) for t in plan.inputs]}")
    try:
        import av
        from PIL import Image
    except ImportError as exc:
        raise SplitinferError("a video source needs PyAV and Pillow: pip install av pillow") from exc
    spec = plan.inputs[0]
    h, w = spec.shape[2], spec.shape[3]
    try:
        container = av.open(str(path))
    except Exception as exc:
        raise SplitinferError(f"{path}: cannot open the video: {exc}") from exc
    with container:
        for k, frame in enumerate(container.decode(video=0)):
            if n is not None and k >= n:
                break
            img = frame.to_image().convert("RGB").resize((w, h), Image.BILINEAR)
            x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1)[None] / 255.0  # (1, 3, H, W)
            yield {spec.name: x.astype(spec.dtype)}


def frames_from(source: str, plan: Plan, n: int | None) -> Iterator[dict[str, np.ndarray]]:
    if source == "synthetic":
        return synthetic_frames(plan, n if n is not None else 100)
    if not Path(source).is_file():
        raise SplitinferError(f"--source {source!r}: expected 'synthetic' or a video file")
    return video_frames(source, plan, n)
