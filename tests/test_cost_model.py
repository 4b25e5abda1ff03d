"""The cost model: the formula, the choice at the extremes, per-frame overrides, profile choice."""

from __future__ import annotations

import pytest

from splitinfer import PlanError
from splitinfer.splitter import CostModel, Plan, profile_plan, select_profile


def test_formula_by_hand(yolo_plan):
    plan = Plan.load(yolo_plan)
    cm = CostModel.from_plan(plan, edge_slowdown=4.0, cloud_speedup=2.0)
    prof = plan.profiles["split-host"]["candidates"]
    pred = cm.predict(10.0, rtt_ms=30.0, queue_ms=5.0)
    for i, c in enumerate(plan.candidates):
        e = prof[c.id]["edge_ms"] * 4.0
        if c.local:
            want = e
        else:
            want = e + 30.0 + 5.0 + c.cut_bytes * 8 / 10e3 + prof[c.id]["cloud_ms"] / 2.0
        assert pred[i] == pytest.approx(want)


def test_choice_moves_with_bandwidth(yolo_plan):
    cm = CostModel.from_plan(Plan.load(yolo_plan), edge_slowdown=20.0, cloud_speedup=10.0)
    slow, _ = cm.best(0.01, rtt_ms=20.0)
    fast, _ = cm.best(1e6, rtt_ms=0.0)
    assert cm.ids[slow] == "edge"
    assert cm.ids[fast] != "edge"
    # a bigger codec ratio for every candidate can only make sending dearer
    base = cm.predict(5.0, 10.0)
    dearer = cm.predict(5.0, 10.0, byte_ratio=2.0)
    assert all(d >= b for d, b in zip(dearer, base))
    # downlink charged only when given
    assert cm.predict(5.0, downlink_mbps=1.0)[0] > cm.predict(5.0)[0]


def test_measured_corrections_override_the_profile(yolo_plan):
    cm = CostModel.from_plan(Plan.load(yolo_plan))
    n = len(cm.ids)
    slow_edge = [1e6 if not local else 1e6 for local in cm.local]
    i, _ = cm.best(100.0, edge_ms=[0.0 if k == 0 else v for k, v in enumerate(slow_edge)])
    assert i == 0  # all-cloud: the only candidate without edge time
    i, _ = cm.best(100.0, cloud_ms=[1e6] * n)
    assert cm.ids[i] == "edge"


def test_profile_selection(plan_copy):
    plan = Plan.load(plan_copy)
    assert select_profile(plan, "edge")[0] == "split-host"
    profile_plan(plan, role="edge", device="cam-1", budget_s=0.01)
    plan = Plan.load(plan_copy)
    assert select_profile(plan, "edge")[0] == "cam-1"
    assert select_profile(plan, "cloud")[0] == "split-host"
    cm = CostModel.from_plan(plan, edge_slowdown=100.0)  # slowdown only scales the split host
    edge_i = cm.ids.index("edge")
    assert cm.edge_ms[edge_i] == pytest.approx(plan.profiles["cam-1"]["candidates"]["edge"]["edge_ms"])
    with pytest.raises(PlanError, match="no profile named 'nope'"):
        select_profile(plan, "edge", "nope")


def test_a_plan_split_without_profiling_is_priced_from_flops(tmp_path, chain_onnx):
    """`split --no-profile` then `edge run`: the cost model falls back to FLOPs, not an error."""
    from splitinfer.splitter import CostModel, split_model

    plan = split_model(chain_onnx, tmp_path / "p", profile=False, verify=False, report=False).plan
    assert not plan.profiles
    cm = CostModel.from_plan(plan, edge_slowdown=4)
    whole = next(i for i, c in enumerate(plan.candidates) if c.local)
    assert cm.edge_ms[whole] == pytest.approx(4 * plan.candidates[whole].flops_edge / 1e7)
    assert all(v >= 0 for v in cm.cloud_ms)
