"""What a person reads about a plan: a summary (for tables and ``--json``) and ``report.png``,
the predicted latency of every candidate against uplink bandwidth with the best envelope."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cost_model import CostModel
from .wire_settings import Setting, codec_settings, wire_ratios
from .plan import Plan

__all__ = ["plan_summary", "write_report_png", "TABLE_BANDWIDTHS_MBPS", "DEFAULT_RTT_MS"]

TABLE_BANDWIDTHS_MBPS: tuple[float, ...] = (1.0, 5.0, 20.0, 100.0)
DEFAULT_RTT_MS = 20.0  # a typical LTE round trip, for predictions in reports


def _cost_model(plan: Plan, edge_slowdown: float) -> CostModel | None:
    try:
        return CostModel.from_plan(plan, edge_slowdown=edge_slowdown)
    except Exception:
        return None  # a plan split without profiling has no times


def _label(setting: Setting | None) -> str | None:
    return None if setting is None else setting[0] + (f" q{setting[1]}" if setting[1] is not None else "")


def plan_summary(plan: Plan, *, edge_slowdown: float = 5.0, rtt_ms: float = DEFAULT_RTT_MS,
                 bandwidths_mbps: Sequence[float] = TABLE_BANDWIDTHS_MBPS, codec: str = "auto") -> dict[str, Any]:
    """A JSON-ready summary: the model, and each candidate's cut, raw bytes, bytes on the wire per
    measured codec setting (with fidelity), FLOPs, times, and predictions with the cut in ``codec``
    (``auto``: each candidate's setting as the edge agent picks it by default)."""
    cm = _cost_model(plan, edge_slowdown)
    ratios = wire_ratios(plan, codec)
    settings = codec_settings(plan, codec)
    preds = {bw: cm.predict(bw, rtt_ms, byte_ratio=ratios) for bw in bandwidths_mbps} if cm else {}
    best = {bw: cm.ids[int(np.argmin(p))] for bw, p in preds.items()} if cm else {}
    rows = []
    for i, c in enumerate(plan.candidates):
        rows.append({
            "id": c.id, "kind": c.kind,
            "cut": [t.name for t in c.cut], "cut_shapes": [list(t.shape) for t in c.cut],
            "bytes": c.cut_bytes, "sends": round(c.cut_bytes * ratios[i]) if not c.local else 0,
            "sends_codec": _label(settings[i]),
            "wire": [r.to_json() for r in c.wire],
            "flops_edge": c.flops_edge, "flops_cloud": c.flops_cloud,
            "edge_ms": cm.edge_ms[i] if cm else None, "cloud_ms": cm.cloud_ms[i] if cm else None,
            "cloud_batch_dynamic": bool(c.cloud and c.cloud.batch_dynamic),
            "predicted_ms": {str(bw): round(p[i], 3) for bw, p in preds.items()},
        })
    return {
        "plan": str(plan.path), "plan_hash": plan.hash, "format_version": plan.manifest["format_version"],
        "model": plan.manifest["model"],
        "inputs": [t.to_json() for t in plan.inputs], "outputs": [t.to_json() for t in plan.outputs],
        "profiles": {k: {"role": v.get("role"), "host": v.get("host"), "whole_ms": v.get("whole_ms"),
                         "measured_at": v.get("measured_at")} for k, v in plan.profiles.items()},
        "assumptions": {"edge_slowdown": edge_slowdown, "rtt_ms": rtt_ms, "codec": codec},
        "wire_samples": plan.manifest.get("wire_samples"),
        "best_at_mbps": {str(k): v for k, v in best.items()},
        "candidates": rows,
    }


def _wire_panel(ax: Any, plan: Plan, colors: Any) -> None:
    """Bytes per frame of each remote candidate under each measured codec setting (log scale),
    fidelity printed on each bar."""
    remote = [(i, c) for i, c in enumerate(plan.candidates) if c.wire]
    labels = list(dict.fromkeys(r.label for _, c in remote for r in c.wire))
    width = 0.8 / max(len(remote), 1)
    for k, (i, c) in enumerate(remote):
        by = {r.label: r for r in c.wire}
        xs = [j + (k - (len(remote) - 1) / 2) * width for j, lab in enumerate(labels) if lab in by]
        ys = [by[lab].nbytes / 1024 for lab in labels if lab in by]
        ax.bar(xs, ys, width=width, color=colors(i % 10), label=f"{c.id} (raw {c.cut_bytes / 1024:.0f} KiB)")
        for x, lab in zip(xs, [lab for lab in labels if lab in by]):
            ax.annotate(f"{by[lab].fidelity:.3f}", (x, by[lab].nbytes / 1024), fontsize=6, rotation=90,
                        ha="center", va="bottom")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("bytes per frame on the wire (KiB)")
    samples = plan.manifest.get("wire_samples") or {}
    ax.set_title(f"measured on {samples.get('frames', '?')} {samples.get('source', '')} frames; "
                 "fidelity (1 - relative output error) on each bar", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)


def write_report_png(plan: Plan, path: str | Path, *, edge_slowdown: float = 5.0,
                     rtt_ms: float = DEFAULT_RTT_MS, codec: str = "auto") -> bool:
    """Write the latency-vs-bandwidth plot (predictions with each cut in the setting ``codec``
    gives it, by default the edge agent's) and, for a plan with measured wire sizes, the bytes of
    every candidate per codec setting. False (nothing written) without matplotlib or times."""
    cm = _cost_model(plan, edge_slowdown)
    if cm is None:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bws = np.geomspace(0.1, 1000, 300)
    ratios = wire_ratios(plan, codec)
    settings = codec_settings(plan, codec)
    pred = np.array([cm.predict(float(b), rtt_ms, byte_ratio=ratios) for b in bws])  # (bandwidths, candidates)
    best = pred.min(1)
    winner = pred.argmin(1)
    has_wire = any(c.wire for c in plan.candidates)
    fig, axes = plt.subplots(1, 2 if has_wire else 1, figsize=(15 if has_wire else 9, 5.5), dpi=110,
                             gridspec_kw={"width_ratios": [3, 2]} if has_wire else None, squeeze=False)
    ax = axes[0][0]
    colors = plt.get_cmap("tab10")
    for i, cid in enumerate(cm.ids):
        c = plan.candidates[i]
        sent = f"{c.cut_bytes * ratios[i] / 1024:.1f} KiB {_label(settings[i])}"
        label = f"{cid} ({sent})" if not c.local else f"{cid} (local)"
        ax.plot(bws, pred[:, i], color=colors(i % 10), lw=1.3, label=label)
    ax.plot(bws, best, color="black", lw=3, ls="--", alpha=0.6, label="best envelope")
    # shade where each candidate wins
    start = 0
    for j in range(1, len(bws) + 1):
        if j == len(bws) or winner[j] != winner[start]:
            ax.axvspan(bws[start], bws[j - 1], color=colors(int(winner[start]) % 10), alpha=0.08)
            start = j
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("uplink bandwidth (Mbit/s)")
    ax.set_ylabel("predicted end-to-end latency (ms)")
    ax.set_title(f"{plan.name}: predicted latency per candidate cut\n"
                 f"(edge = split host × {edge_slowdown:g} unless profiled on the edge; RTT {rtt_ms:g} ms; "
                 f"codec {codec})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    if has_wire:
        _wire_panel(axes[0][1], plan, colors)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
