"""Dynamic batching for one cut: requests for the same (plan, candidate) are stacked along the
batch dimension, up to ``max_batch_size`` requests, waiting at most ``max_queue_delay`` after the
first one arrived (Triton's two knobs). The model runs in a worker thread so the event loop stays
free; every caller gets its own rows back, or the error that hit the batch.

A request that arrives alone, when nothing else arrived while the previous batch ran, is run at
once instead of waiting for company that is not coming (one client gets no added latency).

The queue is bounded: when ``max_queue`` requests wait, :meth:`Batcher.submit` raises
:class:`Busy` at once, so the edge can finish the frame itself instead of waiting ever longer.
A request whose deadline passes while it waits is answered with :class:`DeadlineExceeded` and
never computed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Batcher", "BatchResult", "Busy", "DeadlineExceeded", "DEFAULT_MAX_BATCH_SIZE",
           "DEFAULT_MAX_QUEUE_DELAY_MS", "DEFAULT_MAX_QUEUE"]

DEFAULT_MAX_BATCH_SIZE = 8  # requests stacked into one run
DEFAULT_MAX_QUEUE_DELAY_MS = 2.0  # longest wait for a batch to fill, after its first request
DEFAULT_MAX_QUEUE = 32  # waiting requests per cut before "busy"

Feeds = Mapping[str, np.ndarray]
RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class Busy(Exception):
    """The cut's queue is full."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before it could run."""


@dataclass
class BatchResult:
    outputs: dict[str, np.ndarray]
    queue_s: float
    compute_s: float
    batch_size: int


@dataclass
class _Pending:
    feeds: Feeds
    rows: int
    enqueued: float
    deadline: float | None
    future: asyncio.Future[BatchResult] = field(repr=False)


class Batcher:
    def __init__(self, run: RunFn, executor: concurrent.futures.Executor, *, batchable: bool = True,
                 max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, max_queue_delay_ms: float = DEFAULT_MAX_QUEUE_DELAY_MS,
                 max_queue: int = DEFAULT_MAX_QUEUE, on_depth: Callable[[int], None] | None = None,
                 max_rows: int | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1:
            raise ValueError("max_batch_size and max_queue must be >= 1")
        self.run, self.executor = run, executor
        self.max_batch_size = max_batch_size if batchable else 1
        self.max_queue_delay_s = max_queue_delay_ms / 1e3
        self.max_queue = max_queue
        self.max_rows = max_rows or self.max_batch_size  # rows stacked into one run (a bigger request runs alone)
        self._inflight: list[_Pending] = []  # the batch being run
        self.on_depth = on_depth or (lambda depth: None)
        self._pending: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._running = False
        self._company = 0  # requests that arrived while a batch ran or others waited
        self.batches = 0

    @property
    def depth(self) -> int:
        return len(self._pending)

    async def submit(self, feeds: Feeds, *, deadline: float | None = None) -> BatchResult:
        """Queue one request (``feeds`` with a leading batch dimension); ``deadline`` is a
        ``time.monotonic()`` instant."""
        if self._closing:
            raise Busy("the service is shutting down")
        if len(self._pending) >= self.max_queue:
            raise Busy(f"{len(self._pending)} requests already wait for this cut (max_queue {self.max_queue})")
        if self._task is None:
            self._task = asyncio.create_task(self._loop())
        fut: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        rows = int(next(iter(feeds.values())).shape[0]) if feeds else 1
        if self._running or len(self._pending) > 0:
            self._company += 1  # someone else wants this cut too: batches are worth waiting for
        self._pending.append(_Pending(feeds, rows, time.monotonic(), deadline, fut))
        self.on_depth(len(self._pending))
        self._arrived.set()
        return await fut

    async def _loop(self) -> None:
        while True:
            while not self._pending:
                if self._closing:
                    return
                self._arrived.clear()
                await self._arrived.wait()
            # Wait for the batch to fill, at most max_queue_delay after its first request; but a
            # lone request is not held back when nothing else came while the last batch ran (one
            # client, or a quiet cut: waiting would only add latency).
            first = self._pending[0].enqueued
            lonely = len(self._pending) == 1 and self._company == 0
            while len(self._pending) < self.max_batch_size and not self._closing and not lonely:
                left = first + self.max_queue_delay_s - time.monotonic()
                if left <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            take, rows = 0, 0
            while take < min(self.max_batch_size, len(self._pending)) and (
                    take == 0 or rows + self._pending[take].rows <= self.max_rows):
                rows += self._pending[take].rows
                take += 1
            batch, self._pending = self._pending[:take], self._pending[take:]
            self.on_depth(len(self._pending))
            now = time.monotonic()
            live = []
            for p in batch:
                if p.future.done():
                    continue
                if p.deadline is not None and now > p.deadline:
                    p.future.set_exception(DeadlineExceeded(
                        f"deadline passed {1e3 * (now - p.deadline):.1f} ms before the request could run"))
                else:
                    live.append(p)
            if live:
                await self._run_batch(live)

    async def _run_batch(self, batch: list[_Pending]) -> None:
        start = time.monotonic()
        self._running = True
        self._company = len(batch) - 1
        feeds = batch[0].feeds if len(batch) == 1 else {
            k: np.concatenate([p.feeds[k] for p in batch], 0) for k in batch[0].feeds}
        loop = asyncio.get_running_loop()
        self._inflight = batch
        try:
            outputs = await loop.run_in_executor(self.executor, self.run, dict(feeds))
        except Exception as exc:
            self._running = False
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        finally:
            self._inflight = []
        compute = time.monotonic() - start
        self._running = False
        self.batches += 1
        row = 0
        for p in batch:
            part = {k: v[row:row + p.rows] for k, v in outputs.items()}
            row += p.rows
            if not p.future.done():
                p.future.set_result(BatchResult(part, start - p.enqueued, compute, len(batch)))

    def abandon(self, reason: str) -> None:
        """Fail every request now, queued or running, with :class:`Busy` (``reason``): for a shutdown
        whose drain ran out of time. A run in progress finishes (or is terminated) unheard."""
        self._closing = True
        for p in [*self._pending, *self._inflight]:
            if not p.future.done():
                p.future.set_exception(Busy(reason))
        self._pending.clear()
        self._arrived.set()

    def cancel(self) -> None:
        """Stop the batching loop now (after :meth:`abandon`, when a run outlived even that)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def aclose(self, *, drain: bool = True) -> None:
        """Stop taking requests; run what is queued (``drain``) or fail it with Busy."""
        self._closing = True
        if not drain:
            for p in self._pending:
                if not p.future.done():
                    p.future.set_exception(Busy("the service is shutting down"))
            self._pending.clear()
        self._arrived.set()
        if self._task is not None:
            await asyncio.shield(self._task)  # a caller that stops waiting does not cancel the loop
