"""splitinfer.cloud: the server side. Loads plans, batches requests per cut, runs cloud segments,
answers with server timings; health, metrics and WebRTC signalling over HTTP. Needs the ``cloud``
extra (aiohttp, prometheus-client). Never imports edge/."""

from __future__ import annotations

from .batcher import Batcher, BatchResult, Busy, DeadlineExceeded
from .service import CloudService, load_tokens
from .sessions import SessionPool, best_providers

__all__ = ["CloudService", "load_tokens", "Batcher", "BatchResult", "Busy", "DeadlineExceeded", "SessionPool",
           "best_providers"]
