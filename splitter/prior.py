"""The entropy model of a learned bottleneck's latent: per channel, a discretised logistic.

A latent value ``y`` (channel ``c``) is rounded to an integer ``q`` on the wire. The prior gives
each integer the probability mass of a logistic with location ``mu[c]`` and scale ``s[c]`` over
``[q - 1/2, q + 1/2]``, as in the factorised entropy models of Ballé et al. (a learned density
per channel, convolved with a unit box): during training ``-log2`` of that mass, at the latent
plus uniform noise, is the rate term; for the plan the same masses over each channel's range
become the integer tables the rANS coder codes with (:class:`~splitinfer.rans.SymbolTables`),
so the bytes on the wire are what training minimised, give or take the tables' rounding.

The range is where the prior's mass is (``mu ± tail_scales * s``, clipped to ``max_symbols``); a
latent value outside it is clipped there by the encoder (the decoder cannot tell), which costs
fidelity only for values the prior calls near impossible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rans import MAX_SYMBOLS, SymbolTables

__all__ = ["logistic_tables", "logistic_bits", "logistic_bits_torch", "DEFAULT_TAIL_SCALES"]

DEFAULT_TAIL_SCALES = 12.0  # a logistic's mass beyond 12 scales is ~6e-6 on each side


def _cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # the logistic CDF, stable for large |x|


def logistic_tables(mu: np.ndarray, scale: np.ndarray, *, precision: int = 14,
                    tail_scales: float = DEFAULT_TAIL_SCALES, max_symbols: int = 255) -> SymbolTables:
    """Integer frequency tables of the discretised logistic prior, one row per channel."""
    mu = np.asarray(mu, np.float64).reshape(-1)
    scale = np.asarray(scale, np.float64).reshape(-1)
    if mu.shape != scale.shape or not np.isfinite(mu).all() or not (np.isfinite(scale) & (scale > 0)).all():
        raise ValueError("prior: mu and scale must be finite, of the same length, and scale > 0")
    if not 1 <= max_symbols <= MAX_SYMBOLS:
        raise ValueError(f"prior: max_symbols must be in [1, {MAX_SYMBOLS}], got {max_symbols}")
    lo_all, rows = [], []
    for m, s in zip(mu, scale):
        lo = int(np.floor(m - tail_scales * s))
        hi = int(np.ceil(m + tail_scales * s))
        if hi - lo + 1 > max_symbols:  # keep the likeliest max_symbols values
            lo = int(np.round(m)) - (max_symbols - 1) // 2
            hi = lo + max_symbols - 1
        q = np.arange(lo, hi + 1, dtype=np.float64)
        pmf = _cdf((q + 0.5 - m) / s) - _cdf((q - 0.5 - m) / s)
        lo_all.append(lo)
        rows.append(np.maximum(pmf, 0.0) + 1e-12)
    return SymbolTables.from_pmf(lo_all, rows, precision)


def logistic_bits(q: np.ndarray, mu: np.ndarray, scale: np.ndarray, channel_axis: int = 1) -> float:
    """The ideal code length (bits) of integer latent ``q`` under the continuous prior, for checks
    against the tables' real code length."""
    shape: list[Any] = [1] * q.ndim
    shape[channel_axis] = -1
    m = np.asarray(mu, np.float64).reshape(shape)
    s = np.asarray(scale, np.float64).reshape(shape)
    p = _cdf((q + 0.5 - m) / s) - _cdf((q - 0.5 - m) / s)
    return float(-np.log2(np.maximum(p, 1e-300)).sum())


def logistic_bits_torch(y: Any, mu: Any, log_scale: Any, channel_axis: int = 1) -> Any:
    """Training's rate term: the code length (bits, a torch scalar) of latent ``y`` (the latent plus
    uniform noise in training, its rounding at export) under the learned per-channel prior
    (``mu``, ``log_scale``: parameters, one per channel). The same masses as :func:`logistic_bits`,
    computed stably in torch so that gradients reach the latent and the prior."""
    import torch

    shape = [1] * y.dim()
    shape[channel_axis] = -1
    m = mu.reshape(shape)
    inv = torch.exp(-log_scale).reshape(shape)
    upper = torch.sigmoid((y + 0.5 - m) * inv)
    lower = torch.sigmoid((y - 0.5 - m) * inv)
    p = (upper - lower).clamp_min(1e-9)
    return -torch.log2(p).sum()
