"""Detection quality: mAP at an IoU threshold, as the detection literature computes it."""

from __future__ import annotations

import numpy as np

__all__ = ["average_precision"]


def average_precision(dets: list[np.ndarray], gts: list[tuple[np.ndarray, np.ndarray]], nc: int,
                      iou_thr: float = 0.5) -> tuple[float, list[float]]:
    """mAP@``iou_thr`` (all-point interpolation, VOC/COCO style) over classes that appear."""
    aps = []
    for c in range(nc):
        scored, npos = [], 0
        for k, (det, (gb, gc)) in enumerate(zip(dets, gts)):
            g = gb[gc == c]
            npos += len(g)
            d = det[det[:, 5] == c]
            used = np.zeros(len(g), bool)
            for row in d[np.argsort(-d[:, 4])]:
                ok = False
                if len(g):
                    ix = np.clip(np.minimum(row[2], g[:, 2]) - np.maximum(row[0], g[:, 0]), 0, None)
                    iy = np.clip(np.minimum(row[3], g[:, 3]) - np.maximum(row[1], g[:, 1]), 0, None)
                    inter = ix * iy
                    union = (row[2] - row[0]) * (row[3] - row[1]) + (g[:, 2] - g[:, 0]) * (g[:, 3] - g[:, 1]) - inter
                    iou = inter / np.maximum(union, 1e-9)
                    j = int(iou.argmax())
                    if iou[j] >= iou_thr and not used[j]:
                        used[j], ok = True, True
                scored.append((row[4], ok))
        if npos == 0:
            continue
        scored.sort(key=lambda t: -t[0])
        tp = np.cumsum([s[1] for s in scored]) if scored else np.zeros(0)
        fp = np.cumsum([not s[1] for s in scored]) if scored else np.zeros(0)
        recall = tp / npos if len(tp) else np.zeros(0)
        precision = tp / np.maximum(tp + fp, 1e-9) if len(tp) else np.zeros(0)
        r = np.concatenate([[0.0], recall, [1.0]])
        p = np.concatenate([[1.0], precision, [0.0]])
        p = np.maximum.accumulate(p[::-1])[::-1]
        aps.append(float(np.sum((r[1:] - r[:-1]) * p[1:])))
    return (float(np.mean(aps)) if aps else 0.0), aps
