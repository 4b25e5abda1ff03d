"""The wire format: every message kind round-trips; decoding validates every field; arbitrary
bytes never raise anything but a ProtocolError."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitinfer import FieldError, FrameError, LimitError, ProtocolError, TensorError, VersionError
from splitinfer.transport import wire
from splitinfer.transport.wire import (Bye, Error, Hello, InferRequest, Limits, Ping, Pong, Refusal, Result,
                                       ServerTimings, Welcome, decode, encode_bytes)


def frame(header: dict, payload: bytes = b"") -> bytes:
    head = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">I", len(head)) + head + payload


def infer_header(**over):
    h = {"v": 1, "kind": "infer", "request_id": 1, "plan_hash": "h", "candidate": "c1", "codec": "raw",
         "result_codec": "raw", "deadline_ms": 100.0,
         "tensors": [{"name": "x", "dtype": "float32", "shape": [1, 2], "codec": "raw", "off": 0, "len": 8}]}
    h.update(over)
    return h


MESSAGES = [
    Hello("abc", "cam-1", token="t0k"),
    Welcome("s1", "cloud-a"),
    Refusal("token", "bad token"),
    InferRequest(7, "abc", "c2", {"a": np.ones((1, 3, 4), np.float32), "b": np.arange(3)}, codec="raw",
                 deadline_ms=80.0),
    Result(7, {"y": np.zeros((2, 5), np.float32)}, timings=ServerTimings(1.5, 2.0, 3.0, 4)),
    Error(7, "busy", "queue full"),
    Error(None, "protocol", "bad frame"),
    Ping(3, 123.25, padding=100),
    Pong(3, 123.25, recv_ms=0.5, nbytes=200),
    Bye("shutdown"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.KIND)
def test_round_trip(msg):
    got = decode(encode_bytes(msg))
    assert type(got) is type(msg)
    for k, v in vars(msg).items():
        if k == "info":
            continue
        if isinstance(v, dict):
            assert set(got.__dict__[k]) == set(v)
            for name in v:
                assert np.array_equal(got.__dict__[k][name], v[name])
        else:
            assert got.__dict__[k] == v


def test_raw_tensor_is_a_view_of_the_frame():
    buf = bytearray(encode_bytes(InferRequest(1, "h", "c", {"x": np.arange(1000, dtype=np.float32)})))
    msg = decode(buf)
    x = msg.tensors["x"]
    assert not x.flags.owndata
    assert np.shares_memory(x, np.frombuffer(buf, np.uint8))


@pytest.mark.parametrize("data,err,match", [
    (b"", FrameError, "shorter than its 4-byte header length"),
    (b"\x00\x00\x00\x10abc", FrameError, "header length 16 does not fit"),
    (struct.pack(">I", 1) + b"\xc1", FrameError, "not valid msgpack"),
    (frame([1, 2]), FrameError, "must be a msgpack map"),
    (frame({"v": 2, "kind": "bye", "reason": ""}), VersionError, "frame version 2"),
    (frame({"v": 1, "kind": "teleport"}), FrameError, "unknown message kind 'teleport'"),
    (frame({"v": 1, "kind": "hello", "client_id": "c", "protocol": 1}), FieldError, "'plan_hash' is missing"),
    (frame({"v": 1, "kind": "hello", "plan_hash": 5, "client_id": "c", "protocol": 1}), FieldError,
     "'plan_hash' must be str, got int"),
    (frame({"v": 1, "kind": "error", "request_id": 1, "code": "oops", "message": ""}), FieldError,
     "field 'code' is 'oops'"),
    (frame(infer_header(), b"\x00" * 4), TensorError, r"tensor 'x': bytes \[0, 8\) lie outside"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "complex64", "shape": [1], "codec": "raw", "off": 0,
                                  "len": 8}]), b"\x00" * 8), TensorError, "dtype 'complex64' is not allowed"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "float32", "shape": [1, 3], "codec": "raw", "off": 0,
                                  "len": 8}]), b"\x00" * 8), TensorError, r"8 bytes for shape \[1, 3\] float32"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "float32", "shape": [-1], "codec": "raw", "off": 0,
                                  "len": 8}]), b"\x00" * 8), TensorError, r"shape\[0\] must be an integer"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "float32", "shape": [1] * 9, "codec": "raw", "off": 0,
                                  "len": 4}]), b"\x00" * 4), LimitError, "rank 9, the limit is 8"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "int32", "shape": [2], "codec": "int8", "off": 0,
                                  "len": 2}]), b"\x00" * 2), TensorError, "for floating-point tensors"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "float32", "shape": [1, 2], "codec": "int8", "off": 0,
                                  "len": 2}]), b"\x00" * 2), FieldError, "field 'q' is missing"),
    (frame(infer_header(tensors=[{"name": "x", "dtype": "float32", "shape": [1000000], "codec": "raw+zstd",
                                  "off": 0, "len": 4}]), b"\x00" * 4), TensorError, "does not decompress"),
    (frame(infer_header(codec="gzip"), b"\x00" * 8), FieldError, "field 'codec' is 'gzip'"),
    (frame({"v": 1, "kind": "ping", "seq": 1, "sent_at": 0.0, "padding": 10}, b"\x00" * 3), FieldError,
     "says 10 bytes, the frame carries 3"),
    (frame({"v": 1, "kind": "bye", "reason": ""}, b"junk"), FrameError, "carries 4 payload bytes"),
])
def test_bad_frames_name_the_problem(data, err, match):
    with pytest.raises(err, match=match):
        decode(data)


def test_limits():
    msg = InferRequest(1, "h", "c", {f"t{i}": np.zeros(1, np.float32) for i in range(5)})
    with pytest.raises(LimitError, match="5 tensors, the limit is 4"):
        decode(encode_bytes(msg), limits=Limits(max_tensors=4))
    with pytest.raises(LimitError, match="the limit is 100"):
        decode(encode_bytes(msg), limits=Limits(max_frame=100))
    long = Hello("h" * 5000, "c")
    with pytest.raises(LimitError, match="'plan_hash' is 5000 characters"):
        decode(encode_bytes(long))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_crash_the_decoder(data):
    try:
        decode(data)
    except ProtocolError:
        pass


valid_frames = st.sampled_from([encode_bytes(m) for m in MESSAGES])


@settings(max_examples=1500, deadline=None)
@given(valid_frames, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
       st.integers(0, 64))
def test_mutated_valid_frames_never_crash_the_decoder(data, flips, cut):
    buf = bytearray(data)
    for pos, val in flips:
        buf[pos % len(buf)] = val
    if cut:
        buf = buf[: max(0, len(buf) - cut)]
    try:
        decode(bytes(buf))
    except ProtocolError:
        pass


def test_message_kinds_cover_the_protocol():
    assert set(wire.MESSAGE_KINDS) == {"hello", "welcome", "refusal", "infer", "result", "error", "ping", "pong",
                                       "bye"}
