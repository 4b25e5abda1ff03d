"""Helpers shared by the benchmark scripts: where results go, a rich table, machine facts."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    import onnxruntime as ort

    return {"host": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "onnxruntime": ort.__version__}


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2, default=str) + "\n")
    return path


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None without matplotlib (plots are optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    for c in columns:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*(f"{x:.3f}" if isinstance(x, float) else str(x) for x in r))
    Console(width=200).print(t)


def cloud_serve(plan_dir: Path, preexec_fn: Callable[[], None] | None = None,
                threads: int | None = None) -> tuple[subprocess.Popen, int]:
    """``splitinfer cloud serve PLAN`` on loopback (no zeroconf), started: the process and its edge port."""
    proc = subprocess.Popen([sys.executable, "-m", "splitinfer", "cloud", "serve", str(plan_dir), "--listen",
                             "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-advertise",
                             *(["--threads", str(threads)] if threads else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=preexec_fn)
    text = ""
    while "serving" not in text:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            proc.kill()
            raise RuntimeError(f"cloud serve {plan_dir} exited before serving: {text[-500:]}")
        text += line
    return proc, int(re.search(r"edge: tcp://127.0.0.1:(\d+)", text).group(1))  # type: ignore[union-attr]
