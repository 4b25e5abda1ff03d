"""A circuit breaker for the cloud: after ``threshold`` failures in a row it opens (frames stay
on the edge), and after a cool-down it lets one probe through (half-open); success closes it,
failure opens it again for twice as long, up to ``max_cooldown_s``."""

from __future__ import annotations

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    def __init__(self, *, threshold: int = 3, cooldown_s: float = 0.5, max_cooldown_s: float = 8.0) -> None:
        self.threshold, self.base, self.max = threshold, cooldown_s, max_cooldown_s
        self.failures = 0
        self.cooldown = cooldown_s
        self.opened_at: float | None = None
        self.trips = 0

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if now - self.opened_at >= self.cooldown else "open"

    def allows(self, now: float) -> bool:
        """May a frame (or probe) go to the cloud now?"""
        return self.state(now) != "open"

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.cooldown = self.base

    def failure(self, now: float) -> None:
        if self.opened_at is not None:  # a failed probe: open again, longer
            self.cooldown = min(self.cooldown * 2, self.max)
            self.opened_at = now
            return
        self.failures += 1
        if self.failures >= self.threshold:
            self.opened_at = now
            self.trips += 1
