"""Procedurally rendered traffic scenes: the demo's default video and the detector's training set.

A camera looks down a straight road in perspective (horizon, vanishing point, lanes). Vehicles
of four classes drive along the lanes toward and away from the camera, growing and shrinking
with depth; each class has its own silhouette (a car's cabin, a bus's window band, a truck's cab
and cargo box, a motorbike's rider), colours vary, nearer vehicles occlude farther ones, and
every sequence has its own light (day, dusk, overcast), road tone and sensor noise.

Ground truth is exact: each vehicle's box is its drawn extent; a box whose vehicle is hidden
by more than ``max_occlusion`` of its area (by the ones in front), or smaller than ``min_box``
pixels (too far away), is left out, as an annotator would.

>>> scene = TrafficScene(size=320, seed=1)
>>> image, boxes, classes = scene.step()     # (320, 320, 3) uint8, (N, 4) xyxy pixels, (N,) int
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["CLASSES", "TrafficScene", "render_dataset"]

CLASSES = ("car", "bus", "truck", "motorbike")

# per class: (length, width, height) in metres, relative frequency
_SHAPES = {0: ((4.4, 1.8, 1.5), 0.55), 1: ((11.0, 2.5, 3.1), 0.12), 2: ((8.5, 2.5, 3.4), 0.18),
           3: ((2.1, 0.8, 1.5), 0.15)}
_PALETTE = np.array([[200, 30, 30], [30, 60, 170], [235, 235, 235], [25, 25, 25], [120, 120, 125],
                     [230, 190, 40], [40, 130, 60], [150, 90, 40], [200, 200, 210], [90, 20, 90]], np.float32)


@dataclass
class _Vehicle:
    cls: int
    lane: int
    z: float  # distance from the camera along the road (m)
    speed: float  # m/s, positive toward the camera... negative away
    color: np.ndarray
    length: float
    width: float
    height: float


class TrafficScene:
    """One camera's endless road. ``step()`` advances ``1 / fps`` seconds and renders a frame."""

    def __init__(self, size: int = 640, *, seed: int = 0, lanes: int = 4, fps: float = 10.0,
                 density: float = 1.0, max_occlusion: float = 0.7, min_box: float = 6.0) -> None:
        self.size, self.lanes, self.fps, self.density = size, lanes, fps, density
        self.max_occlusion, self.min_box = max_occlusion, min_box
        self.rng = np.random.default_rng(seed)
        r = self.rng
        # the camera: height above the road, pitch, focal length; where the horizon falls
        self.cam_h = r.uniform(6.0, 10.0)
        self.focal = size * r.uniform(0.9, 1.3)
        self.horizon = size * r.uniform(0.18, 0.32)
        self.lane_w = 3.6
        self.x_offset = r.uniform(-1.5, 1.5) * self.lane_w  # the camera is not always centred
        light = r.choice(["day", "dusk", "overcast"], p=[0.6, 0.2, 0.2])
        self.gain = {"day": 1.0, "dusk": 0.6, "overcast": 0.8}[light] * r.uniform(0.9, 1.1)
        self.tint = np.array({"day": [1.0, 1.0, 1.0], "dusk": [1.1, 0.9, 0.75],
                              "overcast": [0.95, 0.97, 1.02]}[light], np.float32)
        self.noise = r.uniform(2.0, 7.0)
        self.asphalt = r.uniform(70, 110)
        self.vehicles: list[_Vehicle] = []
        self.t = 0.0
        self._background = self._draw_background()
        for _ in range(int(6 * density)):  # start with traffic already on the road
            self._spawn(r.uniform(6, 60))

    # ------------------------------------------------------------------ geometry
    def _project(self, x: float, y: float, z: float) -> tuple[float, float]:
        """Road coordinates (x across, y up, z along, metres) to pixels."""
        z = max(z, 0.5)
        return (self.size / 2 + self.focal * (x - self.x_offset) / z,
                self.horizon + self.focal * (self.cam_h - y) / z)

    def _lane_x(self, lane: int) -> float:
        return (lane - (self.lanes - 1) / 2) * self.lane_w

    def _draw_background(self) -> np.ndarray:
        s = self.size
        img = Image.new("RGB", (s, s))
        d = ImageDraw.Draw(img)
        sky_top, sky_bottom = np.array([110, 150, 210]), np.array([190, 210, 230])
        for yy in range(int(self.horizon) + 1):
            c = sky_top + (sky_bottom - sky_top) * yy / max(self.horizon, 1)
            d.line([(0, yy), (s, yy)], fill=tuple(int(v) for v in c))
        grass = tuple(int(v) for v in self.rng.uniform([60, 90, 40], [100, 140, 70]))
        d.rectangle([0, int(self.horizon), s, s], fill=grass)
        half = self.lanes * self.lane_w / 2 + 1.0
        far, near = 400.0, 1.0
        road = [self._project(-half, 0, far), self._project(half, 0, far), self._project(half, 0, near),
                self._project(-half, 0, near)]
        a = int(self.asphalt)
        d.polygon(road, fill=(a, a, a + 4))
        for k in range(1, self.lanes):  # dashed lane lines
            x = self._lane_x(k) - self.lane_w / 2
            for z0 in np.arange(2.0, 200.0, 9.0):
                d.polygon([self._project(x - 0.08, 0, z0), self._project(x + 0.08, 0, z0),
                           self._project(x + 0.08, 0, z0 + 4), self._project(x - 0.08, 0, z0 + 4)],
                          fill=(225, 225, 215))
        for x in (-half + 0.3, half - 0.3):  # solid edge lines
            d.line([self._project(x, 0, far), self._project(x, 0, near)], fill=(230, 230, 220), width=2)
        return np.asarray(img, np.float32)

    # ------------------------------------------------------------------ traffic
    def _spawn(self, z: float | None = None) -> None:
        r = self.rng
        classes = list(_SHAPES)
        cls = int(r.choice(classes, p=np.array([_SHAPES[c][1] for c in classes]) / sum(_SHAPES[c][1] for c in classes)))
        (length, width, height), _ = _SHAPES[cls]
        scale = r.uniform(0.9, 1.12)
        lane = int(r.integers(self.lanes))
        toward = lane >= self.lanes // 2  # right-hand traffic: near lanes come toward the camera
        speed = r.uniform(8, 22) * (1 if toward else -1) * (0.8 if cls in (1, 2) else 1.0)
        if z is None:
            z = 75.0 if toward else 4.0
        color = _PALETTE[r.integers(len(_PALETTE))] * r.uniform(0.8, 1.15)
        if cls == 1 and r.random() < 0.5:
            color = np.array([240, 200, 30], np.float32)  # a school-bus yellow now and then
        self.vehicles.append(_Vehicle(cls, lane, float(z), float(speed), color, length * scale, width * scale,
                                      height * scale))

    def _advance(self, dt: float) -> None:
        for v in self.vehicles:
            v.z -= v.speed * dt  # positive speed: toward the camera (z shrinks)
        self.vehicles = [v for v in self.vehicles if 3.0 < v.z < 80.0]
        if self.rng.random() < 0.25 * self.density * dt * 10 / 2 or len(self.vehicles) < 2:
            self._spawn()

    # ------------------------------------------------------------------ drawing
    def _box(self, v: _Vehicle) -> tuple[float, float, float, float]:
        x = self._lane_x(v.lane)
        x0, y0 = self._project(x - v.width / 2, v.height, v.z)
        x1, y1 = self._project(x + v.width / 2, 0.0, v.z)
        # the vehicle's length recedes toward the vanishing point: its far end is higher and narrower
        fx0, fy0 = self._project(x - v.width / 2, v.height, v.z + v.length)
        fx1, _ = self._project(x + v.width / 2, 0.0, v.z + v.length)
        return min(x0, fx0), min(y0, fy0), max(x1, fx1), y1

    def _draw_vehicle(self, d: ImageDraw.ImageDraw, v: _Vehicle, color: tuple[int, int, int] | int) -> None:
        """Draw ``v``; an int ``color`` paints every part with it (masks of who is visible where)."""
        x = self._lane_x(v.lane)
        w, h, L = v.width / 2, v.height, v.length

        def quad(xa: float, xb: float, ya: float, yb: float, z: float) -> list[tuple[float, float]]:
            return [self._project(xa, yb, z), self._project(xb, yb, z), self._project(xb, ya, z),
                    self._project(xa, ya, z)]

        solid = isinstance(color, int)
        dark: Any = color if solid else tuple(int(c * 0.55) for c in color)  # type: ignore[union-attr]
        glass: Any = color if solid else (60, 75, 90)
        tyre: Any = color if solid else (15, 15, 15)
        light: Any = color if solid else (220, 220, 215)
        black: Any = color if solid else (25, 25, 25)
        # top surface, then the face toward the camera
        d.polygon([self._project(x - w, h, v.z), self._project(x + w, h, v.z), self._project(x + w, h, v.z + L),
                   self._project(x - w, h, v.z + L)], fill=dark)
        if v.cls == 0:  # car: low body, cabin with a windscreen
            d.polygon(quad(x - w, x + w, 0.25, h * 0.55, v.z), fill=color)
            d.polygon(quad(x - w * 0.8, x + w * 0.8, h * 0.55, h, v.z + 0.8), fill=color)
            d.polygon(quad(x - w * 0.7, x + w * 0.7, h * 0.6, h * 0.95, v.z + 0.8), fill=glass)
        elif v.cls == 1:  # bus: tall box, a band of windows
            d.polygon(quad(x - w, x + w, 0.3, h, v.z), fill=color)
            d.polygon(quad(x - w * 0.9, x + w * 0.9, h * 0.5, h * 0.88, v.z), fill=glass)
            d.polygon(quad(x - w * 0.6, x + w * 0.6, h * 0.92, h * 0.99, v.z), fill=black)
        elif v.cls == 2:  # truck: a cab in front of a taller cargo box
            d.polygon(quad(x - w, x + w, 0.4, h, v.z + 2.2), fill=light)
            d.polygon(quad(x - w, x + w, 0.4, h * 0.72, v.z), fill=color)
            d.polygon(quad(x - w * 0.85, x + w * 0.85, h * 0.45, h * 0.68, v.z), fill=glass)
        else:  # motorbike and rider
            d.polygon(quad(x - w * 0.35, x + w * 0.35, 0.1, h * 0.45, v.z), fill=black)
            d.polygon(quad(x - w * 0.5, x + w * 0.5, h * 0.45, h * 0.85, v.z), fill=color)
            d.ellipse([*self._project(x - w * 0.35, h, v.z), *self._project(x + w * 0.35, h * 0.82, v.z)],
                      fill=black)
        if v.cls != 3:  # wheels
            for xw in (x - w * 0.75, x + w * 0.75):
                d.polygon(quad(xw - 0.15, xw + 0.15, 0.0, 0.35, v.z), fill=tyre)

    def render(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = self.size
        img = Image.fromarray(self._background.astype(np.uint8))
        d = ImageDraw.Draw(img)
        ids = Image.new("I", (s, s), 0)
        di = ImageDraw.Draw(ids)
        order = sorted(self.vehicles, key=lambda v: -v.z)  # far first: near ones occlude them
        boxes, classes = [], []
        for k, v in enumerate(order, start=1):
            color = tuple(int(c) for c in np.clip(v.color, 0, 255))
            self._draw_vehicle(d, v, color)
            self._draw_vehicle(di, v, k)  # type: ignore[arg-type]
            x0, y0, x1, y1 = self._box(v)
            boxes.append((x0, y0, x1, y1))
            classes.append(v.cls)
        idmap = np.asarray(ids)
        visible = np.bincount(idmap.ravel(), minlength=len(order) + 1)
        out_b, out_c = [], []
        for k, (box, cls) in enumerate(zip(boxes, classes), start=1):
            x0, y0, x1, y1 = np.clip(box, 0, s)
            if x1 - x0 < self.min_box or y1 - y0 < self.min_box:  # too far to annotate
                continue
            drawn = visible[k]
            full = self._drawn_area(order[k - 1])
            if full <= 0 or drawn / full < 1 - self.max_occlusion:
                continue
            out_b.append((x0, y0, x1, y1))
            out_c.append(cls)
        pixels = np.asarray(img, np.float32) * self.gain * self.tint
        pixels += self.rng.normal(0, self.noise, pixels.shape).astype(np.float32)
        image = np.clip(pixels, 0, 255).astype(np.uint8)
        return (image, np.array(out_b, np.float32).reshape(-1, 4), np.array(out_c, np.int64))

    def _drawn_area(self, v: _Vehicle) -> int:
        """Pixels the vehicle covers when nothing is in front of it."""
        m = Image.new("L", (self.size, self.size), 0)
        self._draw_vehicle(ImageDraw.Draw(m), v, 1)  # type: ignore[arg-type]
        return int(np.count_nonzero(np.asarray(m)))

    def step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance one frame and render it: (H, W, 3) uint8, (N, 4) xyxy boxes, (N,) classes."""
        self._advance(1.0 / self.fps)
        self.t += 1.0 / self.fps
        return self.render()

    def frames(self, n: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        k = 0
        while n is None or k < n:
            yield self.step()
            k += 1


def render_dataset(n: int, size: int, seed: int, frames_per_scene: int = 20,
                   stride: int = 3) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """``n`` frames from ``n / frames_per_scene`` different scenes (cameras, light, traffic),
    taking every ``stride``-th frame so consecutive samples differ."""
    images, boxes, classes = [], [], []
    k = 0
    while len(images) < n:
        scene = TrafficScene(size, seed=seed * 100003 + k, density=float(np.random.default_rng(seed + k).uniform(0.6, 1.8)))
        k += 1
        for j, (img, b, c) in enumerate(scene.frames(frames_per_scene * stride)):
            if j % stride == 0 and len(images) < n:
                images.append(img)
                boxes.append(b)
                classes.append(c)
    return np.stack(images), boxes, classes
