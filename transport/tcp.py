"""TCP (optionally TLS) channels: frames with a u32 length prefix over asyncio.

The receive side is an :class:`asyncio.BufferedProtocol`: the kernel copies each frame straight
into a buffer of the frame's size (no intermediate joins), which is then decoded in place, and
the arrival time of each frame's first and last byte is recorded as the bytes come, not when the
application gets round to reading them, so the bandwidth monitor's samples are honest. Complete
frames queue up to a bound, beyond which reading pauses (TCP backpressure to the sender).

>>> server = await TcpServer.start(handler, "127.0.0.1", 0)       # doctest: +SKIP
>>> ch = await TcpChannel.connect("127.0.0.1", server.port)        # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl as _ssl
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ChannelClosed, ChannelError, LimitError
from .channel import Channel
from .wire import DEFAULT_LIMITS, FrameInfo, Limits, Message, decode, encode

log = logging.getLogger(__name__)

__all__ = ["TcpChannel", "TcpServer", "server_ssl_context", "client_ssl_context"]

_LEN = struct.Struct(">I")
_QUEUE_BYTES = 64 << 20  # received, undecoded frames held before reading pauses


def server_ssl_context(certfile: str, keyfile: str) -> _ssl.SSLContext:
    ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def client_ssl_context(cafile: str | None = None, *, verify: bool = True) -> _ssl.SSLContext:
    """Verify the server against ``cafile`` (or the system store); ``verify=False`` only for tests."""
    ctx = _ssl.create_default_context(cafile=cafile)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = _ssl.CERT_NONE
    return ctx


class _FrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self._head = bytearray(4)
        self._head_fill = 0
        self._frame: bytearray | None = None
        self._fill = 0
        self._first = 0.0
        self.frames: collections.deque[tuple[bytearray, FrameInfo]] = collections.deque()
        self._queued = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None  # framing error or connection loss
        self.lost = asyncio.get_running_loop().create_future()
        self._can_write = asyncio.Event()
        self._can_write.set()

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is None:
            return memoryview(self._head)[self._head_fill:]
        return memoryview(self._frame)[self._fill:]

    def buffer_updated(self, nbytes: int) -> None:
        now = time.monotonic()
        if self._frame is None:
            if self._head_fill == 0:
                self._first = now
            self._head_fill += nbytes
            if self._head_fill < 4:
                return
            (n,) = _LEN.unpack(self._head)
            self._head_fill = 0
            if n == 0 or n > self.limits.max_frame:
                self._fail(LimitError(f"frame length {n} is outside (0, {self.limits.max_frame}]; "
                                      "the framing is broken, closing the connection"))
                return
            self._frame, self._fill = bytearray(n), 0
            return
        self._fill += nbytes
        if self._fill == len(self._frame):
            frame, self._frame = self._frame, None
            self.frames.append((frame, FrameInfo(len(frame) + 4, self._first, now)))
            self._queued += len(frame)
            if self._queued > _QUEUE_BYTES and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = ChannelClosed(f"connection lost: {exc}" if exc else "the peer closed the connection")
        if not self.lost.done():
            self.lost.set_result(None)
        self._can_write.set()
        self._wake()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- helpers
    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_frame(self) -> tuple[bytearray, FrameInfo]:
        while not self.frames:
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        frame, info = self.frames.popleft()
        self._queued -= len(frame)
        if self._paused and self._queued <= _QUEUE_BYTES // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return frame, info

    async def drain(self) -> None:
        await self._can_write.wait()


class TcpChannel(Channel):
    """One TCP (or TLS) connection carrying frames. Make one with :meth:`connect`, or receive one
    in a :class:`TcpServer` handler."""

    def __init__(self, protocol: _FrameProtocol, peer: str) -> None:
        self._p = protocol
        self.peer = peer
        self.limits = protocol.limits
        self._closing = False

    @classmethod
    async def connect(cls, host: str, port: int, *, ssl: _ssl.SSLContext | None = None,
                      server_hostname: str | None = None, timeout: float = 10.0,
                      limits: Limits = DEFAULT_LIMITS) -> "TcpChannel":
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(
                lambda: _FrameProtocol(limits), host, port, ssl=ssl,
                server_hostname=server_hostname if ssl else None), timeout)
        except (OSError, asyncio.TimeoutError, _ssl.SSLError) as exc:
            raise ChannelError(f"cannot connect to {'tls' if ssl else 'tcp'}://{host}:{port}: "
                               f"{exc or type(exc).__name__}") from exc
        return cls(proto, f"{'tls' if ssl else 'tcp'}://{host}:{port}")

    @property
    def closed(self) -> bool:
        return self._closing or self._p.error is not None

    async def send(self, msg: Message) -> FrameInfo:
        if self.closed or self._p.transport is None:
            raise ChannelClosed(f"{self!r}: send on a closed channel") from self._p.error
        start = time.monotonic()
        buffers = encode(msg)
        total = sum(memoryview(b).nbytes for b in buffers)
        if total > self.limits.max_frame:
            raise LimitError(f"{type(msg).__name__} frame of {total} bytes is over the limit {self.limits.max_frame}")
        self._p.transport.writelines([_LEN.pack(total), *buffers])
        await self._p.drain()
        if self._p.error is not None:
            raise ChannelClosed(f"{self!r}: connection lost while sending") from self._p.error
        return FrameInfo(total + 4, start, time.monotonic())

    async def recv(self) -> Message:
        frame, info = await self._p.next_frame()
        return decode(frame, limits=self.limits, info=info)

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        t = self._p.transport
        if t is not None and not t.is_closing():
            t.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._p.lost), 2.0)
        if t is not None and not self._p.lost.done():
            t.abort()


Handler = Callable[[TcpChannel], Awaitable[None]]


class TcpServer:
    """Accepts TCP (or TLS) connections and runs ``handler(channel)`` for each in its own task.
    ``aclose()`` stops accepting, closes every channel and waits for the handlers."""

    def __init__(self) -> None:
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: set[TcpChannel] = set()
        self.host, self.port = "", 0

    @classmethod
    async def start(cls, handler: Handler, host: str = "127.0.0.1", port: int = 0, *,
                    ssl: _ssl.SSLContext | None = None, limits: Limits = DEFAULT_LIMITS) -> "TcpServer":
        self = cls()
        loop = asyncio.get_running_loop()

        def factory() -> _FrameProtocol:
            proto = _FrameProtocol(limits)
            orig = proto.connection_made

            def made(transport: asyncio.BaseTransport) -> None:
                orig(transport)
                peer = transport.get_extra_info("peername") or ("?", 0)
                ch = TcpChannel(proto, f"{'tls' if ssl else 'tcp'}://{peer[0]}:{peer[1]}")
                self._channels.add(ch)
                task = loop.create_task(self._run(handler, ch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

            proto.connection_made = made  # type: ignore[method-assign]
            return proto

        try:
            self._server = await loop.create_server(factory, host, port, ssl=ssl)
        except OSError as exc:
            raise ChannelError(f"cannot listen on {host}:{port}: {exc}") from exc
        sock = self._server.sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        return self

    async def _run(self, handler: Handler, ch: TcpChannel) -> None:
        try:
            await handler(ch)
        except ChannelClosed:
            pass  # the peer went away: the normal end of a connection
        except Exception:
            log.exception("handler for %s failed", ch.peer)
        finally:
            await ch.aclose()
            self._channels.discard(ch)

    @property
    def connections(self) -> int:
        return len(self._channels)

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections keep being served."""
        if self._server is not None:
            self._server.close()

    async def aclose(self) -> None:
        self.stop_accepting()
        for ch in list(self._channels):
            await ch.aclose()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def __aenter__(self) -> "TcpServer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
