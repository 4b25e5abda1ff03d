"""A small transformer encoder (pre-norm): LayerNorm, multi-head attention written with MatMul
and Softmax, MLP, residuals. Proves the splitter is not CNN-specific."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EncoderBlock", "TransformerEncoder"]


class EncoderBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, mlp_ratio: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads, got dim={dim}, heads={heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape  # (B, T, D)
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)  # (B, H, T, D/H)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (d // h) ** -0.5, dim=-1)  # (B, H, T, T)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


class TransformerEncoder(nn.Module):
    """``forward(tokens (B, T, D)) -> (B, T, D)``: ``depth`` encoder blocks and a final norm."""

    def __init__(self, dim: int = 64, heads: int = 4, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(x))
