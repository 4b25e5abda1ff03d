"""The channel abstraction: an ordered, reliable, bidirectional stream of messages.

A channel kind (``tcp.py``, ``webrtc.py``, ``memory.py``) implements four things: ``send``,
``recv``, ``aclose`` and ``closed``. Every received message carries a
:class:`~splitinfer.transport.wire.FrameInfo` (bytes, first- and last-byte times) in ``msg.info``,
and ``send`` returns one, which is what the bandwidth monitor needs.

A frame whose *content* is malformed makes ``recv`` raise the decoder's
:class:`~splitinfer.errors.ProtocolError` and the channel stays usable; broken *framing* (a
length over the limit, a chunk out of order) closes the channel, since nothing after it can be
trusted.
"""

from __future__ import annotations

import abc
from types import TracebackType

from .wire import DEFAULT_LIMITS, FrameInfo, Limits, Message

__all__ = ["Channel"]


class Channel(abc.ABC):
    limits: Limits = DEFAULT_LIMITS
    peer: str = ""  # the other end, for messages and logs

    @abc.abstractmethod
    async def send(self, msg: Message) -> FrameInfo:
        """Send one message; returns when it is handed to the network (flow control respected).
        Raises :class:`~splitinfer.errors.ChannelClosed` if the channel is closed."""

    @abc.abstractmethod
    async def recv(self, *, tensors: bool = True) -> Message:
        """The next message, with ``info`` set. Raises :class:`~splitinfer.errors.ChannelClosed`
        when the peer closed, or a :class:`~splitinfer.errors.ProtocolError` for a bad frame.
        With ``tensors=False`` tensor payloads stay encoded (see :func:`~splitinfer.transport.wire.decode`)."""

    def set_limits(self, limits: Limits) -> None:
        """What frames received from now on may be (a server widens them once a hello is accepted)."""
        self.limits = limits

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the channel; safe to call twice."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    async def __aenter__(self) -> "Channel":
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.peer or '?'} {state}>"
