"""How the edge runs ONNX segments: a small backend interface, onnxruntime behind it (CPU, or
CUDA/TensorRT execution providers where present), so a native TensorRT backend can join later."""

from __future__ import annotations

import abc
import os
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["Backend", "OrtBackend"]

# per segment file, the fastest run of it in this process (see OrtBackend's emulate_slowdown)
_FASTEST: dict[str, float] = {}


class Backend(abc.ABC):
    """Runs one ONNX model file."""

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """All outputs by name."""

    @property
    @abc.abstractmethod
    def input_names(self) -> list[str]: ...


class OrtBackend(Backend):
    """onnxruntime at full graph optimisation; providers best first (TensorRT, CUDA, CPU)."""

    def __init__(self, path: str, *, providers: Sequence[str] | None = None, threads: int | None = None,
                 emulate_slowdown: float = 1.0) -> None:
        import onnxruntime as ort

        # > 1 stands a faster machine in for a slower device (demos, tests on one machine): each run
        # takes slowdown x the fastest run any session of this segment has made in this process (a
        # session's own fastest of its first few runs is too slow, and its device sped up as it
        # ran: a test's agent ran at 0.63x the time a probe had measured). Not this run's own
        # time, nor the fastest of a few recent ones: the device stood for is dedicated and runs at one speed,
        # and a run slowed by something else on this machine (a cloud or a link emulator in the same
        # process, a CPU quota's throttling) would otherwise be slowed `slowdown` times over, for as
        # long as it stayed among the recent runs. A real device needs no such thing; for a faithful
        # CPU limit use a cgroup quota instead (benchmarks/edge_traces.py).
        self.emulate_slowdown = max(1.0, emulate_slowdown)
        self._key = os.path.realpath(path)
        self._cold = True
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
        have = ort.get_available_providers()
        chosen = [p for p in (providers or ("TensorrtExecutionProvider", "CUDAExecutionProvider",
                                            "CPUExecutionProvider")) if p in have] or ["CPUExecutionProvider"]
        self._sess = ort.InferenceSession(path, opts, providers=chosen)
        self._outputs = [o.name for o in self._sess.get_outputs()]
        self._lock = threading.Lock()  # one run at a time per session on a small device

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self._sess.get_inputs()]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            t = time.perf_counter()
            out = dict(zip(self._outputs, self._sess.run(self._outputs, dict(feeds))))
            if self.emulate_slowdown > 1.0:
                took = time.perf_counter() - t
                if self._cold:  # the first run loads and allocates: slowed, but not a steady time
                    self._cold = False
                    time.sleep((self.emulate_slowdown - 1.0) * took)
                else:
                    fastest = _FASTEST[self._key] = min(_FASTEST.get(self._key, took), took)
                    time.sleep(max(0.0, self.emulate_slowdown * fastest - took))
            return out
