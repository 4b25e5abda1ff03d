"""Tensor codecs: round trips and the documented error bound of each lossy codec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from splitinfer import CodecError, TensorError
from splitinfer.codecs import CODEC_NAMES, FP16_MAX, Codec, decode_tensor, encode_tensor
from splitinfer.rans import SymbolTables

floats32 = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=6),
                      elements=st.floats(-1e4, 1e4, width=32))


def _tables(channels, lo=-2, hi=2):
    """Entropy tables of ``channels`` channels over the integers [lo, hi], likelier near 0."""
    q = np.arange(lo, hi + 1)
    return SymbolTables.from_pmf([lo] * channels, [np.exp(-np.abs(q))] * channels, precision=12)


@pytest.mark.parametrize("codec", CODEC_NAMES)
def test_round_trip_every_codec(codec):
    x = np.random.default_rng(0).normal(size=(1, 8, 5, 7)).astype(np.float32)  # jpeg: not an image, goes fp16
    tables = _tables(8) if codec == "rans" else None
    y = decode_tensor(encode_tensor(x, codec, tables=tables), tables=tables)
    assert y.shape == x.shape and y.dtype == x.dtype
    if codec.startswith("raw"):
        assert np.array_equal(x, y)
    if codec == "rans":  # a latent: rounded, and clipped to each channel's range
        assert np.array_equal(y, np.clip(np.rint(x), -2, 2))


def test_rans_codes_a_latent_with_its_plans_tables_only():
    x = np.rint(np.random.default_rng(1).laplace(size=(2, 3, 24, 24))).astype(np.float32)
    tables = _tables(3, -6, 6)
    enc = encode_tensor(x, "rans", tables=tables)
    assert np.array_equal(decode_tensor(enc, tables=tables), np.clip(x, -6, 6))
    assert enc.nbytes < x.size  # well under a byte a value: the tables' code, not int8
    with pytest.raises(CodecError, match="entropy tables; none were given"):
        encode_tensor(x, "rans")
    with pytest.raises(CodecError, match="the tables code 4 channels"):
        encode_tensor(x, "rans", tables=_tables(4))
    with pytest.raises(TensorError, match="no entropy tables"):
        decode_tensor(enc)
    with pytest.raises(TensorError, match="rans payload"):  # tables of another range: not this stream
        decode_tensor(enc, tables=_tables(3, -2, 2))


def test_raw_makes_no_copy_on_either_side():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    enc = encode_tensor(x, "raw")
    assert np.shares_memory(np.frombuffer(enc.payload, np.float32), x)
    y = decode_tensor(enc)
    assert np.shares_memory(y, x) and not y.flags.owndata


@settings(max_examples=200, deadline=None)
@given(floats32)
def test_fp16_bound(x):
    y = decode_tensor(encode_tensor(x, "fp16"))
    err = np.abs(y.astype(np.float64) - x)
    bound = np.maximum(2.0 ** -11 * np.abs(x), 2.0 ** -25)
    assert np.all(err <= bound * (1 + 1e-6))


@settings(max_examples=200, deadline=None)
@given(floats32, st.sampled_from(["int8", "int8+lz4", "int8+zstd"]))
def test_int8_bound_per_channel(x, codec):
    y = decode_tensor(encode_tensor(x, codec))
    axis_view = (lambda a: a.reshape(a.shape[0], a.shape[1], -1).transpose(1, 0, 2).reshape(a.shape[1], -1)) \
        if x.ndim >= 2 else (lambda a: a.reshape(1, -1))
    xv, yv = axis_view(x.astype(np.float64)), axis_view(y.astype(np.float64))
    lo, hi = xv.min(1, keepdims=True), xv.max(1, keepdims=True)
    bound = (hi - lo) / 510 + 1e-6 * np.maximum(np.abs(lo), np.abs(hi)) + 1e-12
    assert np.all(np.abs(xv - yv) <= bound)


def test_int8_is_per_channel():
    # channel 0 spans 0..1, channel 1 spans 0..1000: per-channel error stays small for channel 0
    x = np.stack([np.linspace(0, 1, 100), np.linspace(0, 1000, 100)]).reshape(1, 2, 10, 10).astype(np.float32)
    y = decode_tensor(encode_tensor(x, "int8"))
    assert np.abs(y[0, 0] - x[0, 0]).max() <= 1 / 510 + 1e-6
    assert np.abs(y[0, 1] - x[0, 1]).max() <= 1000 / 510 + 1e-3


def test_integer_tensors_travel_raw_whatever_the_codec():
    x = np.arange(10, dtype=np.int64)
    enc = encode_tensor(x, "int8+lz4")
    assert enc.codec == "raw+lz4"
    assert np.array_equal(decode_tensor(enc), x)


def test_what_cannot_be_encoded_is_refused():
    with pytest.raises(CodecError, match="exceed ±65504"):
        encode_tensor(np.array([FP16_MAX * 2], np.float32), "fp16")
    with pytest.raises(CodecError, match="NaN or infinite"):
        encode_tensor(np.array([1.0, np.nan], np.float32), "int8")
    with pytest.raises(CodecError, match="cannot travel"):
        encode_tensor(np.array(["a"]), "raw")
    with pytest.raises(TensorError, match="codec 'gzip' is unknown"):
        Codec.parse("gzip")


def test_compression_shrinks_sparse_activations():
    x = np.maximum(np.random.default_rng(0).normal(size=(1, 32, 40, 40)), 0).astype(np.float32)  # ReLU-like
    raw = encode_tensor(x, "raw").nbytes
    assert encode_tensor(x, "raw+zstd").nbytes < raw
    assert encode_tensor(x, "int8+lz4").nbytes < raw / 4


@pytest.mark.parametrize("codec", [c for c in CODEC_NAMES if c != "rans"])
def test_empty_tensors_travel(codec):
    x = np.zeros((0, 6), np.float32)  # e.g. no detections
    y = decode_tensor(encode_tensor(x, codec))
    assert y.shape == (0, 6) and y.dtype == np.float32


def test_jpeg_for_images():
    y, x = np.mgrid[0:64, 0:96] / 96.0
    img = np.stack([x, y, 0.5 * (x + y)])[None].astype(np.float32)  # smooth (1, 3, 64, 96) in [0, 1]
    enc = encode_tensor(img, "jpeg")
    assert enc.codec == "jpeg" and enc.nbytes < img.nbytes / 20
    out = decode_tensor(enc)
    assert out.shape == img.shape and np.abs(out - img).mean() < 0.01
    bad = type(enc)(enc.dtype, (1, 3, 32, 96), "jpeg", enc.payload)
    with pytest.raises(TensorError, match="expected a JPEG of 96x32"):
        decode_tensor(bad)
    with pytest.raises(TensorError, match="does not decode"):
        decode_tensor(type(enc)(enc.dtype, enc.shape, "jpeg", b"\xff\xd8junk"))


def test_compressing_an_encoded_tensor_is_encoding_it_with_the_compressor():
    from splitinfer.codecs import compressed

    x = np.random.default_rng(4).standard_normal((1, 8, 6, 5)).astype(np.float32)
    x[x < 0] = 0.0
    for base in ("raw", "fp16", "int8"):
        for comp in ("lz4", "zstd"):
            a, b = compressed(encode_tensor(x, base), comp), encode_tensor(x, f"{base}+{comp}")
            assert (a.codec, bytes(a.payload), a.nbytes) == (b.codec, bytes(b.payload), b.nbytes)
            assert np.array_equal(decode_tensor(a), decode_tensor(b))
    with pytest.raises(CodecError):
        compressed(encode_tensor(x, "int8+lz4"), "zstd")
