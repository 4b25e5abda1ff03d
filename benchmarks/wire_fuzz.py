"""A longer fuzz run of the wire decoder than the test suite's: valid frames of every kind,
mutated (byte flips, truncation, splices, inserted junk, rewritten lengths), decoded both ways
(eagerly, and header-first as the cloud and edge do: ``decode(tensors=False)`` then
``decode_tensors``) until ``--frames`` frames or ``--seconds``; any exception other than a
ProtocolError is a failure (exit 1) and is printed with the input that caused it.

    python benchmarks/wire_fuzz.py --frames 1000000      # issue 10's figure: >= 1e6 frames, 0 crashes
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402


def seeds() -> list[bytes]:
    from splitinfer.transport import wire
    from splitinfer.codecs import CODEC_NAMES

    x = np.random.default_rng(0).random((1, 4, 6, 6), dtype=np.float32)
    msgs = [wire.Hello("p" * 64, "cam", token="t"), wire.Welcome("s"), wire.Refusal("token", "no"),
            wire.Error(1, "busy", "full"), wire.Ping(1, 0.5, padding=64), wire.Pong(1, 0.5, 1.0, 100), wire.Bye("x"),
            wire.Result(3, {"y": x}, timings=wire.ServerTimings(1, 2, 3, 4))]
    from splitinfer.codecs import encode_tensor
    from splitinfer.rans import SymbolTables

    tables = SymbolTables.from_pmf([-3] * 4, [np.exp(-np.abs(np.arange(-3, 4)))] * 4, precision=12)
    latent = {"a": encode_tensor(np.rint(4 * x - 2), "rans", tables=tables), "b": np.arange(4)}  # a bottleneck's
    msgs += [wire.InferRequest(i, "p", "c1", latent if c == "rans" else {"a": x, "b": np.arange(4)}, codec=c)
             for i, c in enumerate(CODEC_NAMES)]
    return [wire.encode_bytes(m) for m in msgs]


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.4 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op < 0.55:
            buf = buf[: rng.randrange(len(buf) + 1)]
        elif op < 0.7:
            other = rng.choice(pool)
            cut = rng.randrange(len(buf) + 1)
            buf = buf[:cut] + other[rng.randrange(len(other) + 1):]
        elif op < 0.85:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif len(buf) > 8:  # rewrite the header length
            buf[0:4] = rng.randrange(1 << 32).to_bytes(4, "big")
    return bytes(buf)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3600.0, help="stop after this long at most")
    ap.add_argument("--frames", type=int, default=1_000_000, help="stop after this many frames")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/wire_fuzz.json")
    args = ap.parse_args()
    from splitinfer.errors import ProtocolError
    from splitinfer.transport import wire

    rng = random.Random(args.seed)
    pool = seeds()
    runs = rejected = accepted = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.seconds and runs < args.frames:
        data = mutate(rng, rng.choice(pool), pool)
        runs += 1
        try:
            if runs % 2:
                wire.decode(data)
            else:
                msg = wire.decode(data, tensors=False)
                for fname in ("tensors", "outputs"):
                    if isinstance(getattr(msg, fname, None), dict):
                        wire.decode_tensors(getattr(msg, fname))
            accepted += 1
        except ProtocolError:
            rejected += 1
        except Exception:
            print(f"CRASH after {runs} inputs on {data!r}")
            traceback.print_exc()
            sys.exit(1)
    took = time.monotonic() - t0
    print(f"{runs:,} mutated frames in {took:.0f} s ({runs / took:,.0f}/s): {rejected:,} rejected with a "
          f"ProtocolError, {accepted:,} still valid, crashes 0")
    if not args.no_write:
        print(f"wrote {save('wire_fuzz', {'seconds': round(took, 1), 'runs': runs, 'rejected': rejected, 'accepted': accepted, 'crashes': 0, 'seed': args.seed})}")


if __name__ == "__main__":
    main()
