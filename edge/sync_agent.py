"""The synchronous facade of :class:`~splitinfer.edge.agent.EdgeAgent`, for programs without
asyncio: the agent lives on an event loop in its own thread; calls wait with timeouts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..splitter.plan import Plan
from .agent import EdgeAgent
from .result import FrameResult

__all__ = ["SyncEdgeAgent"]


class SyncEdgeAgent:
    """A thin synchronous facade: the agent lives on an event loop in its own thread.

    >>> with SyncEdgeAgent("plans/yolo-n", cloud="tcp://10.0.0.5:7000") as agent:   # doctest: +SKIP
    ...     r = agent.infer_sync({"input": frame})
    """

    def __init__(self, plan: Plan | str, cloud: str | None = "auto", **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="splitinfer-edge-loop", daemon=True)
        self._thread.start()
        self.agent: EdgeAgent = self._call(self._make(plan, cloud, kwargs), 60)

    async def _make(self, plan: Plan | str, cloud: str | None, kwargs: dict[str, Any]) -> EdgeAgent:
        return await EdgeAgent(plan, cloud, **kwargs).start()

    def _call(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def infer_sync(self, inputs: Mapping[str, np.ndarray], timeout: float | None = 60.0) -> FrameResult:
        return self._call(self.agent.infer(inputs), timeout)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self.agent.aclose(), 30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> "SyncEdgeAgent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


