"""Cost model speed: CostModel.best per call, for the YOLO-style plan (goal < 50 µs).

    python benchmarks/cost_model_speed.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save, table  # noqa: E402


def main() -> None:
    from splitinfer.models import build
    from splitinfer.splitter import CostModel, split_model

    with tempfile.TemporaryDirectory() as tmp:
        model, x = build("yolo-n", (1, 3, 320, 320))
        plan = split_model(model, Path(tmp) / "p", example_input=x, budget_s=0.2, report=False).plan
        cm = CostModel.from_plan(plan, edge_slowdown=5.0)
        # 8 candidates is the default maximum: also time a model with 8 by repeating entries
        cm8 = CostModel(*(tuple((list(v) * 8)[:8]) for v in (cm.ids, cm.edge_ms, cm.cloud_ms, cm.up_bytes,
                                                             cm.result_bytes, cm.local)))
        rows, out = [], {}
        for label, m in ((f"{len(cm.ids)} candidates", cm), ("8 candidates", cm8)):
            edge = list(m.edge_ms)
            for kw_label, kw in (("plain", {}), ("with per-frame corrections", {"edge_ms": edge, "byte_ratio": 0.25})):
                n = 20000
                reps = timeit.repeat(lambda: m.best(7.5, 30.0, 2.0, **kw), number=n, repeat=7)
                us = statistics.median(reps) / n * 1e6
                rows.append([label, kw_label, us])
                out[f"{label} / {kw_label}"] = us
    table("CostModel.best, microseconds per call (median of 7 x 20000)", ["plan", "call", "µs/call"], rows)
    print(f"goal < 50 µs: worst {max(out.values()):.2f} µs")
    print(f"wrote {save('cost_model_speed', {'us_per_call': out})}")


if __name__ == "__main__":
    main()
