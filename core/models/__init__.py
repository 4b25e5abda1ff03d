"""Reference models defined in the project (PyTorch; needs the ``torch`` extra).

Tests, benchmarks and the demo build them by name with :func:`build`. Weights are random
unless a caller loads its own (the demo trains the detector with a script in the repo).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["REFERENCE_MODELS", "build"]

# name -> (what it is, default input shape)
REFERENCE_MODELS: dict[str, tuple[str, tuple[int, ...]]] = {
    "yolo-n": ("YOLO-style detector, n size (C2f backbone, PAN neck, decoupled head)", (1, 3, 640, 640)),
    "yolo-s": ("YOLO-style detector, s size", (1, 3, 640, 640)),
    "chain": ("plain chain CNN, 4 conv stages + linear", (1, 3, 224, 224)),
    "transformer": ("2 pre-norm transformer encoder blocks, dim 64, 4 heads", (1, 64, 64)),
}


def build(name: str, input_shape: tuple[int, ...] | None = None, seed: int = 0,
          **kwargs: Any) -> tuple["torch.nn.Module", "torch.Tensor"]:
    """Build reference model ``name`` in eval mode with seeded weights, and an example input.

    ``input_shape`` overrides the default (for the YOLO models the spatial size sets the
    detector's anchor grid). Extra keyword arguments go to the model's constructor/config.

    >>> model, x = build("chain", (1, 3, 32, 32))
    >>> tuple(model(x).shape)
    (1, 10)
    """
    import torch

    if name not in REFERENCE_MODELS:
        raise ValueError(f"unknown reference model {name!r}; expected one of {sorted(REFERENCE_MODELS)}")
    shape = tuple(input_shape or REFERENCE_MODELS[name][1])
    torch.manual_seed(seed)
    model: torch.nn.Module
    if name.startswith("yolo-"):
        from .yolo import YoloConfig, YoloDetector

        if len(shape) != 4 or shape[2] != shape[3]:
            raise ValueError(f"yolo input shape must be (B, 3, S, S), got {shape}")
        model = YoloDetector(YoloConfig(size=name.split("-")[1], input_size=shape[2], **kwargs))
    elif name == "chain":
        from .chain import ChainCNN

        model = ChainCNN(**kwargs)
    else:
        from .transformer import TransformerEncoder

        model = TransformerEncoder(dim=shape[-1], **kwargs)
    model.eval()
    return model, torch.rand(*shape)
