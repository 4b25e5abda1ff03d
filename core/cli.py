"""The ``splitinfer`` command line: the parser, and errors mapped to exit codes. What each
subcommand does is in :mod:`splitinfer.commands` and :mod:`splitinfer.run_commands`; each
imports its part lazily so that ``splitinfer --help`` and the edge's commands stay fast and light.

Exit status: 0 success; 1 a check failed (``verify``); 2 bad input (the message names it).
With ``--json`` the last line on stdout is one JSON object, also on failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import MissingExtraError, SplitinferError, VerificationError

__all__ = ["main", "build_parser"]

# top-level module -> the extra that brings it (what `pip install "splitinfer[EXTRA]"` needs)
_EXTRAS = {"torch": "torch", "onnxscript": "torch", "matplotlib": "report", "aiortc": "webrtc", "aioice": "webrtc",
           "aiohttp": "cloud", "prometheus_client": "cloud", "supervision": "demo", "trackers": "demo",
           "av": "demo", "ray": "ray"}


def _number(kind: type, *, low: float, inclusive: bool = True, high: float = math.inf) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` at least (or above) ``low``, at most ``high``; the message names it."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, "
                                             f"got {text!r}") from None
        if not math.isfinite(value) or (value < low if inclusive else value <= low):
            raise argparse.ArgumentTypeError(f"expected a number {'>=' if inclusive else '>'} {low:g}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected a number <= {high:g}, got {text!r}")
        return value

    return parse


_nonneg = _number(float, low=0.0)
_positive = _number(float, low=0.0, inclusive=False)
_count = _number(int, low=1)
_quality = _number(int, low=1, high=95)
_fraction = _number(float, low=0.0, high=1.0)


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="splitinfer", description="Edge-cloud split inference.")
    p.add_argument("--version", action="version", version=f"splitinfer {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("split", help="cut a model into a verified plan directory")
    s.add_argument("model", help="an ONNX file, or ref:NAME for a reference model (yolo-n, yolo-s, chain, transformer)")
    s.add_argument("-o", "--output", required=True, help="plan directory to create")
    s.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="fix an input's shape (repeat per input)")
    s.add_argument("--candidates", type=_count, default=8, metavar="K", help="keep at most K candidate cuts (default 8)")
    s.add_argument("--cut", metavar="T1,T2", help="add this cut (tensor names) to the automatic candidates")
    s.add_argument("--frames", metavar="SOURCE", default=None,
                   help="sample frames the wire sizes are measured on: scene, synthetic, a video file or a directory of "
                        "images (default: scene for an image input, synthetic otherwise)")
    s.add_argument("--samples", type=_count, default=4, metavar="N", help="sample frames to measure on (default 4)")
    s.add_argument("--normalize", metavar="PIXELS",
                   help="how camera pixels become the image input: imagenet, 0-1, 0-255, or "
                        "mean=A,B,C,std=A,B,C[,scale=S][,order=bgr] (default: read from the graph; ref: models 0-1)")
    s.add_argument("--input", metavar="NPY", help="also verify on this .npy/.npz input")
    s.add_argument("--threads", type=_count, default=None, help="onnxruntime intra-op threads (default: all)")
    s.add_argument("--edge-slowdown", type=_positive, default=5.0,
                   help="predictions: the edge is this many times slower than this machine until profiled (default 5)")
    s.add_argument("--no-verify", action="store_true", help="skip verification (not recommended)")
    s.add_argument("--no-profile", action="store_true", help="skip timing (no split-host profile, no report.png)")
    s.add_argument("--force", action="store_true", help="replace an existing plan directory")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(cmd="split")

    v = sub.add_parser("verify", help="check every candidate against the whole model")
    v.add_argument("plan")
    v.add_argument("--input", metavar="NPY", help="also verify on this .npy (one input) or .npz (named inputs)")
    v.add_argument("--tolerance", type=_nonneg, default=1e-5, help="max abs difference allowed (default 1e-5)")
    v.add_argument("--threads", type=_count, default=None)
    v.add_argument("--json", action="store_true")
    v.set_defaults(cmd="verify")

    i = sub.add_parser("inspect", help="print a plan's manifest summary")
    i.add_argument("plan")
    i.add_argument("--edge-slowdown", type=_positive, default=5.0)
    i.add_argument("--json", action="store_true")
    i.set_defaults(cmd="inspect")

    b = sub.add_parser("bottleneck", help="train a learned bottleneck at a cut and add it to the plan as a candidate")
    b.add_argument("plan")
    b.add_argument("--at", metavar="CANDIDATE|TENSOR",
                   help="where: a candidate whose cut is one tensor (e.g. c1), or a tensor name (with --weights: theirs)")
    b.add_argument("--frames", required=True, metavar="SOURCE",
                   help="unlabeled frames to learn from: a video file, a directory of images, or scene")
    b.add_argument("--channels", type=_count, default=12, metavar="K", help="latent channels (default 12)")
    b.add_argument("--stride", type=_count, default=2, help="the latent's resolution is the cut's / stride (default 2)")
    b.add_argument("--hidden", type=_count, default=64, help="the encoder's and decoder's width (default 64)")
    b.add_argument("--minutes", type=_positive, default=10.0, help="training time (default 10)")
    b.add_argument("--rate-weight", type=_nonneg, default=0.01, metavar="L",
                   help="weight of the latent's bits against fidelity (default 0.01; higher: fewer bytes)")
    b.add_argument("--train-frames", type=_count, default=256, metavar="N", help="frames to learn from (default 256)")
    b.add_argument("--eval-frames", type=_count, default=16, metavar="N",
                   help="held-out frames bytes and fidelity are measured on (default 16)")
    b.add_argument("--save", metavar="NPZ", help="also write the trained weights to this .npz")
    b.add_argument("--weights", metavar="NPZ", help="attach weights trained before (--save) instead of training")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=_count, default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(cmd="bottleneck")

    pr = sub.add_parser("profile", help="time a plan on this machine and store the device profile in it")
    pr.add_argument("plan")
    pr.add_argument("--role", choices=("edge", "cloud", "both"), required=True)
    pr.add_argument("--name", metavar="DEVICE", help="profile name (default ROLE-HOSTNAME)")
    pr.add_argument("--threads", type=_count, default=None)
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(cmd="profile")

    n = sub.add_parser("netem", help="a TCP relay that emulates a link: rate, delay, trace replay")
    n.add_argument("--listen", required=True, metavar="HOST:PORT")
    n.add_argument("--to", required=True, metavar="HOST:PORT")
    g = n.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", metavar="RATE", help="e.g. 20mbit, 500kbit (each direction)")
    g.add_argument("--trace", metavar="CSV", help="time_s,mbps rows, replayed and looped")
    n.add_argument("--delay-ms", type=_nonneg, default=0.0, help="one-way delay (ms)")
    n.add_argument("--speedup", type=_positive, default=1.0, help="replay the trace this many times faster")
    n.set_defaults(cmd="netem")

    c = sub.add_parser("cloud", help="the cloud service")
    csub = c.add_subparsers(dest="cloud_command", metavar="CMD", required=True)
    cs = csub.add_parser("serve", help="serve plans to edge devices until SIGINT/SIGTERM")
    cs.add_argument("plans", nargs="+", metavar="PLAN")
    cs.add_argument("--listen", default="0.0.0.0:7000", metavar="HOST:PORT", help="edge channel, TCP (default 0.0.0.0:7000)")
    cs.add_argument("--http", default="0.0.0.0:8000", metavar="HOST:PORT",
                    help="health, metrics, plans, WebRTC signalling (default 0.0.0.0:8000)")
    cs.add_argument("--token-file", metavar="PATH", help="accepted tokens, one per line")
    cs.add_argument("--tls-cert", metavar="PATH")
    cs.add_argument("--tls-key", metavar="PATH")
    cs.add_argument("--no-advertise", action="store_true", help="do not advertise with zeroconf")
    cs.add_argument("--max-batch-size", type=_count, default=8, metavar="N", help="requests per batch (default 8)")
    cs.add_argument("--max-queue-delay-ms", type=_nonneg, default=2.0, metavar="MS",
                    help="longest wait for a batch to fill (default 2)")
    cs.add_argument("--postprocess", choices=("yolo",),
                    help="send back detections instead of raw outputs to edges that do not ask for a format at hello")
    cs.add_argument("--max-connections", type=_count, default=None, metavar="N",
                    help="edge connections at once; more are closed on accept (default: half the fd limit, <= 4096)")
    cs.add_argument("--max-rows", type=_count, default=None, metavar="N",
                    help="rows one request may carry on a batch-dynamic cut (default: --max-batch-size)")
    cs.add_argument("--drain-s", type=_nonneg, default=5.0, metavar="S",
                    help="on SIGINT/SIGTERM, finish queued requests for at most S seconds (default 5)")
    cs.add_argument("--idle-timeout-s", type=_positive, default=120.0, metavar="S",
                    help="close a connection that sends nothing for S seconds (default 120)")
    cs.add_argument("--threads", type=_count, default=None, metavar="N",
                    help="onnxruntime threads per session (default: its own, one per core; several services "
                         "on one machine each want fewer)")
    cs.set_defaults(cmd="cloud serve")

    e = sub.add_parser("edge", help="the edge agent")
    esub = e.add_subparsers(dest="edge_command", metavar="CMD", required=True)
    er = esub.add_parser("run", help="run frames through the plan, adapting the cut")
    er.add_argument("plan")
    er.add_argument("--cloud", default="auto", help="auto (zeroconf), tcp://H:P, tls://H:P, webrtc://H:HTTP_PORT, none")
    er.add_argument("--source", default="synthetic", help="synthetic, scene (a moving road), or a video file (PyAV)")
    er.add_argument("--out", metavar="JSONL", help="one JSON record per frame")
    er.add_argument("--frames", type=_count, default=None, help="stop after N frames (synthetic: default 100)")
    er.add_argument("--fps", type=_positive, default=None, help="pace the source at F frames per second")
    er.add_argument("--frame-clock", type=_nonneg, default=None, metavar="T",
                    help="with --fps: capture frames at the instants T + k/F (Unix seconds, whole k); cameras "
                         "given one clock and different offsets keep their frames apart at a shared cloud")
    er.add_argument("--token-file", metavar="PATH")
    er.add_argument("--cafile", metavar="PEM", help="trust this CA (or self-signed certificate) for tls:// clouds")
    er.add_argument("--codec", default="auto",
                    help="codec for cut tensors: auto (default: per candidate, the cheapest setting the plan measured "
                         "whose fidelity is at least --min-fidelity, the all-cloud input's JPEG qualities included), "
                         "or fp16, int8, int8+lz4, int8+zstd, raw, ... for every cut")
    er.add_argument("--min-fidelity", type=_fraction, default=0.98, metavar="F",
                    help="with --codec auto: the least fidelity (1 - relative output error, as measured at split "
                         "time) a setting must keep (default 0.98)")
    er.add_argument("--input-codec", default=None,
                    help="codec for the all-cloud input (default: as --codec auto picks; with another --codec, jpeg "
                         "for an image input whose pixel format the plan records, else --codec)")
    er.add_argument("--jpeg-quality", type=_quality, default=None, metavar="Q",
                    help="send the all-cloud input as a JPEG of this quality 1-95 (default: as --codec picks, 90 "
                         "when it is not auto)")
    er.add_argument("--threads", type=_count, default=None, help="onnxruntime threads on the edge")
    er.add_argument("--candidate", metavar="ID", help="pin one candidate (an id, edge or cloud) instead of adapting")
    er.add_argument("--policy", choices=("latency", "bytes"), default="latency")
    er.add_argument("--latency-budget-ms", type=_positive, default=None, help="with --policy bytes")
    er.add_argument("--postprocess", choices=("yolo",), default=None,
                    help="every frame's output format, wherever it ran (asked of the cloud at hello)")
    er.add_argument("--emulate-slowdown", type=_positive, default=1.0,
                    help="make this machine stand for a device N times slower (demos, tests)")
    er.add_argument("--json", action="store_true")
    er.set_defaults(cmd="edge run")

    d = sub.add_parser("demo", help="the traffic-camera demo: cloud, link emulator, edge and a live dashboard")
    d.add_argument("--headless", action="store_true", help="no dashboard: run --frames frames, print a summary")
    d.add_argument("--frames", type=_count, default=None, help="stop after N frames (headless default 300)")
    d.add_argument("--source", metavar="VIDEO", help="a video file (PyAV); default: a rendered road")
    d.add_argument("--model", metavar="DETECTOR.onnx", help="a YOLOv8-style detector [1, 4+classes, N]")
    d.add_argument("--classes", metavar="FILE", help="class names, one per line (default: the model's metadata)")
    link = d.add_mutually_exclusive_group()
    link.add_argument("--trace", metavar="CSV", help="replay a time_s,mbps bandwidth trace (default: embedded)")
    link.add_argument("--bandwidth", metavar="RATE", help="a constant link, e.g. 5mbit")
    d.add_argument("--cloud", metavar="tcp://H:P", help="use a running cloud service instead of a local one")
    d.add_argument("--fps", type=_positive, default=8.0)
    d.add_argument("--slowdown", type=_positive, default=8.0, help="the edge device is N times slower than this machine")
    d.add_argument("--http", default="127.0.0.1:8000", metavar="HOST:PORT", help="the dashboard's address")
    d.add_argument("--json", action="store_true", help="end with one JSON object (the summary)")
    d.set_defaults(cmd="demo")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from .commands import COMMANDS

        return int(COMMANDS[args.cmd](args))
    except VerificationError as exc:
        return _fail(args, exc, 1)
    except SplitinferError as exc:
        return _fail(args, exc, 2)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:  # an optional extra is missing: say which
        top = (exc.name or "").partition(".")[0]
        if top not in _EXTRAS:
            raise
        extra = _EXTRAS[top]
        return _fail(args, MissingExtraError(f"`splitinfer {args.cmd}` needs {top!r}, which comes with the "
                                             f"{extra!r} extra: pip install \"splitinfer[{extra}]\"", extra), 2)
    except (ValueError, OSError) as exc:  # bad option values, unreadable files: named, exit 2
        return _fail(args, exc, 2)


def _emit_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _fail(args: argparse.Namespace, exc: Exception, code: int) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if getattr(args, "json", False):
        _emit_json({"ok": False, "error": str(exc), "error_type": type(exc).__name__})
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
