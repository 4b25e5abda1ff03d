"""A userspace link emulator: a TCP relay with a rate limit, one-way delay, outages, and rates
replayed from a ``time_s,mbps`` trace.

Each direction is one *link* shared by every connection through the relay, as a real uplink is:
a token bucket paces bytes at the current rate, then a delay line holds them for the one-way
delay. Buffers are bounded (``buffer_bytes`` per connection and direction); when full, the relay
stops reading, so TCP's own flow control pushes back on the sender. A rate of 0 (from a trace, or
:meth:`LinkEmulator.outage`) stalls the link: connections stay up, bytes stop.

The kernel has no netem here; for rate limiting in the kernel, see scripts/netns_shaping.sh.

    splitinfer netem --listen 127.0.0.1:9000 --to 127.0.0.1:7000 --rate 20mbit --delay-ms 20
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import csv
import logging
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RateSchedule", "LinkEmulator", "parse_rate", "load_trace"]

log = logging.getLogger(__name__)

_MIN_CHUNK = 1500  # one Ethernet frame
_MAX_CHUNK = 64 << 10
_LEAD_S = 0.05  # how far ahead the link may be booked


def parse_rate(text: str) -> float:
    """``20mbit``, ``500kbit``, ``1.5gbit``, ``8000bit`` or a bare number of Mbit/s -> Mbit/s."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise ValueError(f"rate {text!r}: expected a number with an optional unit, e.g. 20mbit or 500kbit")
    value, prefix, unit = float(m.group(1)), m.group(2), m.group(3)
    if not unit and not prefix:
        return value
    return value * {"": 1e-6, "k": 1e-3, "m": 1.0, "g": 1e3}[prefix]


def load_trace(path: str | Path) -> list[tuple[float, float]]:
    """Read a ``time_s,mbps`` CSV (header optional) into sorted (time, Mbit/s) pairs."""
    rows: list[tuple[float, float]] = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.reader(f)):
            if not row or row[0].strip().startswith("#"):
                continue
            try:
                t, r = float(row[0]), float(row[1])
            except (ValueError, IndexError):
                if i == 0:
                    continue  # the header
                raise ValueError(f"{path}:{i + 1}: expected time_s,mbps, got {row!r}") from None
            if r < 0:
                raise ValueError(f"{path}:{i + 1}: negative rate {r}")
            rows.append((t, r))
    if not rows:
        raise ValueError(f"{path}: no time_s,mbps rows")
    rows.sort()
    return rows


