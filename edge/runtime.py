"""How the edge runs ONNX segments: a small backend interface, onnxruntime behind it (CPU, or
CUDA/TensorRT execution providers where present), so a native TensorRT backend can join later."""

from __future__ import annotations

import abc
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

__all__ = ["Abort", "Backend", "OrtBackend"]

# per segment file, the fastest run of it in this process (see OrtBackend's emulate_slowdown)
_FASTEST: dict[str, float] = {}


class Abort:
    """Stops a run in progress, from any thread: a hedge the cloud beat need not finish on the
    device (on a small device its remaining work is what the next frames wait for). A backend
    that can stop mid-run registers how (onnxruntime: ``RunOptions.terminate``, checked between
    nodes); one that cannot finishes the run. A run that was stopped raises :class:`Aborted`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    def __call__(self) -> None:
        with self._lock:
            self._event.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def on_abort(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the run is stopped (now, if it already was)."""
        with self._lock:
            if not self._event.is_set():
                self._hooks.append(hook)
                return
        hook()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early when stopped; whether it was."""
        return self._event.wait(max(seconds, 0.0))


class Aborted(Exception):  # noqa: N818 - a signal between the device's thread and its queue, never raised to users
    """The run was stopped by its :class:`Abort` (its caller no longer wants the result)."""


class Backend(abc.ABC):
    """Runs one ONNX model file."""

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray], abort: Abort | None = None) -> dict[str, np.ndarray]:
        """All outputs by name. ``abort``: stops the run early where the backend can."""

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

    def run(self, feeds: Mapping[str, np.ndarray], abort: Abort | None = None) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        with self._lock:
            opts = None
            if abort is not None:
                opts = ort.RunOptions()
                abort.on_abort(lambda: setattr(opts, "terminate", True))
                if abort.is_set:
                    raise Aborted("stopped before it started")
            t = time.perf_counter()
            try:
                out = dict(zip(self._outputs, self._sess.run(self._outputs, dict(feeds), opts)))
            except Exception as exc:
                if abort is not None and abort.is_set:
                    raise Aborted("stopped while running") from exc
                raise
            if self.emulate_slowdown > 1.0:
                took = time.perf_counter() - t
                if self._cold:  # the first run loads and allocates: slowed, but not a steady time
                    self._cold = False
                    pause = (self.emulate_slowdown - 1.0) * took
                else:
                    fastest = _FASTEST[self._key] = min(_FASTEST.get(self._key, took), took)
                    pause = max(0.0, self.emulate_slowdown * fastest - took)
                if abort is None:
                    time.sleep(pause)
                elif abort.wait(pause):
                    raise Aborted("stopped while running")
            return out
