"""A byte budget for partly received frames, shared by every connection of one server."""

from __future__ import annotations

from typing import Protocol

from ..errors import LimitError

__all__ = ["PartialBudget", "Holder"]


class Holder(Protocol):
    """A connection that holds partial-frame bytes and can be dropped."""

    def drop(self, exc: BaseException) -> None: ...


class PartialBudget:
    """Bytes held in partly received frames, across every connection of a server.

    A receive buffer grows with the bytes that actually arrived (never to a declared length), and
    each growth is charged here; when the budget is spent, the connection holding the most is
    dropped (a peer that sends a lot and never finishes a frame loses, not the one that needs a
    little more)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._holders: dict[Holder, int] = {}

    def charge(self, proto: Holder, nbytes: int) -> bool:
        """Charge ``nbytes`` more to ``proto``; False if ``proto`` itself must go."""
        while self.held + nbytes > self.limit and self._holders:
            biggest = max(self._holders, key=self._holders.__getitem__)
            if biggest is proto or self._holders[biggest] <= self._holders.get(proto, 0) + nbytes:
                return False
            biggest.drop(LimitError(f"{self.held} bytes of partial frames held on this server (limit "
                                     f"{self.limit}); dropping the connection holding the most"))
            self.release(biggest)  # (drop releases it too; never loop on a holder that did not)
        self.held += nbytes
        self._holders[proto] = self._holders.get(proto, 0) + nbytes
        return True

    def release(self, proto: Holder) -> None:
        self.held -= self._holders.pop(proto, 0)
