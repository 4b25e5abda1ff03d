"""Learned bottlenecks: the model and its training (``add_bottleneck.py`` puts one in a plan).

At a cut tensor ``x`` (C, H, W) a small encoder on the edge maps it to a latent of ``K`` channels at
``1/stride`` of its resolution; the latent is rounded to integers and entropy-coded on the wire with
a per-channel discretised logistic prior (``prior.py``, ``splitinfer.rans``); a decoder on the
cloud restores a tensor of the cut's shape for the frozen rest of the model. Training is
distillation from the frozen model on unlabeled frames (no labels, no hub weights):

* the loss is ``feature + output + rate_weight * bits per frame / 1e3``: the cut restored (MSE over
  the cut's variance), the model's outputs restored through the frozen back segment run in torch
  (``onnx_torch.py``; MSE over each output channel's variance: a detector's few class-score rows
  would otherwise count for nothing beside its box coordinates in pixels, and class scores are what
  its accuracy rests on), and the latent's code length under the prior;
* the first ``feature_share`` of the time trains on the feature term alone (a fast start), then the
  output term is eased in (``ramp_share``) and the learning rate falls over the last part
  (``decay_share``): the supervised-compression literature (BottleFit, SC2) and this project's
  prototype agree that output distillation is what keeps the accuracy;
* in training the latent gets uniform noise in [-1/2, 1/2) in place of rounding (Ballé et al.), so
  the rate term is differentiable and the decoder learns to read rounded values.

The trained parts become ONNX nodes in the plan's segments (``bottleneck_graph.py``) and the
prior's tables code the latent on the wire (the ``rans`` codec).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BottleneckConfig", "build_bottleneck", "train_bottleneck", "TrainReport"]


@dataclass(frozen=True)
class BottleneckConfig:
    channels: int = 12  # latent channels K
    stride: int = 2  # the latent's resolution is the cut's / stride
    hidden: int = 64  # the encoder's and decoder's inner width
    rate_weight: float = 0.01  # weight of the bits term (per 1000 bits a frame)
    seconds: float = 600.0  # training time budget
    feature_share: float = 0.3  # the first part of the time: the feature term alone
    ramp_share: float = 0.1  # then the output term eased in over this part of the time
    decay_share: float = 0.3  # the learning rate falls to a tenth over the last part
    lr: float = 2e-3
    batch: int = 8
    seed: int = 0


@dataclass
class TrainReport:
    steps: int = 0
    seconds: float = 0.0
    bits_per_frame: float = math.nan  # the rate term at the end (noisy latent: an estimate)
    feature_mse: float = math.nan  # relative to the cut's variance
    output_mse: float = math.nan  # relative to the outputs' variance
    history: list[dict[str, float]] = field(default_factory=list)


def _channel_var(v: Any) -> Any:
    """The variance of each channel (axis 1) of ``v`` over every other axis, shaped to broadcast
    against ``v``; the whole tensor's for rank < 2."""
    if v.dim() < 2:
        return v.var() + 1e-8
    dims = [d for d in range(v.dim()) if d != 1]
    return v.var(dim=dims, keepdim=True) + 1e-8


def build_bottleneck(cut_channels: int, cfg: BottleneckConfig) -> Any:
    """The trainable parts: ``encoder`` (edge), ``decoder`` (cloud) and the prior's ``mu`` and
    ``log_scale`` (one per latent channel), as one ``torch.nn.Module``."""
    import torch
    from torch import nn

    torch.manual_seed(cfg.seed)
    k, h, s = cfg.channels, cfg.hidden, cfg.stride

    class Bottleneck(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(
                nn.Conv2d(cut_channels, h, 3, padding=1), nn.SiLU(),
                nn.Conv2d(h, k, 3, stride=s, padding=1),
            )
            self.decoder = nn.Sequential(
                nn.Conv2d(k, h, 3, padding=1), nn.SiLU(),
                nn.Upsample(scale_factor=s, mode="nearest") if s > 1 else nn.Identity(),
                nn.Conv2d(h, h, 3, padding=1), nn.SiLU(),
                nn.Conv2d(h, cut_channels, 3, padding=1),
            )
            self.mu = nn.Parameter(torch.zeros(k))
            self.log_scale = nn.Parameter(torch.zeros(k))

        def forward(self, x: Any, noisy: bool = True) -> tuple[Any, Any]:
            y = self.encoder(x)
            y_hat = y + (torch.rand_like(y) - 0.5) if noisy else torch.round(y)
            out = self.decoder(y_hat)
            return out[..., : x.shape[-2], : x.shape[-1]], y_hat

    return Bottleneck()


def train_bottleneck(model: Any, back: Any, batches: Callable[[], Iterator[Any]], cut_name: str,
                     cfg: BottleneckConfig, progress: Callable[[str, float], None] | None = None) -> TrainReport:
    """Train ``model`` (from :func:`build_bottleneck`) for ``cfg.seconds``. ``batches()`` yields cut
    tensors (B, C, H, W) as torch tensors, made by the frozen front from frames; ``back`` is the
    frozen back segment (an ``OnnxModule`` taking ``{cut_name: tensor}``), or None to distil the cut
    tensors alone."""
    import torch

    from .prior import logistic_bits_torch

    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    report = TrainReport()
    t0 = time.monotonic()
    it = batches()
    feat_var = out_var = None
    while (elapsed := time.monotonic() - t0) < cfg.seconds:
        try:
            x = next(it)
        except StopIteration:
            it = batches()
            x = next(it)
        if feat_var is None:
            feat_var = float(x.var()) + 1e-8
        restored, y_hat = model(x)
        feature = ((restored - x) ** 2).mean() / feat_var
        loss = feature
        output = torch.zeros(())
        use_output = back is not None and elapsed >= cfg.feature_share * cfg.seconds
        if use_output:
            with torch.no_grad():
                want = back({cut_name: x})
            got = back({cut_name: restored})
            if out_var is None:  # per output channel (axis 1): a detector's class scores count as much as its boxes
                out_var = {n: _channel_var(v) for n, v in want.items()}
            output = sum((((got[n] - want[n]) ** 2) / out_var[n]).mean() for n in want) / len(want)
            # eased in: a decoder trained on the features alone meets a large output error at first,
            # and taken at full weight at once it undoes what the feature phase learned
            ramp = min(1.0, (elapsed - cfg.feature_share * cfg.seconds) / max(cfg.ramp_share * cfg.seconds, 1e-9))
            loss = loss + ramp * output
        bits = logistic_bits_torch(y_hat, model.mu, model.log_scale) / x.shape[0]
        loss = loss + cfg.rate_weight * bits / 1e3
        # the learning rate falls linearly to a tenth over the last part of the time
        frac = elapsed / cfg.seconds
        decay = 1.0 if frac < 1.0 - cfg.decay_share else max(0.1, (1.0 - frac) / cfg.decay_share)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * decay
        opt.zero_grad()
        loss.backward()
        opt.step()
        report.steps += 1
        if report.steps % 20 == 0 or report.steps == 1:
            row = {"s": round(elapsed, 1), "feature": float(feature.detach()), "output": float(output.detach()),
                   "bits": float(bits.detach())}
            report.history.append(row)
            if progress:
                progress(f"step {report.steps}: bits/frame {row['bits']:.0f}, feature {row['feature']:.4f}, "
                         f"output {row['output']:.4f}", min(elapsed / cfg.seconds, 1.0))
        report.bits_per_frame = float(bits.detach())
        report.feature_mse = float(feature.detach())
        report.output_mse = float(output.detach()) if use_output else math.nan
    report.seconds = time.monotonic() - t0
    return report
