"""Frame sources: what ``edge run`` streams, what ``split`` measures wire sizes on (and what a
bottleneck or a calibration learns from): synthetic inputs of the model's shapes, a rendered road,
a video file decoded with PyAV, or a directory of images (both resized with Pillow to the model's
input). Camera pixels become the model input by the input's pixel format (scale, mean/std,
channel order; an RGB input in [0, 1] where none is recorded).

Every source takes the model's input specs (a plan's ``plan.inputs``, or the graph's at split
time), so the edge, the splitter and the scripts share one definition of a frame."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from ._types import PixelFormat, TensorSpec
from .errors import SplitinferError

__all__ = ["synthetic_frames", "scene_frames", "video_frames", "image_dir_frames", "frames_from", "given_frames",
           "image_input", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm")
Inputs = Sequence[TensorSpec]


def image_input(inputs: Inputs) -> TensorSpec | None:
    """The model's single image input ``(1, 3, H, W)`` of a float dtype, or None."""
    if len(inputs) != 1:
        return None
    spec = inputs[0]
    ok = len(spec.shape) == 4 and spec.shape[0] == 1 and spec.shape[1] == 3 and np.dtype(spec.dtype).kind == "f"
    return spec if ok else None


def _need_image(inputs: Inputs, what: str) -> TensorSpec:
    spec = image_input(inputs)
    if spec is None:
        raise SplitinferError(f"{what} needs a model with one (1, 3, H, W) float input, got "
                              f"{[(t.name, list(t.shape), t.dtype) for t in inputs]}")
    return spec


