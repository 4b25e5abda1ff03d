"""Train the demo's learned bottleneck and write its weights (weights/bottleneck.npz).

    python demos/traffic_camera/train_bottleneck.py [--minutes 12] [--rate-weight 0.001] [--train 512]

The detector's plan is split as the demo splits it, a bottleneck is trained on a copy of it by
distillation from the frozen detector (``splitinfer bottleneck``'s Python API) on rendered scenes
no evaluation uses, and its weights are written beside the detector's. The demo attaches them to
its plan as candidate ``b1`` (``app.prepare_plan``: no training, no torch). Needs the ``torch``
extra; takes ``--minutes`` plus about a minute. Prints what the bottleneck sends and its fidelity
on held-out frames; benchmarks/bottleneck_rate.py measures its mAP against JPEG's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
AT = "silu_12"  # the stride-8 feature map: the deepest one-tensor cut, 19 % of the detector's FLOPs
CHANNELS, STRIDE = 12, 2
TRAIN_SEED = 9173  # rendered scenes for training: neither the detector's nor any evaluation's seed


def _every_500_steps(what: str, frac: float) -> None:
    if not what.startswith("training") or "00:" in what.split("bits")[0]:
        print(f"{100 * frac:3.0f} % {what}", flush=True)


def main() -> int:
    from splitinfer.demos.traffic_camera.app import BOTTLENECK_WEIGHTS, default_model, prepare_plan
    from splitinfer.demos.traffic_camera.scene import render_dataset
    from splitinfer.splitter import add_bottleneck

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--rate-weight", type=float, default=0.001)
    ap.add_argument("--train", type=int, default=512, help="rendered frames to learn from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=BOTTLENECK_WEIGHTS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = prepare_plan(default_model(), Path(tmp) / "cache", bottleneck=False)
        plan_dir = Path(tmp) / "plan"
        shutil.copytree(base, plan_dir)
        from splitinfer.splitter import Plan

        spec = Plan.load(plan_dir).inputs[0]
        images, _, _ = render_dataset(args.train + 16, spec.shape[2], seed=TRAIN_SEED)
        frames = [{spec.name: img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0} for img in images]
        res = add_bottleneck(plan_dir, AT, frames=frames, train_frames=args.train, eval_frames=16, channels=CHANNELS,
                             stride=STRIDE, minutes=args.minutes, rate_weight=args.rate_weight, threads=args.threads,
                             save=args.out, progress=_every_500_steps)
    report = res.to_json()
    report.pop("plan", None)
    report.pop("plan_hash", None)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB): {res.rung.nbytes} bytes a frame, fidelity "
          f"{res.rung.fidelity:.4f} on {res.frames['held_out']} held-out frames, {res.training.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
