"""The device and its queue: every segment the edge runs (a frame's edge segment, a fallback, a
hedge, a race) goes through one worker thread, as on a small device with one accelerator, and
the queue knows how much work is ahead of a new job. Jobs run oldest frame first: results leave
in order, so a late frame's hedge goes ahead of newer frames' work (which would wait for it
anyway). The controller adds the wait to every candidate that needs the device; the hedge starts
only when the device would finish sooner than the cloud is expected to answer; optional work (a
hedge, a race) is refused while the queue is full, so fallbacks never pile onto an overloaded
device. A job cancelled while queued never runs; a segment cancelled while it runs (a hedge the
cloud beat) is stopped where it is.

>>> dev = Device(threads=1)                                                        # doctest: +SKIP
>>> out, ms = await dev.run("segments/c1_edge.onnx", feeds, expect_ms=40.0, priority=7)  # doctest: +SKIP
>>> dev.wait_ms(priority=8)   # what a job for frame 8 submitted now would wait       # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from .runtime import Abort, Backend, OrtBackend

__all__ = ["Device", "BACKGROUND"]

T = TypeVar("T")
BACKGROUND = float("inf")  # the priority of work no frame waits for (measuring a JPEG's size)


class Device:
    """One worker thread running ONNX segments (and device-side encoding), oldest frame first.

    ``max_jobs``: how many jobs may be queued or running before optional work is refused
    (:meth:`has_room`); frames themselves are bounded by the agent's pipeline."""

    def __init__(self, *, threads: int | None = None, emulate_slowdown: float = 1.0, max_jobs: int = 3,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.threads, self.emulate_slowdown = threads, emulate_slowdown
        self.max_jobs = max_jobs
        self.clock = clock
        self._backends: dict[str, Backend] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Callable[[], None]]] = []  # (priority, seq, job)
        self._jobs: dict[int, tuple[float, float, float | None]] = {}  # seq -> (priority, expected ms, started)
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="splitinfer-edge", daemon=True)
        self._thread.start()

    def backend(self, path: str) -> Backend:
        b = self._backends.get(path)
        if b is None:
            b = self._backends[path] = OrtBackend(path, threads=self.threads, emulate_slowdown=self.emulate_slowdown)
        return b

    # ------------------------------------------------------------------ the queue
    def wait_ms(self, priority: float = BACKGROUND) -> float:
        """How long a job of ``priority`` submitted now would wait before it starts: what is left
        of the running job (by its expected time) and every queued job ahead of it (older frames;
        the same frame's earlier jobs)."""
        now = self.clock()
        with self._lock:
            jobs = list(self._jobs.values())
        total = 0.0
        for prio, expected, started in jobs:
            if started is not None:
                total += max(expected - (now - started) * 1e3, 0.0)
            elif prio <= priority:
                total += expected
        return total

    @property
    def jobs(self) -> int:
        return len(self._jobs)

    def has_room(self) -> bool:
        """Whether optional work (a hedge, a race) may be queued now."""
        return len(self._jobs) < self.max_jobs

    async def call(self, fn: Callable[[], T], expect_ms: float, priority: float = BACKGROUND,
                   abort: Callable[[], None] | None = None) -> T:
        """Run ``fn`` on the device's thread, queued by ``priority`` (a frame's index: lower first)
        and accounted as ``expect_ms``. Cancelled while queued, the job never runs; cancelled
        while running, ``abort`` (where given) is called to stop it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        seq = next(self._seq)

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                (fut.set_result if ok else fut.set_exception)(value)

        def job() -> None:
            with self._lock:
                if seq not in self._jobs:  # the caller went away before it started
                    return
                prio, expected, _ = self._jobs[seq]
                self._jobs[seq] = (prio, expected, self.clock())
            try:
                value, ok = fn(), True
            except BaseException as exc:  # handed to the caller
                value, ok = exc, False
            with self._lock:
                self._jobs.pop(seq, None)
            loop.call_soon_threadsafe(settle, ok, value)

        with self._wake:
            if self._closed:
                raise RuntimeError("the device is shut down")
            self._jobs[seq] = (priority, max(expect_ms, 0.0), None)
            heapq.heappush(self._heap, (priority, seq, job))
            self._wake.notify()
        try:
            return await fut
        finally:
            with self._lock:
                job_state = self._jobs.get(seq)
                if job_state is not None and job_state[2] is None:  # cancelled while queued: it will not run
                    self._jobs.pop(seq, None)
            if job_state is not None and job_state[2] is not None and abort is not None:
                abort()  # cancelled while running: what is left of it would only hold up the next jobs

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._heap and not self._closed:
                    self._wake.wait()
                if not self._heap:
                    return
                _, _, job = heapq.heappop(self._heap)
            job()

    async def run(self, path: str, feeds: Mapping[str, np.ndarray], expect_ms: float = 0.0,
                  priority: float = BACKGROUND) -> tuple[dict[str, np.ndarray], float]:
        """A segment's outputs and the run's own time in ms (not the wait for the thread).
        Cancelled while it runs (a hedge the cloud beat), the run is stopped where it is."""
        stop = Abort()

        def run() -> tuple[dict[str, np.ndarray], float]:
            t = time.perf_counter()
            out = self.backend(path).run(feeds, stop)
            return out, (time.perf_counter() - t) * 1e3

        return await self.call(run, expect_ms, priority, abort=stop)

    def shutdown(self) -> None:
        """Run what is queued, then stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
