"""The traffic-camera demo: one process shows split inference live.

It starts, on this machine: the cloud service (post-processing detections), a link emulator
between edge and cloud replaying a bandwidth trace, the edge agent (its device slowed to stand
for a small camera computer), a camera (a rendered road, or a video file), vehicle tracking and
line-crossing counts, and a dashboard at http://127.0.0.1:8000 (annotated MJPEG video, counts,
the cut in use on a sketch of the network, the bandwidth estimate against the trace, latency,
fallbacks). Headless, it runs a number of frames and prints a summary.

    splitinfer demo                      # the dashboard
    splitinfer demo --headless --frames 200 --json
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..._types import PixelFormat
from ...errors import SplitinferError

__all__ = ["DemoConfig", "TrafficDemo", "DEFAULT_TRACE", "default_model", "load_classes"]

HERE = Path(__file__).resolve().parent
STOP_TIMEOUT_S = 15.0  # after Ctrl-C/SIGTERM, the longest the demo waits for its parts to close

# The embedded default: a minute of uplink that a camera on a cellular link could see (good,
# degrading, a dead spot, recovering), looped. --trace replays a real one instead.
DEFAULT_TRACE: tuple[tuple[float, float], ...] = (
    (0, 20.0), (8, 12.0), (14, 4.0), (20, 1.5), (26, 0.6), (30, 0.0), (33, 2.5), (38, 8.0), (44, 25.0), (52, 6.0),
)


def default_model() -> Path:
    return HERE / "weights" / "detector.onnx"


def load_classes(model: Path, classes_file: Path | None = None) -> list[str]:
    """Class names: a file (one per line), else the ONNX metadata ``names`` (a JSON object, or
    the Python dict literal YOLO exports write), else class0, class1, …"""
    if classes_file is not None:
        return [ln.strip() for ln in classes_file.read_text().splitlines() if ln.strip()]
    import ast

    import onnx

    try:
        m = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # not a protobuf, truncated, a directory, ...
        raise SplitinferError(f"--model {model}: not an ONNX model ({type(exc).__name__}: {exc})") from exc
    for p in m.metadata_props:
        if p.key == "names":
            try:
                names = json.loads(p.value)
            except ValueError:
                names = ast.literal_eval(p.value)
            if isinstance(names, dict):
                return [str(names[k]) for k in sorted(names, key=lambda k: int(k))]
            return [str(n) for n in names]
    out = m.graph.output[0].type.tensor_type.shape.dim
    nc = out[1].dim_value - 4 if len(out) == 3 and out[1].dim_value > 4 else 1
    return [f"class{k}" for k in range(nc)]


@dataclass
class DemoConfig:
    source: str | None = None  # a video file; None: the rendered road
    model: Path | None = None  # a YOLOv8-style ONNX detector; None: the shipped one
    classes: Path | None = None
    trace: Path | None = None
    bandwidth_mbps: float | None = None
    cloud: str | None = None  # a remote cloud service (tcp://…) instead of a local one
    frames: int | None = None
    fps: float = 8.0
    slowdown: float = 8.0  # the edge device is this many times slower than this machine
    delay_ms: float = 20.0
    http: tuple[str, int] = ("127.0.0.1", 8000)
    seed: int = 7
    cache: Path = field(default_factory=lambda: Path(os.environ.get("SPLITINFER_CACHE",
                                                                     Path.home() / ".cache" / "splitinfer")))


_PLAN_RECIPE = b"\0pixels=0-1\0wire=measured-v1"
# the demo's learned bottleneck (train_bottleneck.py): attached to the shipped detector's plan as b1
BOTTLENECK_WEIGHTS = HERE / "weights" / "bottleneck.npz"
# The fidelity floor the demo's agent keeps. A plan's fidelity is 1 - the relative L2 error of the
# raw outputs, which for a detector is mostly its box coordinates in pixels: it does not rank JPEG
# against the bottleneck by accuracy (JPEG q30, 0.96 by it, loses ~3 mAP points; see
# benchmarks/bottleneck_rate.py for the bottleneck's). The demo sends its all-cloud frames at JPEG
# q90 (input_codec="jpeg"), so this floor only admits its bottleneck, whose mAP was measured.
DEMO_MIN_FIDELITY = 0.9
_MEASURE_SEED = 5151  # rendered scenes the attached bottleneck's bytes and fidelity are measured on


def prepare_plan(model: Path, cache: Path, progress: Any = None, bottleneck: bool = True) -> Path:
    """Split ``model`` once; later runs reuse the plan (keyed by the model's hash). For the shipped
    detector the shipped bottleneck's weights are attached as candidate ``b1`` (``bottleneck=False``:
    the plain plan, which the bottleneck is trained on)."""
    from ...splitter import Plan, add_bottleneck, split_model

    # the detector takes RGB in [0, 1]: the plan records it, so all-cloud frames travel as JPEG;
    # the recipe is in the key, so a plan split another way (before wire sizes were measured) is not reused
    weights = BOTTLENECK_WEIGHTS if bottleneck and model.resolve() == default_model().resolve() and \
        BOTTLENECK_WEIGHTS.is_file() else None
    extra = b"\0bottleneck=" + weights.read_bytes() if weights is not None else b""
    digest = hashlib.sha256(model.read_bytes() + _PLAN_RECIPE + extra).hexdigest()[:16]
    out = cache / "demo-plans" / digest
    if out.is_dir():
        with contextlib.suppress(SplitinferError):
            Plan.load(out)
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.staging"  # the cached plan appears whole (bottleneck included) or not at all
    split_model(str(model), staging, force=True, report=False, normalize="0-1", progress=progress)
    if weights is not None:
        from .scene import render_dataset

        spec = Plan.load(staging).inputs[0]
        images, _, _ = render_dataset(16, spec.shape[2], seed=_MEASURE_SEED)
        frames = [{spec.name: img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0} for img in images]
        add_bottleneck(staging, None, weights=weights, frames=frames, eval_frames=16)
    if out.is_dir():  # a cached plan that no longer loads (checked above): this cache's own, replaced
        shutil.rmtree(out)
    os.replace(staging, out)
    return out


def _scene_frames(size: int, seed: int) -> Iterator[np.ndarray]:
    from .scene import TrafficScene

    scene = TrafficScene(size, seed=seed, density=1.3)
    while True:
        yield scene.step()[0]


def _video_frames(path: str, size: tuple[int, int]) -> Iterator[np.ndarray]:
    try:
        import av
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - av is a dependency of the demo extra
        raise SplitinferError("a video source needs PyAV: pip install av") from exc
    try:
        container = av.open(path)
    except Exception as exc:
        raise SplitinferError(f"{path}: cannot open the video: {exc}") from exc
    with container:
        for frame in container.decode(video=0):
            yield np.asarray(frame.to_image().convert("RGB").resize(size, Image.BILINEAR))


class TrafficDemo:
    """Everything the demo runs, started by :meth:`run` and stopped when it returns."""

    def __init__(self, config: DemoConfig) -> None:
        self.cfg = config
        self.model = Path(config.model) if config.model else default_model()
        if config.source is not None and not Path(config.source).is_file():
            raise SplitinferError(f"--source {config.source}: no such video file")
        if not self.model.is_file():
            raise SplitinferError(f"no detector at {self.model}"
                                  + (" (train one: python demos/traffic_camera/train.py)" if not config.model else ""))
        self.classes = load_classes(self.model, config.classes)
        self.stop = asyncio.Event()
        self.frame_ready = asyncio.Event()
        self.jpeg: bytes = b""
        self.state: dict[str, Any] = {"frames": 0, "counts": {c: 0 for c in self.classes}, "cut": None,
                                      "fallbacks": 0, "bytes": 0, "history": [], "started": time.time()}
        self.latencies: list[float] = []
        # headless: frames and detections kept to score them against the whole model afterwards
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []
        self.keep_frames = 0
        self.cuts: collections.Counter[str] = collections.Counter()
        self.plan: Any = None
        self.emu: Any = None

    # ------------------------------------------------------------------ the pipeline
    def agreement_with_whole_model(self) -> float | None:
        """mAP@0.5 of the detections the demo produced (split, codecs, fallbacks and all) against
        the whole model's own detections on the same frames: what splitting cost in accuracy."""
        if not self.kept:
            return None
        import onnxruntime as ort

        from ...postprocess import yolo_detections
        from .metrics import average_precision

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(str(self.plan.model_file), opts)
        name = self.plan.inputs[0].name
        reference = []
        for img, _ in self.kept:
            x = (self.plan.inputs[0].pixels or PixelFormat()).from_pixels(img)
            d = yolo_detections(sess.run(None, {name: x})[0])[0]
            reference.append((d[:, :4], d[:, 5].astype(np.int64)))
        return average_precision([det for _, det in self.kept], reference, len(self.classes))[0]

    async def run(self, headless: bool = False, on_ready: Any = None) -> dict[str, Any]:
        from ...cloud import CloudService
        from ...edge import EdgeAgent
        from ...splitter import Plan
        from ...transport.netem import LinkEmulator, load_trace

        cfg = self.cfg
        loop = asyncio.get_running_loop()
        plan_dir = await loop.run_in_executor(None, prepare_plan, self.model, cfg.cache)
        self.plan = Plan.load(plan_dir)
        size = self.plan.inputs[0].shape[2:]
        async with contextlib.AsyncExitStack() as stack:
            if cfg.cloud:
                from urllib.parse import urlparse

                u = urlparse(cfg.cloud)
                target = (u.hostname or "127.0.0.1", u.port or 7000)
            else:
                svc = await stack.enter_async_context(
                    CloudService([plan_dir], listen=("127.0.0.1", 0), http=None, advertise=False, postprocess="yolo"))
                target = ("127.0.0.1", svc.port)
            if cfg.bandwidth_mbps is not None:
                emu_kw: dict[str, Any] = {"rate_mbps": cfg.bandwidth_mbps}
            else:
                emu_kw = {"trace": load_trace(cfg.trace) if cfg.trace else list(DEFAULT_TRACE)}
            self.emu = await stack.enter_async_context(LinkEmulator(target, delay_ms=cfg.delay_ms, **emu_kw))
            agent = await stack.enter_async_context(
                EdgeAgent(self.plan, f"tcp://127.0.0.1:{self.emu.port}", codec="int8+lz4", input_codec="jpeg",
                          postprocess="yolo", emulate_slowdown=cfg.slowdown, threads=1, min_fidelity=DEMO_MIN_FIDELITY))
            if not headless:
                runner = await self._serve_http()
                stack.push_async_callback(runner.cleanup)
            if on_ready is not None:
                on_ready(self)
            self.emu.restart_schedule()
            await self._pipeline(agent, (size[1], size[0]))
        return self.summary()

    async def _pipeline(self, agent: Any, size: tuple[int, int]) -> None:
        import supervision as sv
        from trackers import ByteTrackTracker

        cfg = self.cfg
        spec = self.plan.inputs[0]
        images: dict[int, np.ndarray] = {}
        source = _video_frames(cfg.source, size) if cfg.source else _scene_frames(size[0], cfg.seed)
        tracker = ByteTrackTracker(frame_rate=cfg.fps, track_activation_threshold=0.4, high_conf_det_threshold=0.5)
        h, w = size[1], size[0]
        line = sv.LineZone(start=sv.Point(0, int(0.62 * h)), end=sv.Point(w, int(0.62 * h)))
        self.state["line"] = [0, int(0.62 * h), w, int(0.62 * h)]

        async def frames() -> AsyncIterator[dict[str, np.ndarray]]:
            k = 0
            for img in source:
                if self.stop.is_set() or (cfg.frames is not None and k >= cfg.frames):
                    return
                images[k] = img
                yield {spec.name: (spec.pixels or PixelFormat()).from_pixels(img, spec.dtype)}  # camera pixels in
                k += 1

        async for r in agent.stream(frames(), fps=cfg.fps):
            img = images.pop(r.index)
            det = r.outputs.get("detections", np.zeros((0, 6), np.float32))
            if len(self.kept) < self.keep_frames:
                self.kept.append((img, det))
            d = sv.Detections(xyxy=det[:, :4].astype(np.float32), confidence=det[:, 4],
                              class_id=det[:, 5].astype(int))
            d = tracker.update(d)
            crossed_in, crossed_out = line.trigger(d)
            for cid in np.concatenate([d.class_id[crossed_in], d.class_id[crossed_out]]) if len(d) else []:
                name = self.classes[int(cid)] if int(cid) < len(self.classes) else str(cid)
                self.state["counts"][name] = self.state["counts"].get(name, 0) + 1
            self._record(r)
            self.jpeg = await asyncio.get_running_loop().run_in_executor(None, self._annotate, img, d)
            self.frame_ready.set()
            self.frame_ready.clear()

    def _record(self, r: Any) -> None:
        total = r.timings["total_ms"]
        self.latencies.append(total)
        self.cuts[r.candidate] += 1
        st = self.state
        st["frames"] += 1
        st["cut"], st["placement"] = r.candidate, r.placement
        st["fallbacks"] += int(r.fallback)
        st["bytes"] += r.bytes_sent
        st["history"].append({"t": round(time.time() - st["started"], 2), "latency_ms": round(total, 1),
                              "estimate_mbps": round(r.conditions.get("bandwidth_mbps", 0.0), 3),
                              "link_mbps": round(self.emu.rate_mbps(), 3) if self.emu else None,
                              "cut": r.candidate, "fallback": r.fallback, "bytes": r.bytes_sent})
        del st["history"][:-300]

    def _annotate(self, img: np.ndarray, d: Any) -> bytes:
        from PIL import Image, ImageDraw

        im = Image.fromarray(img)
        draw = ImageDraw.Draw(im)
        colours = [(255, 80, 80), (80, 160, 255), (255, 200, 40), (120, 255, 120), (220, 120, 255)]
        x0, y0, x1, y1 = self.state["line"]
        draw.line([(x0, y0), (x1, y1)], fill=(255, 255, 255), width=2)
        for k in range(len(d)):
            c = int(d.class_id[k])
            col = colours[c % len(colours)]
            box = [float(v) for v in d.xyxy[k]]
            draw.rectangle(box, outline=col, width=2)
            tid = d.tracker_id[k] if d.tracker_id is not None else -1
            name = self.classes[c] if c < len(self.classes) else str(c)
            draw.text((box[0] + 2, max(box[1] - 11, 0)), f"{name} {tid if tid >= 0 else ''}", fill=col)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=80)
        return buf.getvalue()

    def summary(self) -> dict[str, Any]:
        lat = np.array(self.latencies) if self.latencies else np.zeros(1)
        n = self.state["frames"]
        return {"frames": n, "vehicles": dict(self.state["counts"]),
                "latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                               "mean": float(lat.mean())},
                "cuts": dict(self.cuts), "bytes_sent": int(self.state["bytes"]),
                "bytes_per_frame": float(self.state["bytes"] / max(n, 1)), "fallbacks": int(self.state["fallbacks"])}

    # ------------------------------------------------------------------ the dashboard
    async def _serve_http(self) -> Any:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/api/state", self._api_state)
        app.router.add_get("/api/plan", self._api_plan)
        app.router.add_get("/video.mjpg", self._mjpeg)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, *self.cfg.http)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else self.cfg.http[1]
        self.url = f"http://{self.cfg.http[0]}:{port}"
        return runner

    async def _index(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=(HERE / "dashboard.html").read_text(), content_type="text/html")

    async def _api_state(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(self.state | {"summary": self.summary()})

    async def _api_plan(self, request: Any) -> Any:
        from aiohttp import web

        cands = [{"id": c.id, "kind": c.kind, "edge_flops": c.flops_edge, "cloud_flops": c.flops_cloud,
                  "cut_bytes": c.cut_bytes, "cut": [t.name for t in c.cut]} for c in self.plan.candidates]
        return web.json_response({"name": self.plan.name, "classes": self.classes, "candidates": cands,
                                  "total_flops": max((c["edge_flops"] + c["cloud_flops"] for c in cands), default=0)})

    async def _mjpeg(self, request: Any) -> Any:
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "multipart/x-mixed-replace; boundary=frame",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            while not self.stop.is_set():
                if self.jpeg:
                    await resp.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: "
                                     + str(len(self.jpeg)).encode() + b"\r\n\r\n" + self.jpeg + b"\r\n")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.frame_ready.wait(), 1.0)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp


