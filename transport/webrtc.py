"""WebRTC data-channel channels (aiortc): the NAT-friendly option; TCP is the fast default.

Signalling is one HTTP POST: the edge sends its SDP offer (``{"sdp": ..., "type": "offer"}``) to
the cloud's signalling URL and gets the answer in the reply. :class:`WebRtcAcceptor` is the
cloud's side: its :meth:`~WebRtcAcceptor.handle_offer` turns an offer into an answer, and
:meth:`~WebRtcAcceptor.aiohttp_handler` mounts it on an aiohttp app.

A data-channel message holds at most 256 KiB here, so frames travel in chunks: the first starts
with ``F`` and the frame's u32 length, the rest with ``C``; the channel is ordered and reliable
and one frame's chunks are sent together, so reassembly needs no more. Sending waits while more
than ``high_water`` bytes are buffered, until the ``bufferedamountlow`` event. Needs the
``webrtc`` extra (aiortc, aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ChannelClosed, ChannelError, FrameError, LimitError
from .budget import PartialBudget
from .channel import Channel
from .wire import DEFAULT_LIMITS, FrameInfo, Limits, Message, decode, encode

__all__ = ["WebRtcChannel", "WebRtcAcceptor", "CHUNK_BYTES"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 * 1024 - 16  # one data-channel message, with room for the chunk header
_HIGH_WATER = 4 << 20  # buffered bytes above which send() waits
_LOW_WATER = 1 << 20  # ... until the buffer drains to this
_QUEUE_BYTES = 64 << 20  # received frames not yet read, beyond which the peer is dropped
_LEN = struct.Struct(">I")


class WebRtcChannel(Channel):
    def __init__(self, pc: Any, dc: Any, peer: str, limits: Limits = DEFAULT_LIMITS,
                 budget: PartialBudget | None = None) -> None:
        self._pc, self._dc = pc, dc
        self.peer, self.limits = peer, limits
        self._frames: deque[tuple[bytearray, FrameInfo]] = deque()
        self._queued = 0
        self._partial: bytearray | None = None  # grows chunk by chunk, never to the declared length at once
        self._want = 0
        self._budget = budget
        self._first = 0.0
        self._error: BaseException | None = None
        self._wake = asyncio.Event()
        self._low = asyncio.Event()
        self._low.set()
        self._send_lock = asyncio.Lock()
        self._closing = False
        dc.bufferedAmountLowThreshold = _LOW_WATER
        dc.on("message", self._on_message)
        dc.on("close", lambda: self._fail(ChannelClosed(f"{peer}: the data channel closed")))
        dc.on("bufferedamountlow", self._low.set)

        @pc.on("connectionstatechange")
        def _state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._fail(ChannelClosed(f"{peer}: peer connection {pc.connectionState}"))

    # ---------------------------------------------------------------- receive side
    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._low.set()
        self._wake.set()

    def _on_message(self, data: Any) -> None:
        now = time.monotonic()
        if not isinstance(data, (bytes, bytearray)) or not data:
            self._broken(f"a {type(data).__name__} message; frames are binary chunks")
            return
        tag = data[:1]
        if tag == b"F":
            if self._partial is not None or len(data) < 5:
                self._broken("a first chunk inside another frame, or a first chunk without a length")
                return
            (n,) = _LEN.unpack_from(data, 1)
            if n == 0 or n > self.limits.max_frame:
                self._broken(f"frame length {n} outside (0, {self.limits.max_frame}]")
                return
            self._partial, self._want, self._first = bytearray(), n, now
            body = memoryview(data)[5:]
        elif tag == b"C" and self._partial is not None:
            body = memoryview(data)[1:]
        else:
            self._broken(f"chunk tag {bytes(tag)!r} out of sequence")
            return
        if len(self._partial) + len(body) > self._want:
            self._broken("chunks overrun the frame length")
            return
        if self._budget is not None and not self._budget.charge(self, len(body)):
            self._broken(f"{self._budget.held} bytes of partial frames held on this server "
                         f"(limit {self._budget.limit})")
            return
        if self._queued + self._want > _QUEUE_BYTES:
            self._broken(f"{self._queued} bytes of frames received and not yet read")
            return
        self._partial += body
        if len(self._partial) == self._want:
            frame, self._partial = self._partial, None
            if self._budget is not None:
                self._budget.release(self)
            self._frames.append((frame, FrameInfo(len(frame) + 5, self._first, now)))
            self._queued += len(frame)
            self._wake.set()

    def _broken(self, what: str) -> None:
        err = LimitError if "outside" in what or "held" in what or "not yet read" in what else FrameError
        self.drop(err(f"{self.peer}: broken chunk framing: {what}; closing the channel"))

    def drop(self, exc: BaseException) -> None:
        """Close the channel for ``exc``, freeing what it holds at once."""
        self._fail(exc)
        self._partial = None
        self._frames.clear()
        self._queued = 0
        if self._budget is not None:
            self._budget.release(self)
        if not self._closing:
            asyncio.ensure_future(self.aclose())

    @property
    def closed(self) -> bool:
        return self._closing or self._error is not None

    async def recv(self, *, tensors: bool = True) -> Message:
        while not self._frames:
            if self._error is not None:
                raise self._error
            self._wake.clear()
            await self._wake.wait()
        frame, info = self._frames.popleft()
        self._queued -= len(frame)
        return decode(frame, limits=self.limits, info=info, tensors=tensors)

    # ---------------------------------------------------------------- send side
    async def send(self, msg: Message) -> FrameInfo:
        if self.closed:
            raise ChannelClosed(f"{self!r}: send on a closed channel") from self._error
        start = time.monotonic()
        data = b"".join(bytes(b) if not isinstance(b, bytes) else b for b in encode(msg))
        if len(data) > self.limits.max_frame:
            raise LimitError(f"{type(msg).__name__} frame of {len(data)} bytes is over the limit {self.limits.max_frame}")
        view = memoryview(data)
        async with self._send_lock:  # one frame's chunks go out together
            first = True
            for off in range(0, len(data), CHUNK_BYTES):
                while self._dc.bufferedAmount > _HIGH_WATER and not self.closed:
                    self._low.clear()
                    await self._low.wait()
                if self.closed:
                    raise ChannelClosed(f"{self!r}: closed while sending") from self._error
                head = b"F" + _LEN.pack(len(data)) if first else b"C"
                self._dc.send(head + view[off:off + CHUNK_BYTES].tobytes())
                first = False
        return FrameInfo(len(data) + 5, start, time.monotonic())

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._fail(ChannelClosed(f"{self.peer}: closed"))
        self._partial = None
        if self._budget is not None:
            self._budget.release(self)
        with contextlib.suppress(Exception):
            self._dc.close()
        with contextlib.suppress(Exception):
            await self._pc.close()

    # ---------------------------------------------------------------- connecting
    @classmethod
    async def connect(cls, signaling_url: str, *, timeout: float = 15.0, limits: Limits = DEFAULT_LIMITS,
                      headers: dict[str, str] | None = None) -> "WebRtcChannel":
        """Offer to the cloud at ``signaling_url`` (HTTP POST) and wait for the data channel to open."""
        try:
            import aiohttp
            from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ChannelError("WebRTC needs the webrtc extra: pip install 'splitinfer[webrtc]'") from exc
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        dc = pc.createDataChannel("splitinfer", ordered=True)
        opened = asyncio.Event()
        dc.on("open", opened.set)
        ch = cls(pc, dc, f"webrtc:{signaling_url}", limits)
        try:
            await pc.setLocalDescription(await pc.createOffer())
            offer = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
                async with http.post(signaling_url, json=offer, headers=headers or {}) as resp:
                    if resp.status != 200:
                        raise ChannelError(f"signalling at {signaling_url} answered HTTP {resp.status}: "
                                           f"{(await resp.text())[:200]}")
                    answer = await resp.json()
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
            await asyncio.wait_for(opened.wait(), timeout)
        except ChannelError:
            await ch.aclose()
            raise
        except Exception as exc:
            await ch.aclose()
            raise ChannelError(f"cannot open a WebRTC data channel via {signaling_url}: "
                               f"{exc or type(exc).__name__}") from exc
        return ch


class WebRtcAcceptor:
    """The answering side: one peer connection per offer; ``on_channel(channel)`` runs in its own
    task once the edge's data channel arrives. ``aclose()`` closes them all.

    Every peer connection is bounded: at most ``max_peers`` at once (more offers are refused with
    :class:`~splitinfer.errors.LimitError`), one that has not opened its data channel within
    ``open_timeout_s`` is closed, and so is one whose connection fails (its UDP sockets go with it)."""

    def __init__(self, on_channel: Callable[[WebRtcChannel], Awaitable[None]], *,
                 limits: Limits = DEFAULT_LIMITS, max_peers: int = 64, open_timeout_s: float = 15.0,
                 budget: PartialBudget | None = None) -> None:
        self.on_channel, self.limits = on_channel, limits
        self.max_peers, self.open_timeout_s = max_peers, open_timeout_s
        self._budget = budget
        self._pcs: set[Any] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: set[WebRtcChannel] = set()
        self._closing = False

    @property
    def peers(self) -> int:
        """Peer connections open now (with or without a data channel)."""
        return len(self._pcs)

    async def handle_offer(self, offer: dict[str, Any]) -> dict[str, str]:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        if not isinstance(offer, dict) or offer.get("type") != "offer" or not isinstance(offer.get("sdp"), str):
            raise ValueError('expected {"sdp": "...", "type": "offer"}')
        if len(offer["sdp"]) > 64 << 10:
            raise ValueError(f"an SDP offer of {len(offer['sdp'])} characters; the limit is {64 << 10}")
        if self._closing:
            raise LimitError("the service is shutting down")
        if len(self._pcs) >= self.max_peers:
            raise LimitError(f"{len(self._pcs)} WebRTC peers open, the limit; try again later")
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._pcs.add(pc)
        opened = asyncio.Event()

        @pc.on("datachannel")
        def _on_dc(dc: Any) -> None:
            if opened.is_set():  # one data channel per peer connection
                dc.close()
                return
            opened.set()
            ch = WebRtcChannel(pc, dc, f"webrtc-peer:{id(pc):x}", self.limits, self._budget)
            self._channels.add(ch)
            task = asyncio.ensure_future(self._run(ch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        @pc.on("connectionstatechange")
        async def _state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self._close_pc(pc)

        async def _watchdog() -> None:  # a peer that never opens its data channel is not kept
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(opened.wait(), self.open_timeout_s)
            if not opened.is_set():
                await self._close_pc(pc)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer["sdp"], type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            await self._close_pc(pc)
            raise ValueError(f"the offer cannot be answered: {exc}") from exc
        task = asyncio.ensure_future(_watchdog())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}

    async def _close_pc(self, pc: Any) -> None:
        self._pcs.discard(pc)
        with contextlib.suppress(Exception):
            await pc.close()

    async def _run(self, ch: WebRtcChannel) -> None:
        try:
            await self.on_channel(ch)
        except ChannelClosed:
            pass
        except Exception:
            log.exception("handler for %s failed", ch.peer)
        finally:
            await ch.aclose()
            self._channels.discard(ch)
            await self._close_pc(ch._pc)

    async def aiohttp_handler(self, request: Any) -> Any:
        """``POST`` handler for aiohttp: JSON offer in, JSON answer out (400 on a bad offer, 503
        when full)."""
        from aiohttp import web

        try:
            offer = await request.json()
            return web.json_response(await self.handle_offer(offer))
        except LimitError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)

    @property
    def connections(self) -> int:
        return len(self._channels)

    async def aclose(self) -> None:
        self._closing = True
        for ch in list(self._channels):
            await ch.aclose()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pc in list(self._pcs):
            await self._close_pc(pc)
        self._pcs.clear()
