"""An in-memory channel pair for tests: real frames (encoded and decoded by the wire format)
through bounded queues, no sockets."""

from __future__ import annotations

import asyncio
import time

from ..errors import ChannelClosed
from .channel import Channel
from .wire import DEFAULT_LIMITS, FrameInfo, Limits, Message, decode, encode_bytes

__all__ = ["MemoryChannel", "memory_pair"]

_CLOSED = object()


class MemoryChannel(Channel):
    def __init__(self, inbox: "asyncio.Queue[object]", outbox: "asyncio.Queue[object]", peer: str,
                 limits: Limits) -> None:
        self._inbox, self._outbox = inbox, outbox
        self.peer, self.limits = peer, limits
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, msg: Message) -> FrameInfo:
        if self._closed:
            raise ChannelClosed(f"{self!r}: send on a closed channel")
        start = time.monotonic()
        frame = encode_bytes(msg)
        info = FrameInfo(len(frame), start, time.monotonic())
        await self._outbox.put((frame, info))
        return info

    async def recv(self, *, tensors: bool = True) -> Message:
        if self._closed:
            raise ChannelClosed(f"{self!r}: recv on a closed channel")
        item = await self._inbox.get()
        if item is _CLOSED:
            self._closed = True
            raise ChannelClosed(f"{self!r}: the peer closed the channel")
        frame, info = item  # type: ignore[misc]
        return decode(frame, limits=self.limits, info=info, tensors=tensors)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._outbox.put_nowait(_CLOSED)
            except asyncio.QueueFull:
                pass


def memory_pair(*, maxsize: int = 64, limits: Limits = DEFAULT_LIMITS) -> tuple[MemoryChannel, MemoryChannel]:
    """Two connected channels; each direction holds at most ``maxsize`` frames (backpressure)."""
    a_to_b: asyncio.Queue[object] = asyncio.Queue(maxsize + 1)
    b_to_a: asyncio.Queue[object] = asyncio.Queue(maxsize + 1)
    return MemoryChannel(b_to_a, a_to_b, "memory:b", limits), MemoryChannel(a_to_b, b_to_a, "memory:a", limits)