def run_demo(config: DemoConfig, *, headless: bool, as_json: bool) -> int:
    """``splitinfer demo``: run until the frames are done or Ctrl-C; print the summary."""
    demo = TrafficDemo(config)
    if headless:
        demo.keep_frames = min(config.frames or 0, 1000)

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)

        def on_signal() -> None:
            # the first Ctrl-C or SIGTERM stops the demo in order; a second one ends it at once
            demo.stop.set()
            for sig in signals:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)

        def ready(d: TrafficDemo) -> None:
            if not headless:
                print(f"dashboard: {d.url}  (Ctrl-C to stop)", flush=True)

        task = asyncio.ensure_future(demo.run(headless=headless, on_ready=ready))
        stopper = asyncio.ensure_future(demo.stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        demo.stop.set()  # the frame source ends, the pipeline drains, everything closes
        stopper.cancel()
        if not task.done():
            done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
            if not done:  # something did not drain in time: stop waiting for it
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise SplitinferError(f"the demo did not stop within {STOP_TIMEOUT_S:g} s of being asked; "
                                      "stopped it")
        return task.result()

    summary = asyncio.run(main())
    summary["link"] = (f"{config.bandwidth_mbps:g} Mbit/s" if config.bandwidth_mbps is not None
                       else Path(config.trace).name if config.trace else "embedded trace")
    if headless:
        summary["map50_vs_whole_model"] = demo.agreement_with_whole_model()
    _print_summary(summary, as_json)
    return 0


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="traffic-camera demo", header_style="bold")
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("frames", str(summary["frames"]))
    for name, n in summary["vehicles"].items():
        t.add_row(f"vehicles: {name}", str(n))
    lat = summary["latency_ms"]
    t.add_row("latency P50 / P99 (ms)", f"{lat['p50']:.1f} / {lat['p99']:.1f}")
    t.add_row("cuts used", ", ".join(f"{k}: {v}" for k, v in summary["cuts"].items()))
    t.add_row("bytes per frame", f"{summary['bytes_per_frame'] / 1024:.1f} KiB")
    t.add_row("fallbacks", str(summary["fallbacks"]))
    if summary.get("map50_vs_whole_model") is not None:
        t.add_row("mAP@0.5 vs the whole model", f"{summary['map50_vs_whole_model']:.3f}")
    Console().print(t)
    if as_json:
        print(json.dumps(summary), flush=True)


def parse_args_into_config(args: Any) -> DemoConfig:
    from ...transport.netem import parse_rate

    host, _, port = (args.http or "127.0.0.1:8000").rpartition(":")
    return DemoConfig(source=args.source, model=Path(args.model) if args.model else None,
                      classes=Path(args.classes) if args.classes else None,
                      trace=Path(args.trace) if args.trace else None,
                      bandwidth_mbps=parse_rate(args.bandwidth) if args.bandwidth else None, cloud=args.cloud,
                      frames=args.frames, fps=args.fps, slowdown=args.slowdown, http=(host or "127.0.0.1", int(port)))
