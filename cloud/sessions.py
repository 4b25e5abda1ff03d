"""onnxruntime sessions for cloud segments, created on demand, at most ``max_loaded`` kept
(least recently used goes), on the best execution provider present (TensorRT, CUDA, else CPU)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import onnxruntime as ort

__all__ = ["SessionPool", "best_providers"]

_PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def best_providers(available: Sequence[str] | None = None) -> list[str]:
    """The providers to use, best first, CPU always last."""
    have = set(available if available is not None else ort.get_available_providers())
    chosen = [p for p in _PREFERENCE if p in have]
    return chosen if "CPUExecutionProvider" in chosen else [*chosen, "CPUExecutionProvider"]


class SessionPool:
    """Thread-safe LRU of sessions keyed by (plan hash, candidate id)."""

    def __init__(self, max_loaded: int = 16, *, providers: Sequence[str] | None = None,
                 threads: int | None = None) -> None:
        if max_loaded < 1:
            raise ValueError(f"max_loaded must be >= 1, got {max_loaded}")
        self.max_loaded = max_loaded
        self.providers = list(providers) if providers else best_providers()
        self.threads = threads
        self._sessions: OrderedDict[Hashable, ort.InferenceSession] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0
        self.evictions = 0

    def get(self, key: Hashable, path: str) -> ort.InferenceSession:
        with self._lock:
            sess = self._sessions.get(key)
            if sess is not None:
                self._sessions.move_to_end(key)
                return sess
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if self.threads:
            opts.intra_op_num_threads = self.threads
        sess = ort.InferenceSession(path, opts, providers=self.providers)
        with self._lock:
            self.loads += 1
            self._sessions[key] = sess
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.max_loaded:
                self._sessions.popitem(last=False)
                self.evictions += 1
        return sess

    @property
    def loaded(self) -> int:
        return len(self._sessions)

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()
