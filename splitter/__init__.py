"""The splitter: an ONNX or PyTorch model becomes a verified split plan.

>>> from splitinfer.splitter import split_model, Plan, CostModel      # doctest: +SKIP
>>> result = split_model("yolo.onnx", "plans/yolo", input_shapes={"images": (1, 3, 640, 640)})
>>> plan = Plan.load("plans/yolo")
>>> cm = CostModel.from_plan(plan)
>>> cm.ids[cm.best(bandwidth_mbps=5.0, rtt_ms=30.0)[0]]
'c2'

Never imports edge/, cloud/ or transport/.
"""

from __future__ import annotations

from .add_bottleneck import BottleneckResult, add_bottleneck
from .cost_model import CostModel, select_profile
from .cuts import Cut, cut_from_tensors, find_candidates
from .graph import ModelGraph, analyse
from .loader import LoadedModel, export_torch, load_model, parse_input_shape
from .plan import Candidate, Plan, SegmentRef
from .report import plan_summary, write_report_png
from .split import SPLIT_HOST, SplitResult, profile_plan, split_model
from .verify import VerifyReport, verify_plan

__all__ = [
    "split_model",
    "add_bottleneck",
    "BottleneckResult",
    "SplitResult",
    "profile_plan",
    "SPLIT_HOST",
    "load_model",
    "export_torch",
    "parse_input_shape",
    "LoadedModel",
    "analyse",
    "ModelGraph",
    "Cut",
    "cut_from_tensors",
    "find_candidates",
    "Plan",
    "Candidate",
    "SegmentRef",
    "CostModel",
    "select_profile",
    "verify_plan",
    "VerifyReport",
    "plan_summary",
    "write_report_png",
]
