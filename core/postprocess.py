"""Detector post-processing shared by the cloud (which can send back boxes instead of raw maps)
and the edge (which must produce the same result when it finishes a frame locally).

``yolo``: a YOLOv8-style output ``(B, 4 + classes, N)`` (cx, cy, w, h, then class scores)
becomes, per image, ``(K, 6)`` float32 rows ``x1, y1, x2, y2, score, class`` after a confidence
threshold and class-aware non-maximum suppression.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["yolo_detections", "nms", "POSTPROCESSORS", "postprocess"]

CONF_THRESHOLD = 0.25  # YOLO's usual default
IOU_THRESHOLD = 0.45
MAX_DETECTIONS = 300


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float = IOU_THRESHOLD) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, best first. ``boxes`` (K, 4) x1y1x2y2."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    area = np.maximum(boxes[:, 2] - boxes[:, 0], 0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0)
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        xx1 = np.maximum(boxes[i, 0], boxes[rest, 0])
        yy1 = np.maximum(boxes[i, 1], boxes[rest, 1])
        xx2 = np.minimum(boxes[i, 2], boxes[rest, 2])
        yy2 = np.minimum(boxes[i, 3], boxes[rest, 3])
        inter = np.maximum(xx2 - xx1, 0) * np.maximum(yy2 - yy1, 0)
        union = area[i] + area[rest] - inter
        overlap = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        order = rest[overlap <= iou]
    return np.asarray(keep, dtype=np.int64)


def yolo_detections(output: np.ndarray, conf: float = CONF_THRESHOLD, iou: float = IOU_THRESHOLD,
                    max_det: int = MAX_DETECTIONS) -> list[np.ndarray]:
    """Per image of ``output`` (B, 4 + classes, N): detections (K, 6) float32."""
    if output.ndim != 3 or output.shape[1] < 5:
        raise ValueError(f"yolo post-processing expects (B, 4 + classes, N), got {list(output.shape)}")
    result = []
    for img in output:
        scores_all = img[4:]  # (C, N)
        cls = scores_all.argmax(0)
        score = scores_all[cls, np.arange(img.shape[1])]
        mask = score >= conf
        if not mask.any():
            result.append(np.zeros((0, 6), np.float32))
            continue
        cx, cy, w, h = img[0, mask], img[1, mask], img[2, mask], img[3, mask]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
        s, c = score[mask], cls[mask]
        offset = c[:, None].astype(boxes.dtype) * (float(np.abs(boxes).max()) + 1.0)  # class-aware NMS
        keep = nms(boxes + offset, s, iou)[:max_det]
        result.append(np.concatenate([boxes[keep], s[keep, None], c[keep, None].astype(np.float32)], 1)
                      .astype(np.float32))
    return result


def _yolo(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    (out,) = outputs.values()
    dets = yolo_detections(out)
    if len(dets) != 1:
        raise ValueError("yolo post-processing of a result is per request (batch 1)")
    return {"detections": dets[0]}


# name -> function from a request's model outputs to what travels back
POSTPROCESSORS = {"yolo": _yolo}


def postprocess(name: str | None, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not name:
        return dict(outputs)
    if name not in POSTPROCESSORS:
        raise ValueError(f"unknown post-processing {name!r}; expected one of {sorted(POSTPROCESSORS)}")
    return POSTPROCESSORS[name](outputs)
