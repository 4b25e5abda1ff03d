"""A plain chain CNN: every cut of it crosses exactly one tensor."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ChainCNN"]


class ChainCNN(nn.Module):
    """``forward(images (B, 3, S, S)) -> logits (B, num_classes)``; ``S`` a multiple of 16."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for i in range(4):
            c_out = width * 2**i
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(x)).flatten(1))
