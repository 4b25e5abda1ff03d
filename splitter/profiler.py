"""Timing with onnxruntime: whole segments at full optimisation (the real figure) and per-node
costs from ORT's own profiler (at ORT_ENABLE_BASIC, the level where its events keep the ONNX
node names)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
import onnxruntime as ort

from .._types import TensorSpec

__all__ = ["make_session", "random_feeds", "time_session", "node_times", "device_info"]


def make_session(model: bytes | str, *, threads: int | None = None, level: str = "all",
                 profile_prefix: str | None = None,
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> ort.InferenceSession:
    """An onnxruntime session; ``level`` is ``disable``, ``basic``, ``extended`` or ``all``."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model, opts, providers=list(providers))


def random_feeds(specs: Sequence[TensorSpec], seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs: floats uniform in [0, 1) (image-like), integers in [0, 10)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for s in specs:
        shape = (batch, *s.shape[1:]) if batch is not None else s.shape
        if np.dtype(s.dtype).kind == "f":
            feeds[s.name] = rng.random(shape, dtype=np.float32).astype(s.dtype)
        elif s.dtype == "bool":
            feeds[s.name] = rng.random(shape) < 0.5
        else:
            feeds[s.name] = rng.integers(0, 10, shape).astype(s.dtype)
    return feeds


def time_session(sess: ort.InferenceSession, feeds: Mapping[str, np.ndarray], *, warmup: int = 2,
                 min_runs: int = 5, max_runs: int = 50, budget_s: float = 1.0) -> float:
    """Median wall time of ``sess.run`` in ms: at least ``min_runs``, then until ``budget_s``."""
    for _ in range(warmup):
        sess.run(None, dict(feeds))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or (len(times) < max_runs and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        sess.run(None, dict(feeds))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def node_times(model: bytes, feeds: Mapping[str, np.ndarray], *, threads: int | None = None,
               runs: int = 5) -> dict[str, float]:
    """Median time per ONNX node name (ms) from ORT's profiler, at ORT_ENABLE_BASIC."""
    with tempfile.TemporaryDirectory(prefix="splitinfer-prof-") as tmp:
        sess = make_session(model, threads=threads, level="basic", profile_prefix=os.path.join(tmp, "p"))
        for _ in range(runs + 1):
            sess.run(None, dict(feeds))
        path = sess.end_profiling()
        with open(path) as f:
            events: list[dict[str, Any]] = json.load(f)
    per_run: dict[str, list[float]] = {}
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        name = ev["name"][: -len("_kernel_time")]
        per_run.setdefault(name, []).append(float(ev.get("dur", 0)) / 1e3)
    # the first run is a warm-up
    return {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in per_run.items()}


def device_info(role: str, threads: int | None) -> dict[str, Any]:
    """What a profile was measured on."""
    return {
        "role": role,
        "host": platform.node(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": threads or 0,  # 0: onnxruntime's default
        "onnxruntime": ort.__version__,
        "providers": ["CPUExecutionProvider"],
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