def synthetic_frames(inputs: Inputs, n: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """``n`` seeded random inputs of the given shapes (floats in [0, 1))."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {t.name: (rng.random(t.shape, dtype=np.float32).astype(t.dtype) if np.dtype(t.dtype).kind == "f"
                        else rng.integers(0, 10, t.shape).astype(t.dtype)) for t in inputs}


def _as_input(spec: TensorSpec, rgb: np.ndarray) -> np.ndarray:
    """Camera pixels uint8 (H, W, 3) RGB as the model input, by its pixel format."""
    return (spec.pixels or PixelFormat()).from_pixels(rgb, spec.dtype)


def scene_frames(inputs: Inputs, n: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """A simple moving road scene (sky, road, lanes, boxes driving across) as the model's image
    input: deterministic, cheap, and compressible the way camera frames are (unlike noise).

    A camera hands over finished pixels (its sensor and ISP do the work), so the scene is cheap to
    make on the device: frames are composed in camera pixels from a few pre-rendered noisy
    backgrounds; what a frame costs here is what any camera frame costs, turning its pixels into
    the model's input."""
    spec = _need_image(inputs, "the scene source")
    h, w = spec.shape[2], spec.shape[3]
    rng = np.random.default_rng(seed)
    yy = np.linspace(0, 1, h, dtype=np.float32)[:, None]
    base = np.empty((h, w, 3), np.float32)
    base[..., 0], base[..., 1], base[..., 2] = 0.55 + 0.2 * yy, 0.6 + 0.1 * yy, 0.8 - 0.4 * yy  # sky to road
    horizon = int(0.35 * h)
    base[horizon:] = 0.32 + 0.05 * rng.random(3, dtype=np.float32)  # asphalt
    for lane in (0.25, 0.5, 0.75):
        x = int(lane * w)
        base[horizon:, max(x - 1, 0):x + 1] = 0.9
    cars = [(rng.uniform(0, w), rng.uniform(horizon, h - h // 8), rng.uniform(1.5, 4) * rng.choice([-1, 1]),
             rng.random(3).astype(np.float32)) for _ in range(6)]
    # sensor noise (sigma 1 % of full scale): a small bank of noise fields, each drawn the first
    # time a frame needs it (a bank drawn up front stalled a slow device's first frame by seconds)
    noise: list[np.ndarray] = []
    backgrounds: list[np.ndarray] = []
    cw, ch = max(w // 10, 2), max(h // 14, 2)
    base *= 255
    for k in range(n):
        j = k % _NOISE_BANK
        while len(noise) <= min(j + 1, _NOISE_BANK - 1):
            nz = rng.standard_normal((h, w, 3), dtype=np.float32)
            nz *= 0.01 * 255
            noise.append(nz)
            backgrounds.append(_to_pixels(base + nz))
        rgb = backgrounds[j].copy()
        for x0, y0, v, color in cars:
            x, y = int((x0 + v * k) % w), int(y0)
            patch = noise[(j + 1) % _NOISE_BANK][y:y + ch, x:x + cw]
            rgb[y:y + ch, x:x + cw] = _to_pixels(color * 255 + patch)
        yield {spec.name: _as_input(spec, rgb)}


_NOISE_BANK = 8


def _to_pixels(x: np.ndarray) -> np.ndarray:
    return np.clip(x + 0.5, 0, 255).astype(np.uint8)


def video_frames(path: str | Path, inputs: Inputs, n: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Frames of a video as the model's single image input ``(1, 3, H, W)``."""
    spec = _need_image(inputs, "a video source")
    try:
        import av
        from PIL import Image
    except ImportError as exc:
        raise SplitinferError("a video source needs PyAV and Pillow: pip install av pillow") from exc
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
            yield {spec.name: _as_input(spec, np.asarray(img, dtype=np.uint8))}


def image_dir_frames(path: str | Path, inputs: Inputs, n: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The images of a directory (sorted by name; ``IMAGE_SUFFIXES``) as the model's single image
    input ``(1, 3, H, W)``. A file that is not a readable image is an error naming it."""
    from PIL import Image, UnidentifiedImageError

    spec = _need_image(inputs, "an image directory")
    files = sorted(p for p in Path(path).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise SplitinferError(f"{path}: no images in it (expected files ending in {', '.join(IMAGE_SUFFIXES)})")
    h, w = spec.shape[2], spec.shape[3]
    for k, f in enumerate(files):
        if n is not None and k >= n:
            break
        try:
            with Image.open(f) as im:
                img = im.convert("RGB").resize((w, h), Image.BILINEAR)
        except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
            raise SplitinferError(f"{f}: not a readable image: {exc}") from exc
        yield {spec.name: _as_input(spec, np.asarray(img, dtype=np.uint8))}


def frames_from(source: str, inputs: Inputs, n: int | None, *, seed: int = 0,
                flag: str = "--source") -> Iterator[dict[str, np.ndarray]]:
    """``synthetic``, ``scene``, a video file or a directory of images; ``n`` frames at most
    (default 100 for the generated sources, every frame of a video or directory)."""
    if source == "synthetic":
        return synthetic_frames(inputs, n if n is not None else 100, seed)
    if source == "scene":
        return scene_frames(inputs, n if n is not None else 100, seed)
    if Path(source).is_dir():
        return image_dir_frames(source, inputs, n)
    if not Path(source).is_file():
        raise SplitinferError(f"{flag} {source!r}: expected 'synthetic', 'scene', a video file or a directory "
                              "of images")
    return video_frames(source, inputs, n)


def given_frames(frames: Iterable[Mapping[str, np.ndarray]], inputs: Inputs, n: int | None = None,
                 what: str = "frame") -> list[dict[str, np.ndarray]]:
    """Frames a caller gave (input dicts), at most ``n``, each checked to hold every input and
    brought to its spec's dtype and shape; a missing input is an error naming it."""
    got: list[dict[str, np.ndarray]] = []
    for k, f in enumerate(frames):
        if n is not None and k >= n:
            break
        missing = [t.name for t in inputs if t.name not in f]
        if missing:
            raise SplitinferError(f"{what} {k}: no value for input {missing[0]!r}")
        got.append({t.name: np.asarray(f[t.name], dtype=t.dtype).reshape(t.shape) for t in inputs})
    return got
