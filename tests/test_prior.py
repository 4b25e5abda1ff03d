"""The bottleneck's entropy model: a discretised logistic per channel, turned into the rANS tables
the wire codes with; the real code is as long as the prior says, and every value in range codes."""

from __future__ import annotations

import numpy as np
import pytest

from splitinfer.rans import rans_decode, rans_encode
from splitinfer.splitter.prior import logistic_bits, logistic_tables


def test_latents_drawn_from_the_prior_code_to_its_entropy():
    rng = np.random.default_rng(0)
    mu = np.array([0.0, 2.3, -1.7, 0.4])
    scale = np.array([0.6, 1.5, 3.0, 0.25])
    n = 20 * 20
    y = rng.logistic(mu[:, None], scale[:, None], size=(4, n))  # (C, N) samples of each channel's density
    q = np.round(y).astype(np.int64)[None].reshape(1, 4, 20, 20)
    tables = logistic_tables(mu, scale)
    q = np.clip(q, tables.lo[None, :, None, None], tables.hi()[None, :, None, None])
    code = rans_encode(q, tables)
    assert np.array_equal(rans_decode(code, q.shape, tables, dtype=np.int64), q)
    ideal = logistic_bits(q, mu, scale) / 8
    assert len(code) <= ideal * 1.02 + 160  # the tables' rounding and the coder's final states
    assert len(code) >= ideal * 0.9


def test_every_value_in_a_channels_range_can_be_coded():
    tables = logistic_tables([0.0, 5.0], [0.1, 0.1])
    for c in range(2):
        lo, hi = int(tables.lo[c]), int(tables.hi()[c])
        assert lo <= [0, 5][c] <= hi
        vals = np.arange(lo, hi + 1)
        q = np.zeros((1, 2, len(vals)), np.int64)
        q[0, c] = vals
        q[0, 1 - c] = [0, 5][1 - c]
        assert np.array_equal(rans_decode(rans_encode(q, tables), q.shape, tables, dtype=np.int64), q)


def test_a_wide_prior_keeps_its_likeliest_values():
    t = logistic_tables([3.0], [100.0], max_symbols=255)
    assert t.hi()[0] - t.lo[0] + 1 == 255 and t.lo[0] <= 3 <= t.hi()[0]
    with pytest.raises(ValueError, match="scale > 0"):
        logistic_tables([0.0], [0.0])


def test_the_training_rate_is_the_code_length_the_tables_give():
    torch = pytest.importorskip("torch")
    from splitinfer.splitter.prior import logistic_bits_torch

    mu, scale = np.array([0.5, -2.0, 1.0]), np.array([0.8, 2.0, 0.3])
    q = np.round(np.random.default_rng(3).logistic(mu[:, None], scale[:, None], (3, 64))).reshape(1, 3, 8, 8)
    mu_t = torch.tensor(mu, requires_grad=True)
    log_s = torch.tensor(np.log(scale), requires_grad=True)
    y = torch.tensor(q, requires_grad=True)
    bits = logistic_bits_torch(y, mu_t, log_s)
    assert float(bits.detach()) == pytest.approx(logistic_bits(q, mu, scale), rel=1e-6)
    bits.backward()
    assert y.grad is not None and mu_t.grad is not None and log_s.grad is not None
