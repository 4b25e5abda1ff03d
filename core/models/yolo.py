"""A YOLO-style detector (the family of YOLOv8), defined here so nothing comes from a hub.

Backbone: strided Conv-BN-SiLU stem and stages of C2f blocks, SPPF at the end; it yields
P3/P4/P5 at strides 8/16/32. Neck: PAN/FPN, top-down with upsample + concat skip connections,
then bottom-up with strided convs + concat. Head: decoupled (separate box and class branches per
level), anchor-free, box regression as a distribution over ``reg_max`` bins (DFL) decoded inside
the model, so the output is ``(B, 4 + num_classes, N)``: cx, cy, w, h in input pixels, then class
probabilities, the layout of a YOLOv8 ONNX export.

Sizes follow YOLOv8's multipliers: ``n`` (depth 0.33, width 0.25), ``s`` (0.33, 0.50).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["YoloConfig", "YoloDetector", "SIZES"]

# name -> (depth multiple, width multiple, max channels)
SIZES: dict[str, tuple[float, float, int]] = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
}


@dataclass(frozen=True)
class YoloConfig:
    size: str = "n"  # one of SIZES
    num_classes: int = 4  # car, bus, truck, motorbike for the demo
    reg_max: int = 16  # DFL bins per box side
    input_size: int = 640  # square input, multiple of 32

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)}, got {self.size!r}")
        if self.input_size % 32:
            raise ValueError(f"input_size must be a multiple of 32, got {self.input_size}")


class Conv(nn.Module):
    """Conv2d + BatchNorm + SiLU."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1 = Conv(c, c, 3)
        self.cv2 = Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP bottleneck with two convs: split, n bottlenecks chained, concat every stage."""

    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools, concatenated."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        c_ = c_in // 2
        self.cv1 = Conv(c_in, c_, 1)
        self.cv2 = Conv(c_ * 4, c_out, 1)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat((x, y1, y2, self.pool(y2)), 1))


class Detect(nn.Module):
    """Decoupled anchor-free head with DFL box decoding."""

    def __init__(self, num_classes: int, channels: tuple[int, ...], reg_max: int, input_size: int) -> None:
        super().__init__()
        self.nc = num_classes
        self.reg_max = reg_max
        self.strides = (8, 16, 32)
        c2 = max(16, channels[0] // 4, reg_max * 4)
        c3 = max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for c in channels
        )
        self.cls = nn.ModuleList(
            nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, num_classes, 1)) for c in channels
        )
        # Anchor points (cell centres) and their strides, fixed by the input size.
        points, strides = [], []
        for s in self.strides:
            n = input_size // s
            ys, xs = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5, indexing="ij")
            points.append(torch.stack((xs, ys), 0).reshape(2, -1))
            strides.append(torch.full((1, n * n), float(s)))
        self.register_buffer("anchors", torch.cat(points, 1), persistent=False)  # (2, N)
        self.register_buffer("stride_map", torch.cat(strides, 1), persistent=False)  # (1, N)
        self.register_buffer("bins", torch.arange(reg_max, dtype=torch.float32).view(1, 1, reg_max, 1),
                             persistent=False)
        self._init_bias()

    def _init_bias(self) -> None:
        # Start class logits at a low prior (few objects per cell), as YOLO does.
        for seq, s in zip(self.cls, self.strides):
            conv = seq[-1]
            assert isinstance(conv, nn.Conv2d) and conv.bias is not None
            nn.init.constant_(conv.bias, math.log(5 / self.nc / (640 / s) ** 2))

    def raw(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Box distribution logits (B, 4*reg_max, N) and class logits (B, nc, N)."""
        b = feats[0].shape[0]
        box = torch.cat([m(f).reshape(b, 4 * self.reg_max, -1) for m, f in zip(self.box, feats)], 2)
        cls = torch.cat([m(f).reshape(b, self.nc, -1) for m, f in zip(self.cls, feats)], 2)
        return box, cls

    def decode(self, box: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        b = box.shape[0]
        dist = box.reshape(b, 4, self.reg_max, -1).softmax(2)  # (B, 4, R, N)
        ltrb = (dist * self.bins).sum(2)  # (B, 4, N) distances in strides
        lt, rb = ltrb[:, :2], ltrb[:, 2:]
        x1y1 = self.anchors - lt
        x2y2 = self.anchors + rb
        cxcy = (x1y1 + x2y2) / 2
        wh = x2y2 - x1y1
        xywh = torch.cat((cxcy, wh), 1) * self.stride_map  # (B, 4, N) pixels
        return torch.cat((xywh, cls.sigmoid()), 1)  # (B, 4 + nc, N)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return self.decode(*self.raw(feats))


class YoloDetector(nn.Module):
    """YOLO-style detector. ``forward(images (B, 3, S, S) in [0, 1]) -> (B, 4 + nc, N)``.

    >>> m = YoloDetector(YoloConfig(size="n", input_size=64)).eval()
    >>> m(torch.zeros(1, 3, 64, 64)).shape
    torch.Size([1, 8, 84])
    """

    def __init__(self, config: YoloConfig = YoloConfig()) -> None:
        super().__init__()
        self.config = config
        depth, width, max_ch = SIZES[config.size]

        def ch(c: int) -> int:
            return int(math.ceil(min(c, max_ch) * width / 8) * 8)

        def n(k: int) -> int:
            return max(round(k * depth), 1)

        c1, c2, c3, c4, c5 = ch(64), ch(128), ch(256), ch(512), ch(1024)
        # backbone
        self.stem = Conv(3, c1, 3, 2)  # P1/2
        self.down2 = Conv(c1, c2, 3, 2)  # P2/4
        self.stage2 = C2f(c2, c2, n(3), True)
        self.down3 = Conv(c2, c3, 3, 2)  # P3/8
        self.stage3 = C2f(c3, c3, n(6), True)
        self.down4 = Conv(c3, c4, 3, 2)  # P4/16
        self.stage4 = C2f(c4, c4, n(6), True)
        self.down5 = Conv(c4, c5, 3, 2)  # P5/32
        self.stage5 = C2f(c5, c5, n(3), True)
        self.sppf = SPPF(c5, c5)
        # neck: top-down
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.td4 = C2f(c5 + c4, c4, n(3), False)
        self.td3 = C2f(c4 + c3, c3, n(3), False)
        # neck: bottom-up
        self.bu3 = Conv(c3, c3, 3, 2)
        self.bu4 = C2f(c3 + c4, c4, n(3), False)
        self.bu4_down = Conv(c4, c4, 3, 2)
        self.bu5 = C2f(c4 + c5, c5, n(3), False)
        self.head = Detect(config.num_classes, (c3, c4, c5), config.reg_max, config.input_size)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The neck's outputs at strides 8, 16, 32."""
        x = self.stage2(self.down2(self.stem(x)))
        p3 = self.stage3(self.down3(x))
        p4 = self.stage4(self.down4(p3))
        p5 = self.sppf(self.stage5(self.down5(p4)))
        t4 = self.td4(torch.cat((self.up(p5), p4), 1))
        n3 = self.td3(torch.cat((self.up(t4), p3), 1))
        n4 = self.bu4(torch.cat((self.bu3(n3), t4), 1))
        n5 = self.bu5(torch.cat((self.bu4_down(n4), p5), 1))
        return [n3, n4, n5]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
