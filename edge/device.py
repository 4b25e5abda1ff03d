"""The device and its queue: every segment the edge runs (a frame's edge segment, a fallback, a
hedge, a race) goes through one worker thread, as on a small device with one accelerator, and
the queue knows how much work is ahead of a new job. The controller adds that wait to every
candidate that needs the device; the hedge starts only when the device would finish sooner than
the cloud is expected to answer; optional work (a hedge, a race) is refused while the queue is
full, so fallbacks never pile onto an overloaded device.

>>> dev = Device(threads=1)                                    # doctest: +SKIP
>>> out, ms = await dev.run("segments/c1_edge.onnx", feeds, expect_ms=40.0)   # doctest: +SKIP
>>> dev.wait_ms()   # what a job submitted now would wait before it starts   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from .runtime import Backend, OrtBackend

__all__ = ["Device"]

T = TypeVar("T")


class Device:
    """One worker thread running ONNX segments (and the device-side encoding), with its queue.

    ``max_jobs``: how many jobs may be queued or running before optional work is refused
    (:meth:`has_room`); frames themselves are bounded by the agent's pipeline."""

    def __init__(self, *, threads: int | None = None, emulate_slowdown: float = 1.0, max_jobs: int = 3,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.threads, self.emulate_slowdown = threads, emulate_slowdown
        self.max_jobs = max_jobs
        self.clock = clock
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="splitinfer-edge")
        self._backends: dict[str, Backend] = {}
        self._jobs: dict[int, tuple[float, float | None]] = {}  # id -> (expected ms, started at)
        self._ids = itertools.count()
        self.refused = 0  # optional jobs refused for a full queue

    def backend(self, path: str) -> Backend:
        b = self._backends.get(path)
        if b is None:
            b = self._backends[path] = OrtBackend(path, threads=self.threads, emulate_slowdown=self.emulate_slowdown)
        return b

    # ------------------------------------------------------------------ the queue
    def wait_ms(self) -> float:
        """How long a job submitted now would wait before it starts: what is left of the running
        job (by its expected time) plus every queued job's expected time."""
        now = self.clock()
        total = 0.0
        for expected, started in self._jobs.values():
            total += expected if started is None else max(expected - (now - started) * 1e3, 0.0)
        return total

    @property
    def jobs(self) -> int:
        return len(self._jobs)

    def has_room(self) -> bool:
        """Whether optional work (a hedge, a race) may be queued now."""
        return len(self._jobs) < self.max_jobs

    async def call(self, fn: Callable[[], T], expect_ms: float) -> T:
        """Run ``fn`` on the device's thread, accounted in the queue as ``expect_ms``."""
        jid = next(self._ids)
        self._jobs[jid] = (max(expect_ms, 0.0), None)

        def job() -> T:
            self._jobs[jid] = (self._jobs[jid][0], self.clock())
            return fn()

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, job)
        finally:
            self._jobs.pop(jid, None)

    async def run(self, path: str, feeds: Mapping[str, np.ndarray],
                  expect_ms: float = 0.0) -> tuple[dict[str, np.ndarray], float]:
        """A segment's outputs and the run's own time in ms (not the wait for the thread)."""
        def run() -> tuple[dict[str, np.ndarray], float]:
            t = time.perf_counter()
            out = self.backend(path).run(feeds)
            return out, (time.perf_counter() - t) * 1e3

        return await self.call(run, expect_ms)

    def submit_now(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the device's thread and wait for it (start-up, outside any loop)."""
        return self._executor.submit(fn, *args).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
