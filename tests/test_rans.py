"""The latent's entropy coder: exact round trips under per-channel tables, a code near the ideal
length, the same bytes every time, and damaged or forged streams refused with a CodecError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitinfer import CodecError
from splitinfer.rans import SymbolTables, rans_decode, rans_encode


def logistic_tables(scales, precision=14, spread=8.0):
    lo, pmf = [], []
    for s in scales:
        r = int(np.ceil(spread * s)) + 1
        xs = np.arange(-r, r + 1, dtype=np.float64)

        def cdf(v):
            return 1 / (1 + np.exp(-v / s))
        pmf.append(cdf(xs + 0.5) - cdf(xs - 0.5))
        lo.append(-r)
    return SymbolTables.from_pmf(lo, pmf, precision)


def latent(tables, shape, seed=0, scales=None):
    rng = np.random.default_rng(seed)
    c = shape[1]
    scales = scales if scales is not None else [1.0] * c
    y = np.stack([np.round(rng.logistic(0, scales[k], shape[:1] + shape[2:])) for k in range(c)], axis=1)
    return np.clip(y, tables.lo.reshape(1, -1, *[1] * (len(shape) - 2)),
                   tables.hi().reshape(1, -1, *[1] * (len(shape) - 2))).astype(np.int8)


def test_a_latent_round_trips_near_its_ideal_length():
    scales = list(np.random.default_rng(1).uniform(0.2, 3.0, 12))
    t = logistic_tables(scales)
    y = latent(t, (1, 12, 20, 20), scales=scales)
    data = rans_encode(y, t)
    back = rans_decode(data, y.shape, t)
    assert back.dtype == np.int8 and np.array_equal(back, y)
    ideal = t.bits(y) / 8
    assert ideal < len(data) <= ideal + 4 * 32 + 16  # the 32 lanes' final states, and a word's rounding each
    assert rans_encode(y, t) == data  # deterministic: the same bytes every time


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_symbols_in_range_round_trip(data):
    channels = data.draw(st.integers(1, 5))
    precision = data.draw(st.integers(8, 16))
    lo = [data.draw(st.integers(-40, 40)) for _ in range(channels)]
    rows = [data.draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30).filter(lambda r: sum(r) > 0))
            for _ in range(channels)]
    t = SymbolTables.from_pmf(lo, rows, precision)
    h, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    lanes = data.draw(st.sampled_from([1, 3, 32, 256]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    y = np.stack([rng.integers(t.lo[c], t.hi()[c] + 1, (h, w)) for c in range(channels)])[None]
    code = rans_encode(y, t, lanes=lanes)
    assert np.array_equal(rans_decode(code, y.shape, t, lanes=lanes, dtype=np.int16), y)


def test_tables_hold_every_symbol_and_sum_to_the_precision():
    t = SymbolTables.from_pmf([-2, 0], [[1e-12, 0.5, 0.5, 1e-12, 0.0], [1.0]], 10)
    assert (t.freqs.sum(axis=1) == 1024).all()
    assert list(t.widths()) == [5, 1] and (t.freqs[0] >= 1).all()  # a probability of 0 still gets 1
    r = SymbolTables.from_json(t.to_json())
    assert r.precision == t.precision and np.array_equal(r.lo, t.lo) and np.array_equal(r.freqs, t.freqs)


@pytest.mark.parametrize("bad,match", [
    ({"precision": 20, "lo": [0], "freqs": [[1 << 20]]}, "precision"),
    ({"precision": 10, "lo": [0], "freqs": [[1000]]}, "sum to"),
    ({"precision": 10, "lo": [0], "freqs": [[1024, 0, 0]]}, "sum to|frequency 0"),
    ({"precision": 10, "lo": [0], "freqs": [[512, 0, 512]]}, "frequency 0"),
    ({"precision": 10, "lo": [0, 1], "freqs": [[1024]]}, "lows"),
    ({"precision": 10, "lo": [0], "freqs": [["1024"]]}, "integer"),
    ({"precision": 10, "lo": [0]}, "freqs"),
])
def test_malformed_tables_are_refused_naming_the_problem(bad, match):
    with pytest.raises(CodecError, match=match):
        SymbolTables.from_json(bad)


def test_symbols_outside_the_tables_are_refused():
    t = logistic_tables([1.0, 1.0])
    y = np.zeros((1, 2, 3, 3), np.int8)
    y[0, 1, 2, 2] = 100
    with pytest.raises(CodecError, match="outside its table's range"):
        rans_encode(y, t)
    with pytest.raises(CodecError, match="channels"):
        rans_encode(np.zeros((1, 3, 2, 2), np.int8), t)


def test_damaged_or_forged_streams_are_refused():
    t = logistic_tables([0.7, 2.0, 1.3])
    y = latent(t, (1, 3, 8, 8), scales=[0.7, 2.0, 1.3])
    code = bytearray(rans_encode(y, t, lanes=8))
    refused = 0
    rng = np.random.default_rng(2)
    for _ in range(200):
        bad = bytearray(code)
        k = int(rng.integers(0, len(bad)))
        bad[k] ^= 1 << int(rng.integers(0, 8))
        try:
            out = rans_decode(bytes(bad), y.shape, t, lanes=8)
        except CodecError:
            refused += 1
        else:
            assert out.shape == y.shape  # never another shape, whatever the bytes
    assert refused >= 190  # the final states and the word count check nearly every flip
    for cut in (0, 1, len(code) - 2, len(code) - 1):
        with pytest.raises(CodecError):
            rans_decode(bytes(code[:cut]), y.shape, t, lanes=8)
    with pytest.raises(CodecError):
        rans_decode(bytes(code) + b"\0\0", y.shape, t, lanes=8)
    with pytest.raises(CodecError, match="does not fit"):
        rans_decode(bytes(code), (1, 4, 8, 8), t, lanes=8)
