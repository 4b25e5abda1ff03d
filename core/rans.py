"""Entropy coding of a quantised latent with static per-channel distributions: interleaved rANS
in numpy, the same bytes on every machine.

A learned bottleneck's latent is a tensor of small integers, one distribution per channel (the
prior learned with it). Its bytes on the wire are a range-asymmetric-numeral-system (rANS) code
of those symbols under integer frequency tables that the plan records and hashes
(:class:`SymbolTables`): both sides code with the same integers, so there is no float rounding
to disagree on, and no library is needed beyond numpy (constriction, a Rust coder, has no Linux
aarch64 wheel and no sdist, so a Jetson could not install it).

The coder follows the standard 32-bit rANS with 16-bit renormalisation (J. Duda, "Asymmetric
numeral systems", 2009; F. Giesen's interleaved form): states in ``[2**16, 2**32)``, frequency
tables of ``2**precision`` (at most 16 bits), symbols dealt round-robin to ``lanes`` independent
states that numpy advances together, one step for every ``lanes`` symbols. Each lane's final state
costs 4 bytes, so a small latent gets fewer lanes: one per :data:`SYMBOLS_PER_LANE` symbols, at
most ``lanes`` (both sides derive the count from the symbol count). A stream is::

    u32 lanes final states | u16 renormalisation words, in the order the decoder reads them

Decoding does a fixed amount of work for the symbol count it is asked for (the plan's latent
shape, never the stream's say) and checks that every state ends where encoding began and that
every word was used, so a damaged or forged stream is an error (:class:`CodecError`), never a
hang or a wrong-sized tensor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CodecError

__all__ = ["SymbolTables", "rans_encode", "rans_decode", "DEFAULT_LANES", "MAX_LANES", "SYMBOLS_PER_LANE"]

_L = 1 << 16  # the lower end of a state
_WORD = 16  # bits a renormalisation step moves
DEFAULT_LANES = 32  # at most 32 states: 128 bytes of final states; a 12x20x20 latent: ~0.9 ms to encode, ~1.4 to decode here
SYMBOLS_PER_LANE = 128  # fewer symbols than 32 x this: fewer lanes (a 128-symbol latent: one state, 4 bytes)
MAX_LANES = 256
MAX_SYMBOLS = 1 << 12  # symbols a channel's table may hold
MAX_CHANNELS = 4096


@dataclass(frozen=True, eq=False)
class SymbolTables:
    """Per channel, the integer frequencies of symbols ``lo[c]``, ``lo[c] + 1``, ...; each row sums
    to ``2**precision`` and every symbol in range has frequency >= 1 (so any value the encoder
    clips to the range can be coded). ``freqs`` is (channels, width), zero-padded past a row's end."""

    precision: int
    lo: np.ndarray  # (C,) int64: each channel's smallest symbol
    freqs: np.ndarray  # (C, width) int64

    def __post_init__(self) -> None:
        p, lo, f = self.precision, self.lo, self.freqs
        if not (isinstance(p, int) and 8 <= p <= 16):
            raise CodecError(f"entropy tables: precision must be an integer in [8, 16], got {p!r}")
        if lo.ndim != 1 or f.ndim != 2 or f.shape[0] != lo.shape[0] or not 1 <= f.shape[0] <= MAX_CHANNELS:
            raise CodecError(f"entropy tables: expected lo (C,) and freqs (C, width) with 1 <= C <= {MAX_CHANNELS}, "
                             f"got {lo.shape} and {f.shape}")
        if not 1 <= f.shape[1] <= MAX_SYMBOLS:
            raise CodecError(f"entropy tables: a channel may hold 1..{MAX_SYMBOLS} symbols, got {f.shape[1]}")
        if (f < 0).any() or (f.sum(axis=1) != 1 << p).any():
            bad = int(np.flatnonzero((f < 0).any(axis=1) | (f.sum(axis=1) != 1 << p))[0])
            raise CodecError(f"entropy tables: channel {bad}'s frequencies must be >= 0 and sum to 2**{p}, "
                             f"got a sum of {int(f[bad].sum())}")
        width = self.widths()
        if ((f > 0).sum(axis=1) != width).any():
            bad = int(np.flatnonzero((f > 0).sum(axis=1) != width)[0])
            raise CodecError(f"entropy tables: channel {bad} has a symbol of frequency 0 inside its range")
        if (np.abs(lo) > 1 << 15).any():
            raise CodecError("entropy tables: symbols must lie within +-32768")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_pmf(cls, lo: Sequence[int], pmf: Sequence[Sequence[float]], precision: int = 14) -> "SymbolTables":
        """Integer tables from per-channel probabilities (each row over its channel's range, from
        ``lo[c]``; rows may differ in length): every symbol gets at least 1, the rest is shared in
        proportion, the rounding's remainder going to the likeliest symbols."""
        total = 1 << precision
        rows = [np.asarray(r, dtype=np.float64) for r in pmf]
        width = max(len(r) for r in rows)
        freqs = np.zeros((len(rows), width), np.int64)
        for c, r in enumerate(rows):
            if len(r) == 0 or len(r) > total or not np.isfinite(r).all() or (r < 0).any() or r.sum() <= 0:
                raise CodecError(f"entropy tables: channel {c}'s probabilities must be finite, >= 0, not all 0, "
                                 f"and at most 2**precision of them")
            share = r / r.sum() * (total - len(r))
            f = 1 + np.floor(share).astype(np.int64)
            short = total - int(f.sum())
            order = np.argsort(-(share - np.floor(share)), kind="stable")  # largest remainders first
            f[order[:short]] += 1
            freqs[c, :len(r)] = f
        return cls(precision, np.asarray(lo, np.int64), freqs)

    def widths(self) -> np.ndarray:
        """Symbols per channel."""
        nz = self.freqs > 0
        return np.where(nz.any(axis=1), self.freqs.shape[1] - np.argmax(nz[:, ::-1], axis=1), 0)

    def hi(self) -> np.ndarray:
        """Each channel's largest symbol."""
        return self.lo + self.widths() - 1

    def bits(self, symbols: np.ndarray, channel_axis: int = 1) -> float:
        """The ideal code length of ``symbols`` under these tables (bits), for reports."""
        sym, ch = _flat(symbols, channel_axis, self)
        p = self.freqs[ch, sym - self.lo[ch]] / float(1 << self.precision)
        return float(-np.log2(p).sum())

    # ------------------------------------------------------------------ the plan's record
    def to_json(self) -> dict[str, Any]:
        w = self.widths()
        return {"precision": self.precision, "lo": [int(v) for v in self.lo],
                "freqs": [[int(v) for v in self.freqs[c, :w[c]]] for c in range(len(w))]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SymbolTables":
        try:
            rows = [list(r) for r in d["freqs"]]
            lo = [int(v) for v in d["lo"]]
            precision = d["precision"]
            if len(rows) != len(lo) or not rows or len(rows) > MAX_CHANNELS:
                raise ValueError(f"{len(lo)} lows for {len(rows)} rows")
            width = max(len(r) for r in rows)
            if not 1 <= width <= MAX_SYMBOLS:
                raise ValueError(f"a row of {width} symbols")
            freqs = np.zeros((len(rows), width), np.int64)
            for c, r in enumerate(rows):
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in r):
                    raise ValueError(f"row {c} holds a value that is not an integer")
                if not r or min(r) < 1:
                    raise ValueError(f"row {c} holds a symbol of frequency 0 (every symbol in range needs >= 1)")
                freqs[c, :len(r)] = r
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"entropy tables: expected {{precision, lo: [int], freqs: [[int]]}}: {exc}") from None
        return cls(precision, np.asarray(lo, np.int64), freqs)

    # ------------------------------------------------------------------ coding helpers (built once)
    @functools.cached_property
    def cum(self) -> np.ndarray:
        """(C, width + 1): each symbol's cumulative start."""
        return np.concatenate([np.zeros((self.freqs.shape[0], 1), np.int64), np.cumsum(self.freqs, axis=1)], axis=1)

    @functools.cached_property
    def slot_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat per (channel, slot) tables for decoding, with one row more for padding (a single
        certain symbol): the symbol's index in its range, its frequency, and the slot's place in
        the symbol's range."""
        n_ch, total = self.lo.shape[0], 1 << self.precision
        widths = self.widths()
        sym = np.zeros((n_ch + 1, total), np.int64)
        freq = np.full((n_ch + 1, total), total, np.int64)
        bias = np.tile(np.arange(total, dtype=np.int64), (n_ch + 1, 1))
        for c in range(n_ch):
            fr = self.freqs[c, :widths[c]]
            sym[c] = np.repeat(np.arange(widths[c]), fr)
            freq[c] = fr[sym[c]]
            bias[c] -= np.repeat(np.cumsum(fr) - fr, fr)
        return sym.reshape(-1), freq.reshape(-1), bias.reshape(-1)

    @functools.cached_property
    def packed_slots(self) -> np.ndarray:
        """:attr:`slot_tables` in one array, ``frequency << 32 | bias << 16 | symbol`` (frequency
        <= 2**16, bias < 2**16, symbol index < 2**12), so decoding gathers once a step."""
        sym, freq, bias = self.slot_tables
        return (freq << 32) | (bias << 16) | sym


