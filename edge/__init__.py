"""splitinfer.edge: the device side. Runs the edge segment, picks the cut per frame from the
live bandwidth estimate, its own timings and the cloud's load, and finishes frames locally when
the cloud is slow or gone. Never imports cloud/."""

from __future__ import annotations

from .agent import EdgeAgent
from .breaker import CircuitBreaker
from .controller import Choice, Controller
from .result import FrameResult
from .runtime import Backend, OrtBackend
from .sync_agent import SyncEdgeAgent

__all__ = ["EdgeAgent", "SyncEdgeAgent", "FrameResult", "Controller", "Choice", "CircuitBreaker", "Backend",
           "OrtBackend"]
