"""The all-cloud candidates' wire size, measured on real frames while they are not in use.

An all-cloud candidate sends the camera frame itself (a JPEG of it, for an image input); its size
is the cost model's byte ratio for that candidate. Encoding a frame costs the device real time (a
640x640 JPEG is ~80 ms of a 0.37-core device: at 2 fps, sampled every 10 s it added ~4 ms to the
average frame), so it is sampled once at the first frame, then every ``every_s`` seconds while
the call is close (an all-cloud candidate predicted within ``close`` times the chosen one) and
every ``far_every_s`` otherwise: a frame's size matters to the choice only when the cloud is near
it, and the plan's own measurement is the prior until then.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..splitter.plan import Plan
from ..codecs import Encoded
from .controller import Controller

__all__ = ["InputSizes"]


class InputSizes:
    """When each all-cloud candidate (``input_only``) was last sized, and the sizing itself."""

    def __init__(self, plan: Plan, controller: Controller, encode: Callable[[int, str, np.ndarray], Encoded],
                 every_s: float = 10.0, far_every_s: float = 60.0, close: float = 1.5) -> None:
        self.plan, self.controller, self.encode_one = plan, controller, encode
        self.every_s, self.far_every_s, self.close = every_s, far_every_s, close
        self.input_only = [i for i, c in enumerate(plan.candidates) if c.edge is None and not c.local]
        self._sized_at = [-math.inf] * len(plan.candidates)

    def mark(self, i: int) -> None:
        """Candidate ``i``'s frame was encoded for the wire just now (its size is fresh)."""
        self._sized_at[i] = time.monotonic()

    def due(self, only_unmeasured: bool = False, predicted: Sequence[float] | None = None,
            chosen_ms: float | None = None, now: float | None = None) -> list[int]:
        """The all-cloud candidates to size on this frame (and marks them): with ``predicted`` (every
        candidate's predicted ms) and ``chosen_ms`` (the frame's choice), a candidate predicted far
        from the choice is sized every ``far_every_s`` instead of ``every_s``."""
        now = time.monotonic() if now is None else now

        def interval(i: int) -> float:
            if predicted is None or chosen_ms is None or predicted[i] <= self.close * chosen_ms:
                return self.every_s
            return self.far_every_s

        due = [i for i in self.input_only if not (only_unmeasured and self._sized_at[i] > -math.inf)
               and now - self._sized_at[i] >= interval(i)]
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
