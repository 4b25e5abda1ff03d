"""The all-cloud candidates' wire size, measured on real frames while they are not in use.

An all-cloud candidate sends the camera frame itself (a JPEG of it, for an image input); its size
is the cost model's byte ratio for that candidate. Encoding a frame costs a few ms on any device,
so it is sampled every ``every_s`` seconds (on a 0.17-core device a JPEG was ~40 ms of the
device's time: every 2 s cost the all-edge frames ~2.5 % at 2 fps), and once at the first frame;
without it a candidate never tried would be judged by a prior forever.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

import numpy as np

from ..splitter.plan import Plan
from ..codecs import Encoded
from .controller import Controller

__all__ = ["InputSizes"]


class InputSizes:
    """When each all-cloud candidate (``input_only``) was last sized, and the sizing itself."""

    def __init__(self, plan: Plan, controller: Controller, encode: Callable[[int, str, np.ndarray], Encoded],
                 every_s: float = 10.0) -> None:
        self.plan, self.controller, self.encode_one = plan, controller, encode
        self.every_s = every_s
        self.input_only = [i for i, c in enumerate(plan.candidates) if c.edge is None and not c.local]
        self._sized_at = [-math.inf] * len(plan.candidates)

    def mark(self, i: int) -> None:
        """Candidate ``i``'s frame was encoded for the wire just now (its size is fresh)."""
        self._sized_at[i] = time.monotonic()

    def due(self, only_unmeasured: bool = False) -> list[int]:
        """The all-cloud candidates to size on this frame (and marks them)."""
        now = time.monotonic()
        due = [i for i in self.input_only if not (only_unmeasured and self._sized_at[i] > -math.inf)
               and now - self._sized_at[i] >= self.every_s]
        for i in due:
            self._sized_at[i] = now
        return due

    def encode(self, due: list[int], inputs: Mapping[str, np.ndarray]) -> dict[int, dict[str, Encoded]]:
        return {i: {t.name: self.encode_one(i, t.name, inputs[t.name]) for t in self.plan.candidates[i].cut}
                for i in due}

    def observe(self, encoded: dict[int, dict[str, Encoded]]) -> None:
        """The sizes to the controller (the candidates' byte ratios)."""
        for i, enc in encoded.items():
            self.controller.observe_bytes(i, sum(e.nbytes for e in enc.values()))