@dataclass
class RateSchedule:
    """Mbit/s over time: a constant, or a trace (a step function) replayed ``speedup`` times
    faster and looped when it ends."""

    points: Sequence[tuple[float, float]]
    speedup: float = 1.0
    loop: bool = True

    def __post_init__(self) -> None:
        self.points = sorted(self.points)
        self._times = [p[0] - self.points[0][0] for p in self.points]

    @classmethod
    def constant(cls, mbps: float) -> "RateSchedule":
        return cls([(0.0, mbps)])

    @property
    def duration(self) -> float:
        """Trace seconds (wall seconds = duration / speedup); 0 for a constant."""
        return self.points[-1][0] - self.points[0][0]

    def rate_at(self, elapsed: float) -> float:
        t = elapsed * self.speedup
        if self.duration > 0 and self.loop:
            # a trace's last sample holds for one mean step before the loop starts again
            period = self.duration + self.duration / max(len(self.points) - 1, 1)
            t = t % period
        i = bisect.bisect_right(self._times, t) - 1
        return self.points[max(i, 0)][1]

    def next_change(self, elapsed: float) -> float:
        """Elapsed (wall) seconds of the next step after ``elapsed`` (inf for a constant)."""
        if self.duration <= 0:
            return float("inf")
        period = self.duration + self.duration / max(len(self.points) - 1, 1)
        t = elapsed * self.speedup
        if not self.loop and t >= self._times[-1]:
            return float("inf")
        base = (t // period) * period if self.loop else 0.0
        i = bisect.bisect_right(self._times, t - base)
        nxt = base + (self._times[i] if i < len(self._times) else period)
        return nxt / self.speedup


class _Link:
    """One direction: a token bucket at the schedule's rate, shared by every connection."""

    def __init__(self, schedule: RateSchedule, delay_s: float, started: float) -> None:
        self.schedule, self.delay_s, self.started = schedule, delay_s, started
        self.override: float | None = None
        self.outage_until = 0.0
        self._lock = asyncio.Lock()
        self._next_free = 0.0  # when the link finishes sending what it has accepted
        self.bytes = 0

    def rate_mbps(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if now < self.outage_until:
            return 0.0
        return self.override if self.override is not None else self.schedule.rate_at(now - self.started)

    def chunk_size(self) -> int:
        rate = self.rate_mbps() * 1e6 / 8
        return int(min(_MAX_CHUNK, max(_MIN_CHUNK, rate * 0.001)))  # ~1 ms of the link per chunk

    async def transmit(self, n: int) -> float:
        """Book ``n`` bytes on the link; returns the time their last byte leaves it.

        The link is booked at most ``_LEAD_S`` ahead of now, so it never idles between chunks
        while a live rate change or outage still takes effect within that lead."""
        async with self._lock:
            t = max(time.monotonic(), self._next_free)
            left = float(n)
            while left > 0:
                rate = self.rate_mbps(t) * 1e6 / 8
                if rate <= 0:  # stalled: time passes, no bytes
                    t += 0.005
                else:
                    step = min(left, rate * 0.02)  # re-read the rate every 20 ms of sending
                    t += step / rate
                    left -= step
                ahead = t - time.monotonic()
                if ahead > _LEAD_S:
                    await asyncio.sleep(ahead - _LEAD_S)
            self._next_free = t
        self.bytes += n
        return t


class LinkEmulator:
    """A TCP relay from ``listen`` to ``target`` through two emulated links (one per direction).

    >>> emu = LinkEmulator(("127.0.0.1", 7000), rate_mbps=20, delay_ms=20)   # doctest: +SKIP
    >>> await emu.start(); port = emu.port                                     # doctest: +SKIP
    """

    def __init__(self, target: tuple[str, int], *, rate_mbps: float | None = None,
                 trace: Sequence[tuple[float, float]] | str | Path | None = None, speedup: float = 1.0,
                 delay_ms: float = 0.0, listen: tuple[str, int] = ("127.0.0.1", 0),
                 buffer_bytes: int = 256 << 10) -> None:
        if (rate_mbps is None) == (trace is None):
            raise ValueError("give exactly one of rate_mbps or trace")
        if isinstance(trace, (str, Path)):
            trace = load_trace(trace)
        self.schedule = RateSchedule.constant(float(rate_mbps)) if trace is None else RateSchedule(trace, speedup)
        self.target, self.listen = target, listen
        self.delay_s = delay_ms / 1e3
        self.buffer_bytes = buffer_bytes
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.up: _Link | None = None  # listen side -> target
        self.down: _Link | None = None  # target -> listen side
        self.port = 0

    async def start(self) -> "LinkEmulator":
        now = time.monotonic()
        self.up = _Link(self.schedule, self.delay_s, now)
        self.down = _Link(self.schedule, self.delay_s, now)
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1])
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    # ---------------------------------------------------------------- control
    def restart_schedule(self) -> None:
        """Start the schedule (trace) again from its beginning, now: e.g. when the measured
        traffic begins, so runs that start up at different speeds see the same trace."""
        now = time.monotonic()
        for link in (self.up, self.down):
            if link is not None:
                link.started = now

    def set_rate(self, mbps: float | None) -> None:
        """Pin both directions to ``mbps`` (None: back to the schedule)."""
        for link in (self.up, self.down):
            if link is not None:
                link.override = mbps

    def outage(self, seconds: float) -> None:
        """No bytes cross, either way, for ``seconds`` from now (connections stay open)."""
        until = time.monotonic() + seconds
        for link in (self.up, self.down):
            if link is not None:
                link.outage_until = until

    def rate_mbps(self) -> float:
        return self.up.rate_mbps() if self.up else 0.0

    # ---------------------------------------------------------------- relay
    async def _accept(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self.up is not None and self.down is not None
        self._tasks.add(task)
        self._writers.add(w)
        try:
            tr, tw = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("netem: cannot reach %s:%s: %s", *self.target, exc)
            w.close()
            self._writers.discard(w)
            self._tasks.discard(task)
            return
        self._writers.add(tw)
        try:
            await asyncio.gather(self._pipe(r, tw, self.up), self._pipe(tr, w, self.down))
        except asyncio.CancelledError:
            pass  # the relay is closing; this is the connection's own top-level task
        finally:
            for x in (w, tw):
                x.close()
                self._writers.discard(x)
            self._tasks.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link) -> None:
        queue: deque[tuple[float, bytes]] = deque()
        held = 0
        space = asyncio.Event()
        space.set()
        ready = asyncio.Event()
        done = False

        async def deliver() -> None:
            nonlocal held
            while True:
                while not queue:
                    if done:
                        return
                    ready.clear()
                    await ready.wait()
                at, chunk = queue[0]
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                queue.popleft()
                held -= len(chunk)
                space.set()
                dst.write(chunk)
                await dst.drain()

        writer = asyncio.ensure_future(deliver())
        try:
            while True:
                await space.wait()
                chunk = await src.read(link.chunk_size())
                if not chunk:
                    break
                left = await link.transmit(len(chunk))
                queue.append((left + link.delay_s, chunk))
                held += len(chunk)
                if held >= self.buffer_bytes:
                    space.clear()
                ready.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            done = True
            ready.set()
            with contextlib.suppress(Exception):
                await writer
            with contextlib.suppress(Exception):
                if dst.can_write_eof():
                    dst.write_eof()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=2.0)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def __aenter__(self) -> "LinkEmulator":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
