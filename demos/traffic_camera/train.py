"""Train the demo's detector (splitinfer's YOLO-style ``n`` model) on rendered traffic scenes.

    python demos/traffic_camera/train.py [--minutes 50] [--size 320] [--out demos/traffic_camera/weights]

Everything it learns from is made by ``scene.py``: no dataset, no pretrained weights. The loss
is YOLOv8's recipe in small: task-aligned assignment (per ground-truth box, the ``topk`` anchor
points inside it with the best ``score^0.5 * IoU^6``), binary cross-entropy on the classes with
the alignment as a soft target, CIoU and distribution focal loss on the boxes. AdamW with a
cosine schedule over the time budget, flips for augmentation, an EMA of the weights for the
export. It writes ``detector.onnx`` (the model and its class names in the metadata) and
``detector.json`` (what was trained, how, and mAP@0.5 on a held-out rendered set).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from splitinfer.demos.traffic_camera.metrics import average_precision
from splitinfer.demos.traffic_camera.scene import CLASSES, render_dataset

HERE = Path(__file__).resolve().parent


def bbox_iou(a: torch.Tensor, b: torch.Tensor, ciou: bool = False, eps: float = 1e-7) -> torch.Tensor:
    """IoU (or CIoU) of matching rows of two (…, 4) xyxy tensors."""
    iw = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(0)
    ih = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(0)
    inter = iw * ih
    wa, ha = a[..., 2] - a[..., 0], a[..., 3] - a[..., 1]
    wb, hb = b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]
    union = wa * ha + wb * hb - inter + eps
    iou = inter / union
    if not ciou:
        return iou
    cw = torch.maximum(a[..., 2], b[..., 2]) - torch.minimum(a[..., 0], b[..., 0])
    ch = torch.maximum(a[..., 3], b[..., 3]) - torch.minimum(a[..., 1], b[..., 1])
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((a[..., 0] + a[..., 2] - b[..., 0] - b[..., 2]) ** 2 + (a[..., 1] + a[..., 3] - b[..., 1] - b[..., 3]) ** 2) / 4
    v = (4 / math.pi ** 2) * (torch.atan(wb / (hb + eps)) - torch.atan(wa / (ha + eps))) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


class Loss:
    """Task-aligned assignment + BCE (classes) + CIoU and DFL (boxes), as YOLOv8 does."""

    def __init__(self, model: torch.nn.Module, topk: int = 10, alpha: float = 0.5, beta: float = 6.0) -> None:
        head = model.head
        self.nc, self.reg_max = head.nc, head.reg_max
        self.points = (head.anchors * head.stride_map).T  # (N, 2) pixels
        self.stride = head.stride_map[0]  # (N,)
        self.topk, self.alpha, self.beta = topk, alpha, beta

    def __call__(self, box_logits: torch.Tensor, cls_logits: torch.Tensor, targets: list[torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        b, n = cls_logits.shape[0], cls_logits.shape[2]
        dist = box_logits.view(b, 4, self.reg_max, n).permute(0, 3, 1, 2)  # (B, N, 4, R)
        ltrb = (dist.softmax(3) * torch.arange(self.reg_max, dtype=dist.dtype)).sum(3)  # strides
        s = self.stride[None, :, None]
        pred = torch.cat([self.points - ltrb[..., :2] * s, self.points + ltrb[..., 2:] * s], 2)  # (B, N, 4)
        scores = cls_logits.permute(0, 2, 1)  # (B, N, C) logits
        target_scores = torch.zeros_like(scores)
        box_terms, dfl_terms, weights = [], [], []
        for i, gt in enumerate(targets):  # gt: (M, 5) class, x1, y1, x2, y2
            if not len(gt):
                continue
            cls, gboxes = gt[:, 0].long(), gt[:, 1:]
            with torch.no_grad():
                inside = ((self.points[None] > gboxes[:, None, :2]) & (self.points[None] < gboxes[:, None, 2:])).all(2)
                iou = bbox_iou(pred[i][None].detach(), gboxes[:, None]).clamp(0)  # (M, N)
                prob = scores[i].detach().sigmoid()[:, cls].T  # (M, N)
                align = prob ** self.alpha * iou ** self.beta * inside
                k = min(self.topk, n)
                top = align.topk(k, 1).indices
                mask = torch.zeros_like(align, dtype=torch.bool)
                mask.scatter_(1, top, True)
                mask &= inside
                # an anchor claimed by several boxes goes to the one it overlaps most
                iou_m = torch.where(mask, iou, torch.full_like(iou, -1))
                owner = iou_m.argmax(0)
                pos = mask.any(0)
                if not pos.any():
                    continue
                idx = pos.nonzero().squeeze(1)
                g = owner[idx]
                a = (align * mask)[g, idx]
                # normalise: each box's best anchor gets its best IoU as the score target
                amax = (align * mask).amax(1)[g].clamp(min=1e-9)
                imax = (iou * mask).amax(1)[g]
                norm = a / amax * imax
                target_scores[i, idx, cls[g]] = norm
            pb, tb = pred[i, idx], gboxes[g]
            box_terms.append((1 - bbox_iou(pb, tb, ciou=True)) * norm)
            # DFL: the target distances (in strides) between the two nearest bins
            st = self.stride[idx, None]
            tgt = torch.cat([self.points[idx] - tb[:, :2], tb[:, 2:] - self.points[idx]], 1) / st
            tgt = tgt.clamp(0, self.reg_max - 1.01)
            lo = tgt.long()
            wl, wr = lo + 1 - tgt, tgt - lo
            d = dist[i, idx]  # (P, 4, R)
            dfl = (F.cross_entropy(d.reshape(-1, self.reg_max), lo.reshape(-1), reduction="none") * wl.reshape(-1)
                   + F.cross_entropy(d.reshape(-1, self.reg_max), (lo + 1).reshape(-1), reduction="none")
                   * wr.reshape(-1)).view(-1, 4).mean(1)
            dfl_terms.append(dfl * norm)
            weights.append(norm)
        total = max(target_scores.sum().item(), 1.0)
        l_cls = F.binary_cross_entropy_with_logits(scores, target_scores, reduction="sum") / total
        if box_terms:
            l_box = torch.cat(box_terms).sum() / total
            l_dfl = torch.cat(dfl_terms).sum() / total
        else:
            l_box = l_dfl = scores.sum() * 0
        loss = (0.5 * l_cls + 7.5 * l_box + 1.5 * l_dfl) * b
        return loss, {"cls": l_cls.item(), "box": l_box.item(), "dfl": l_dfl.item()}


def to_batch(images: np.ndarray, boxes: list[np.ndarray], classes: list[np.ndarray], flip: np.ndarray | None = None
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    size = images.shape[2]
    targets = []
    for k, (b, c) in enumerate(zip(boxes, classes)):
        b = b.copy()
        if flip is not None and flip[k]:
            x[k] = x[k].flip(2)
            b[:, [0, 2]] = size - b[:, [2, 0]]
        targets.append(torch.from_numpy(np.concatenate([c[:, None].astype(np.float32), b], 1)))
    return x, targets


def evaluate(model: torch.nn.Module, images: np.ndarray, boxes: list[np.ndarray], classes: list[np.ndarray],
             nc: int) -> float:
    from splitinfer.postprocess import yolo_detections

    model.eval()
    dets = []
    with torch.no_grad():
        for k in range(0, len(images), 16):
            x, _ = to_batch(images[k:k + 16], boxes[k:k + 16], classes[k:k + 16])
            dets += yolo_detections(model(x).numpy(), conf=0.01)
    return average_precision(dets, list(zip(boxes, classes)), nc)[0]


def main() -> None:
    from splitinfer.models.yolo import YoloConfig, YoloDetector

    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=50.0, help="training time budget")
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--train-images", type=int, default=3000)
    ap.add_argument("--val-images", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "weights")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    train = render_dataset(args.train_images, args.size, seed=args.seed + 1)
    val = render_dataset(args.val_images, args.size, seed=args.seed + 1000)
    print(f"rendered {args.train_images} + {args.val_images} images in {time.time() - t0:.0f} s", flush=True)
    model = YoloDetector(YoloConfig("n", num_classes=len(CLASSES), input_size=args.size))
    ema = YoloDetector(YoloConfig("n", num_classes=len(CLASSES), input_size=args.size))
    ema.load_state_dict(model.state_dict())
    ema.eval()
    loss_fn = Loss(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999))
    budget = args.minutes * 60
    start = time.time()
    rng = np.random.default_rng(args.seed)
    step, updates = 0, 0
    history = []
    while time.time() - start < budget:
        order = rng.permutation(len(train[0]))
        for k in range(0, len(order) - args.batch + 1, args.batch):
            frac = (time.time() - start) / budget
            if frac >= 1:
                break
            warm = min(1.0, step / 100)
            for g in opt.param_groups:
                g["lr"] = args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
            idx = order[k:k + args.batch]
            x, targets = to_batch(train[0][idx], [train[1][j] for j in idx], [train[2][j] for j in idx],
                                  flip=rng.random(len(idx)) < 0.5)
            model.train()
            box, cls = model.head.raw(model.features(x))
            loss, parts = loss_fn(box, cls, targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
            step += 1
            updates += 1
            with torch.no_grad():  # EMA of the weights (and BN statistics)
                d = 0.9998 * (1 - math.exp(-updates / 500))
                for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
                    if e.dtype.is_floating_point:
                        e.mul_(d).add_(m.detach(), alpha=1 - d)
                    else:
                        e.copy_(m)
            if step % 50 == 0:
                print(f"step {step} {time.time() - start:5.0f} s loss {loss.item():.3f} "
                      + " ".join(f"{k} {v:.3f}" for k, v in parts.items()), flush=True)
            if step % 500 == 0:
                m = evaluate(ema, *val, len(CLASSES))
                history.append({"step": step, "seconds": round(time.time() - start), "map50": m})
                print(f"  val mAP@0.5 {m:.3f}", flush=True)
    final = evaluate(ema, *val, len(CLASSES))
    history.append({"step": step, "seconds": round(time.time() - start), "map50": final})
    print(f"final val mAP@0.5 {final:.3f} after {step} steps", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    export(ema, args.size, args.out / "detector.onnx")
    (args.out / "detector.json").write_text(json.dumps({
        "model": "splitinfer YoloDetector n", "classes": list(CLASSES), "input_size": args.size,
        "train_images": args.train_images, "val_images": args.val_images, "steps": step,
        "minutes": args.minutes, "seed": args.seed, "val_map50": final, "history": history,
    }, indent=2) + "\n")
    print(f"wrote {args.out / 'detector.onnx'}")


def export(model: torch.nn.Module, size: int, path: Path) -> None:
    """The model as one ONNX file (batch dynamic) with its class names in the metadata, as YOLO
    exports carry them."""
    import onnx

    from splitinfer.splitter.loader import export_torch

    model.eval()
    m = onnx.load_from_string(export_torch(model, torch.zeros(1, 3, size, size), input_names=["images"],
                                           output_names=["output0"]))
    entry = m.metadata_props.add()
    entry.key, entry.value = "names", json.dumps(dict(enumerate(CLASSES)))
    onnx.save(m, str(path))


if __name__ == "__main__":
    main()
