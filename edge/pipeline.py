"""The frame pipeline: a source paced like a camera, at most ``max_inflight`` frames at once
(backpressure), results in order, a plain source pulled on its own low-priority thread."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import SourceError, SplitinferError

__all__ = ["first_tick", "pipeline"]

F = TypeVar("F")
R = TypeVar("R")


async def pipeline(process: Callable[[F, float], Awaitable[R]], frames: Iterable[F] | AsyncIterable[F], *,
                   max_inflight: int, fps: float | None = None, clock: float | None = None) -> AsyncIterator[R]:
    """``process(frame, captured)`` for every frame, results in order; frame n+1 starts while
    frame n is still in flight, at most ``max_inflight`` at a time. With ``fps`` the source is
    paced like a camera and ``captured`` is a frame's scheduled capture (``time.perf_counter``),
    so the time it waited for a free slot (a device that cannot keep the rate) is latency too.
    With ``clock`` too (Unix seconds) frames are captured at ``clock + k / fps`` for whole ``k``,
    from the first such instant on (:func:`first_tick`): cameras on one clock, each with its own
    offset, keep their frames apart where they share a cloud.
    A source that fails ends the results with a ``SourceError`` after the frames already taken."""
    if clock is not None and not (fps and math.isfinite(clock)):
        raise SplitinferError(f"a frame clock needs a finite time and a frame rate; got clock={clock} and fps={fps}")
    pending: deque[asyncio.Task[R]] = deque()
    sem = asyncio.Semaphore(max_inflight)
    done = asyncio.Event()
    ready = asyncio.Event()
    wait = 0.0 if clock is None else first_tick(clock, fps, time.time()) - time.time()  # type: ignore[arg-type]
    start, start_pc = time.monotonic() + wait, time.perf_counter() + wait
    failed: list[BaseException] = []

    async def produce() -> None:
        k = 0
        try:
            async for frame in _aiter(frames):
                if fps:
                    delay = start + k / fps - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                captured = time.perf_counter() if not fps else min(start_pc + k / fps, time.perf_counter())
                await sem.acquire()
                task = asyncio.ensure_future(process(frame, captured))
                task.add_done_callback(lambda _: sem.release())
                pending.append(task)
                k += 1
                ready.set()
        except Exception as exc:  # the source failed: frames taken get their results, then the error
            failed.append(exc)
        finally:
            done.set()
            ready.set()

    producer = asyncio.ensure_future(produce())
    try:
        while True:
            while not pending and not done.is_set():
                ready.clear()
                await ready.wait()
            if not pending:
                break
            yield await pending.popleft()
        await producer
        if failed:
            exc = failed[0]
            if isinstance(exc, SplitinferError):
                raise exc
            raise SourceError(f"the frame source failed: {type(exc).__name__}: {exc}") from exc
    finally:
        producer.cancel()
        for t in pending:
            t.cancel()


def first_tick(clock: float, fps: float, now: float) -> float:
    """The first instant ``clock + k / fps`` (whole ``k``) at or after ``now`` (Unix seconds)."""
    return clock + math.ceil((now - clock) * fps) / fps


async def _aiter(frames: Any) -> AsyncIterator[Any]:
    """The frames of an async or a plain iterable. A plain one (a decoder, a renderer) is pulled on
    its own thread, one frame at a time: making a frame never stalls the frames in flight. The
    next frame is made as soon as the last is taken, while that one is in flight, so the thread
    runs at the lowest priority (:func:`_yield_to_frames`)."""
    if hasattr(frames, "__aiter__"):
        async for f in frames:
            yield f
        return
    it, end = iter(frames), object()
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(1, thread_name_prefix="splitinfer-source", initializer=_yield_to_frames)
    try:
        while (f := await loop.run_in_executor(pool, next, it, end)) is not end:
            yield f
    finally:  # a source stuck in its next frame must not hold the loop up
        pool.shutdown(wait=False)


def _yield_to_frames() -> None:
    """Make the calling thread (the source's) the process's lowest priority, where the OS allows
    it per thread (Linux: a thread's nice value is its own). A device with little CPU (a CPU quota
    standing for one, 0.1 core) made the next frame at equal priority beside the frame in flight:
    that frame's encode and send shared the quota with the renderer. Frames are made a whole frame
    interval ahead, so the renderer only needs what the frames in flight leave."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    except OSError:  # a sandbox that forbids it: the source keeps the process's priority
        pass
