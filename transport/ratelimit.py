"""A token bucket for log lines that a peer can trigger (accept errors, bad frames)."""

from __future__ import annotations

import time

__all__ = ["RateLimiter"]


class RateLimiter:
    """At most ``burst`` events, then one per ``every_s`` seconds: for log lines a peer can trigger."""

    def __init__(self, every_s: float = 1.0, burst: int = 5) -> None:
        self.every_s, self.burst = every_s, burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self.suppressed = 0

    def allow(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) / self.every_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.suppressed += 1
        return False