def _flat(symbols: np.ndarray, channel_axis: int, tables: SymbolTables) -> tuple[np.ndarray, np.ndarray]:
    """Symbols in C order, and each one's channel."""
    arr = np.asarray(symbols)
    if arr.ndim == 0 or not -arr.ndim <= channel_axis < arr.ndim:
        raise CodecError(f"entropy coding: channel axis {channel_axis} for a tensor of shape {arr.shape}")
    axis = channel_axis % arr.ndim
    if arr.shape[axis] != tables.lo.shape[0]:
        raise CodecError(f"entropy coding: the tables have {tables.lo.shape[0]} channels, the tensor "
                         f"{arr.shape[axis]} (shape {arr.shape}, channel axis {axis})")
    inner = int(np.prod(arr.shape[axis + 1:], dtype=np.int64))
    ch = (np.arange(arr.size, dtype=np.int64) // max(inner, 1)) % arr.shape[axis]
    return arr.reshape(-1).astype(np.int64, copy=False), ch


def _lanes_for(n: int, lanes: int) -> int:
    return max(1, min(lanes, MAX_LANES, n // SYMBOLS_PER_LANE))


def rans_encode(symbols: np.ndarray, tables: SymbolTables, *, channel_axis: int = 1,
                lanes: int = DEFAULT_LANES) -> bytes:
    """The rANS code of integer ``symbols`` (any shape; channel ``c`` along ``channel_axis`` coded
    with row ``c`` of ``tables``). Symbols outside a channel's range are an error: the ``rans``
    codec (``codecs.encode_tensor``) clips a latent to the tables' range before it is coded."""
    sym, ch = _flat(symbols, channel_axis, tables)
    n = sym.size
    if n == 0:
        return b""
    rel = sym - tables.lo[ch]
    width = tables.widths()[ch]
    if (rel < 0).any() or (rel >= width).any():
        k = int(np.flatnonzero((rel < 0) | (rel >= width))[0])
        raise CodecError(f"entropy coding: symbol {int(sym[k])} of channel {int(ch[k])} is outside its table's "
                         f"range [{int(tables.lo[ch[k]])}, {int(tables.hi()[ch[k]])}]")
    k = _lanes_for(n, lanes)
    steps = -(-n // k)
    p = tables.precision
    # per (step, lane): frequency and cumulative start; the padding past the last symbol codes a
    # certain symbol (frequency 2**p, start 0), which leaves a state as it is
    f = np.full(steps * k, 1 << p, np.uint64)
    c = np.zeros(steps * k, np.uint64)
    f[:n] = tables.freqs[ch, rel]
    c[:n] = tables.cum[ch, rel]
    f, c = f.reshape(steps, k), c.reshape(steps, k)
    limit = f << np.uint64(32 - p)  # renormalise while x >= ((L >> p) << 16) * f
    x = np.full(k, _L, np.uint64)
    low = np.empty((steps, k), np.uint16)  # per step, each lane's low word, and whether it was emitted
    emitted = np.empty((steps, k), bool)
    w16, pp = np.uint64(_WORD), np.uint64(p)
    for t in range(steps - 1, -1, -1):
        over = np.greater_equal(x, limit[t], out=emitted[t])
        np.copyto(low[t], x, casting="unsafe")  # the low 16 bits
        x = np.where(over, x >> w16, x)
        q, r = np.divmod(x, f[t])
        x = (q << pp) + r + c[t]
    # the words in the order they were emitted (steps from the last, lanes ascending), reversed: the
    # order the decoder reads them
    out = low[::-1][emitted[::-1]][::-1]
    return x.astype("<u4").tobytes() + out.astype("<u2").tobytes()


def rans_decode(data: bytes | memoryview, shape: Sequence[int], tables: SymbolTables, *, channel_axis: int = 1,
                lanes: int = DEFAULT_LANES, dtype: Any = np.int8) -> np.ndarray:
    """The symbols :func:`rans_encode` coded, as an array of ``shape`` (what the plan says the
    latent is) and ``dtype``. Raises :class:`CodecError` for a stream that is not such a code."""
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if len(shape) == 0 or not -len(shape) <= channel_axis < len(shape) or shape[channel_axis] != tables.lo.shape[0]:
        raise CodecError(f"entropy decoding: a latent of shape {shape} with channel axis {channel_axis} does not "
                         f"fit tables of {tables.lo.shape[0]} channels")
    buf = memoryview(data).cast("B")
    if n == 0:
        if len(buf):
            raise CodecError(f"entropy decoding: {len(buf)} bytes for an empty latent")
        return np.zeros(shape, dtype)
    k = _lanes_for(n, lanes)
    steps = -(-n // k)
    if len(buf) < 4 * k or (len(buf) - 4 * k) % 2:
        raise CodecError(f"entropy decoding: {len(buf)} bytes cannot hold {k} states and whole 16-bit words")
    x = np.frombuffer(buf[:4 * k], "<u4").astype(np.int64)
    words = np.frombuffer(buf[4 * k:], "<u2").astype(np.int64)
    if (x < _L).any():
        raise CodecError("entropy decoding: a final state below 2**16; not an rANS stream")
    axis = channel_axis % len(shape)
    inner = math.prod(shape[axis + 1:])
    n_ch = tables.lo.shape[0]
    ch = np.full(steps * k, n_ch, np.int64)  # the padding past the last symbol: channel n_ch, one certain symbol
    ch[:n] = (np.arange(n, dtype=np.int64) // inner) % shape[axis]
    p = tables.precision
    total = 1 << p
    packed = tables.packed_slots  # one lookup a step: frequency << 32 | bias << 16 | symbol
    row = (ch * total).reshape(steps, k)
    got = np.empty((steps, k), np.int64)
    pos, end = 0, words.size
    mask = total - 1
    for t in range(steps):
        v = packed[row[t] + (x & mask)]
        x = (v >> 32) * (x >> p) + ((v >> 16) & 0xFFFF)
        got[t] = v
        idx = np.flatnonzero(x < _L)
        if idx.size:
            idx = idx[::-1]
            if pos + idx.size > end:
                raise CodecError("entropy decoding: the stream ended before the latent did")
            x[idx] = (x[idx] << _WORD) | words[pos:pos + idx.size]
            pos += idx.size
    if pos != end or (x != _L).any():
        raise CodecError("entropy decoding: the stream does not decode to a latent of this shape under these "
                         "tables (damaged, or made for another plan)")
    out = (got.reshape(-1)[:n] & 0xFFFF) + tables.lo[ch[:n]]
    return out.astype(dtype).reshape(shape)
