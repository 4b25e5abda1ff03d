"""Tensor codecs on the YOLO-style model's real cut tensors (n at 640): encode + decode
throughput of each codec against a plain memcpy of the same bytes, compression ratio, max error;
and the wire format's encode + decode of a raw frame against memcpy, to show it copies nothing.

    python benchmarks/transport_codecs.py [--size 640] [--repeat 15]

The weights are untrained (seeded) and the input is a smooth synthetic scene, so compression
ratios are indicative; trained weights on real frames are measured by the demo (issue 6).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save, table  # noqa: E402


def scene(size: int) -> np.ndarray:
    """A smooth road-like synthetic image in [0, 1]: sky/road gradient and a few boxes."""
    y, x = np.mgrid[0:size, 0:size] / size
    img = np.stack([0.5 + 0.3 * y, 0.55 + 0.2 * y, 0.7 - 0.3 * y])
    rng = np.random.default_rng(0)
    for _ in range(6):
        x0, y0 = rng.integers(0, size - size // 8, 2)
        img[:, y0:y0 + size // 10, x0:x0 + size // 7] = rng.random((3, 1, 1))
    return img[None].astype(np.float32)


def median_s(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()

    from splitinfer.models import build
    from splitinfer.splitter import Plan, analyse, export_torch, load_model, split_model
    from splitinfer.splitter.cuts import cut_from_edge_nodes
    from splitinfer.splitter.profiler import make_session
    from splitinfer.transport import wire
    from splitinfer.codecs import CODEC_NAMES, decode_tensor, encode_tensor

    with tempfile.TemporaryDirectory() as tmp:
        model, x = build("yolo-n", (1, 3, args.size, args.size))
        onnx_path = Path(tmp) / "yolo.onnx"
        onnx_path.write_bytes(export_torch(model, x))
        g = analyse(load_model(onnx_path).static)
        # the neck cut: what the first top-down concat needs (P4 and P5, plus the P3 skip)
        concat = next(n for n in g.nodes if n.op_type == "Concat" and any(
            g.nodes[g.producer[t]].op_type == "Resize" for t in n.inputs if t in g.producer))
        neck = cut_from_edge_nodes(g, g.ancestors([t for t in concat.inputs if t in g.producer])).tensors
        image = scene(args.size)
        tensors: dict[str, np.ndarray] = {}
        for tag, kw in (("found", {}), ("neck", {"cut": list(neck)})):
            split_model(onnx_path, Path(tmp) / tag, verify=False, report=False, budget_s=0.05, **kw)
            plan = Plan.load(Path(tmp) / tag)
            for c in plan.candidates:
                if c.kind != "split" or c.edge is None:
                    continue
                sess = make_session(str(plan.file(c.edge)))
                outs = dict(zip(c.edge.outputs, sess.run(list(c.edge.outputs), {"input": image})))
                tensors.update(c.cut_feed({"input": image}, outs))
    rows, results = [], []
    for name, t in tensors.items():
        dst = np.empty_like(t)
        memcpy = median_s(lambda: np.copyto(dst, t), args.repeat)
        rng = float(t.max() - t.min())
        for codec in CODEC_NAMES:
            enc_t = median_s(lambda: encode_tensor(t, codec), args.repeat)
            enc = encode_tensor(t, codec)
            dec_t = median_s(lambda: decode_tensor(enc), args.repeat)
            y = decode_tensor(enc)
            err = float(np.abs(y.astype(np.float64) - t).max())
            mbs = t.nbytes / (enc_t + dec_t) / 1e6
            r = {"tensor": name, "shape": list(t.shape), "codec": codec, "bytes": t.nbytes, "encoded": enc.nbytes,
                 "ratio": t.nbytes / enc.nbytes, "encode_ms": enc_t * 1e3, "decode_ms": dec_t * 1e3,
                 "MB_per_s": mbs, "memcpy_MB_per_s": t.nbytes / memcpy / 1e6,
                 "vs_memcpy": (enc_t + dec_t) / memcpy, "max_abs_err": err,
                 "max_err_over_range": err / rng if rng else 0.0}
            results.append(r)
            rows.append([name, codec, f"{t.nbytes / 1024:.0f}", f"{r['ratio']:.2f}", r["encode_ms"], r["decode_ms"],
                         f"{mbs:,.0f}", f"{r['memcpy_MB_per_s']:,.0f}", f"{r['vs_memcpy']:.1f}x", f"{err:.2e}"])
    table(f"codecs on YOLO-n {args.size} cut tensors (median of {args.repeat})",
          ["tensor", "codec", "KiB", "ratio", "enc ms", "dec ms", "enc+dec MB/s", "memcpy MB/s", "time vs memcpy",
           "max |err|"], rows)

    # The wire format copies nothing: encode() returns the array's buffer, decode() views the frame.
    zrows, zero = [], []
    for n in (1 << 16, 1 << 20, 1 << 24):
        arr = np.random.default_rng(0).random(n // 4, dtype=np.float32)
        frame = bytearray(wire.encode_bytes(wire.InferRequest(1, "h", "c", {"x": arr})))
        dst = np.empty_like(arr)
        t_mem = median_s(lambda: np.copyto(dst, arr), args.repeat)
        t_enc = median_s(lambda: wire.encode(wire.InferRequest(1, "h", "c", {"x": arr})), args.repeat)
        t_dec = median_s(lambda: wire.decode(frame), args.repeat)
        zero.append({"bytes": n, "memcpy_us": t_mem * 1e6, "encode_us": t_enc * 1e6, "decode_us": t_dec * 1e6})
        zrows.append([f"{n / 1024:.0f} KiB", t_mem * 1e6, t_enc * 1e6, t_dec * 1e6])
    table("wire encode()/decode() of one raw tensor vs memcpy (µs): flat in size = no copy",
          ["tensor", "memcpy µs", "encode µs", "decode µs"], zrows)
    print(f"wrote {save('transport_codecs', {'size': args.size, 'codecs': results, 'zero_copy': zero})}")


if __name__ == "__main__":
    main()
