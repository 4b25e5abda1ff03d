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
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ChannelClosed, ChannelError, LimitError, TlsError
from .budget import PartialBudget
from .channel import Channel
from .ratelimit import RateLimiter
from .wire import DEFAULT_LIMITS, FrameInfo, Limits, Message, decode, encode

log = logging.getLogger(__name__)

__all__ = ["TcpChannel", "TcpServer", "server_ssl_context", "client_ssl_context", "default_max_connections"]

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


_FIRST_CHUNK = 64 << 10  # a frame's receive buffer starts at most this big and doubles as bytes come


class _FrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, limits: Limits, *, budget: PartialBudget | None = None, frame_idle_s: float | None = None,
                 on_made: Callable[["_FrameProtocol", asyncio.BaseTransport], None] | None = None) -> None:
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self._head = bytearray(4)
        self._head_fill = 0
        self._frame: bytearray | None = None  # the frame being received: grows as its bytes arrive
        self._want = 0  # its declared length
        self._fill = 0
        self._first = 0.0
        self._budget = budget
        self._frame_idle_s = frame_idle_s
        self._idle_timer: asyncio.TimerHandle | None = None
        self._on_made = on_made
        self.frames: collections.deque[tuple[bytearray, FrameInfo]] = collections.deque()
        self._queued = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None  # framing error or connection loss
        self._loop = asyncio.get_running_loop()
        self.lost = self._loop.create_future()
        self._can_write = asyncio.Event()
        self._can_write.set()

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        on_made, self._on_made = self._on_made, None
        if on_made is not None:
            on_made(self, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is None:
            return memoryview(self._head)[self._head_fill:]
        if self._fill == len(self._frame):  # full but not complete: grow, charged to the budget
            size = min(self._want, 2 * len(self._frame))
            if self._budget is not None and not self._budget.charge(self, size - len(self._frame)):
                self._fail(LimitError(f"{self._budget.held} bytes of partial frames held on this server "
                                      f"(limit {self._budget.limit}); this frame wants {self._want}"))
                return memoryview(bytearray(max(sizehint, 4096)))  # a sink for what is already in flight
            grown = bytearray(size)
            grown[:self._fill] = self._frame
            self._frame = grown
        return memoryview(self._frame)[self._fill:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.error is not None:
            return
        now = time.monotonic()
        self._touch()
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
            first = min(n, _FIRST_CHUNK)
            if self._budget is not None and not self._budget.charge(self, first):
                self._fail(LimitError(f"{self._budget.held} bytes of partial frames held on this server "
                                      f"(limit {self._budget.limit})"))
                return
            self._frame, self._want, self._fill = bytearray(first), n, 0
            return
        self._fill += nbytes
        if self._fill == self._want:
            frame, self._frame = self._frame, None
            if self._budget is not None:
                self._budget.release(self)
            self.frames.append((frame, FrameInfo(len(frame) + 4, self._first, now)))
            self._queued += len(frame)
            if self._queued > _QUEUE_BYTES and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake()

    def _touch(self) -> None:
        """(Re)arm the timer that drops a connection stalled in the middle of a frame."""
        if self._frame_idle_s is None:
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self._loop.call_later(self._frame_idle_s, self._stalled)

    def _stalled(self) -> None:
        self._idle_timer = None
        if self._frame is not None or self._head_fill:
            self._fail(LimitError(f"no byte for {self._frame_idle_s:g} s in the middle of a frame "
                                  f"({self._fill} of {self._want or '?'} bytes); closing the connection"))

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = ChannelClosed(f"connection lost: {exc}" if exc else "the peer closed the connection")
        # A clean close keeps the frames that arrived whole before it (a last result, a bye): they
        # are delivered before the close is. A broken connection, or one we failed, frees them too.
        self._release(keep_frames=exc is None)
        if not self.lost.done():
            self.lost.set_result(None)
        self._can_write.set()
        self._wake()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- helpers
    def _release(self, *, keep_frames: bool = False) -> None:
        """Free what a dead connection holds at once: its partial frame and (unless ``keep_frames``)
        its queued frames."""
        self._frame = None
        if not keep_frames:
            self.frames.clear()
            self._queued = 0
        if self._budget is not None:
            self._budget.release(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def drop(self, exc: BaseException) -> None:
        """Close the connection for ``exc`` (a :class:`PartialBudget` drops its biggest holder)."""
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._release()
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_frame(self) -> tuple[bytearray, FrameInfo]:
        while not self.frames:
            if self.error is not None:
                # a fresh exception each time: raising the stored one would tie its traceback (and
                # this frame, and self) into a reference cycle that keeps the connection's memory
                raise type(self.error)(*self.error.args)
            self._waiter = self._loop.create_future()
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
                      limits: Limits = DEFAULT_LIMITS, frame_idle_s: float | None = None) -> "TcpChannel":
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(
                lambda: _FrameProtocol(limits, frame_idle_s=frame_idle_s), host, port, ssl=ssl,
                server_hostname=server_hostname if ssl else None), timeout)
        except _ssl.SSLCertVerificationError as exc:
            raise TlsError(f"cannot connect to tls://{host}:{port}: the server's certificate is not trusted "
                           f"({exc.verify_message or exc}); pass the CA that signed it (--cafile)") from exc
        except _ssl.SSLError as exc:
            raise TlsError(f"cannot connect to tls://{host}:{port}: TLS handshake failed: "
                           f"{exc.reason or exc}") from exc
        except (OSError, asyncio.TimeoutError) as exc:
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

    async def recv(self, *, tensors: bool = True) -> Message:
        frame, info = await self._p.next_frame()
        return decode(frame, limits=self.limits, info=info, tensors=tensors)

    def set_limits(self, limits: Limits) -> None:
        self.limits = self._p.limits = limits

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

DEFAULT_PARTIAL_BYTES = 256 << 20  # partial frames held by one server, all connections together
DEFAULT_FRAME_IDLE_S = 20.0  # a connection silent this long in the middle of a frame is dropped


def default_max_connections() -> int:
    """Half the process's file-descriptor limit (the rest is for files, HTTP, WebRTC), at most 4096."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return 1024
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft // 2))


class TcpServer:
    """Accepts TCP (or TLS) connections and runs ``handler(channel)`` for each in its own task.
    ``aclose()`` stops accepting, closes every channel and waits for the handlers.

    Bounded by construction: at most ``max_connections`` at once (more are closed on accept),
    receive buffers that grow with the bytes that arrived, at most ``max_partial_bytes`` held in
    partial frames across all connections, and a connection that stalls for ``frame_idle_s`` in
    the middle of a frame is dropped."""

    def __init__(self) -> None:
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: set[TcpChannel] = set()
        self.host, self.port = "", 0
        self.max_connections = 0
        self.rejected = 0  # connections closed on accept because the server was full

    @classmethod
    async def start(cls, handler: Handler, host: str = "127.0.0.1", port: int = 0, *,
                    ssl: _ssl.SSLContext | None = None, limits: Limits = DEFAULT_LIMITS,
                    max_connections: int | None = None, max_partial_bytes: int = DEFAULT_PARTIAL_BYTES,
                    budget: PartialBudget | None = None,
                    frame_idle_s: float | None = DEFAULT_FRAME_IDLE_S) -> "TcpServer":
        self = cls()
        self.max_connections = max_connections or default_max_connections()
        loop = asyncio.get_running_loop()
        budget = budget or PartialBudget(max_partial_bytes)  # (a budget given may be shared with others)
        scheme = "tls" if ssl else "tcp"
        # The factory and callbacks hold the server weakly: a closed connection's protocol, its
        # buffers and its channel are freed at once, not when the garbage collector finds a cycle.
        ref = weakref.ref(self)

        def made(proto: _FrameProtocol, transport: asyncio.BaseTransport) -> None:
            server = ref()
            if server is None or len(server._channels) >= server.max_connections:
                if server is not None:
                    server._rejected()
                transport.abort()
                return
            peer = transport.get_extra_info("peername") or ("?", 0)
            ch = TcpChannel(proto, f"{scheme}://{peer[0]}:{peer[1]}")
            server._channels.add(ch)
            task = loop.create_task(server._run(handler, ch))
            server._tasks.add(task)
            task.add_done_callback(server._tasks.discard)

        def factory() -> _FrameProtocol:
            return _FrameProtocol(limits, budget=budget, frame_idle_s=frame_idle_s, on_made=made)

        try:
            self._server = await loop.create_server(factory, host, port, ssl=ssl, backlog=256)
        except OSError as exc:
            raise ChannelError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        sock = self._server.sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        self._budget = budget
        return self

    def _rejected(self) -> None:
        self.rejected += 1
        if _log_limiter.allow():
            log.warning("%d connections open, the limit (max_connections); closing new ones (%d so far)",
                        len(self._channels), self.rejected)

    @property
    def partial_bytes(self) -> int:
        """Bytes held in partly received frames now."""
        return self._budget.held

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


_log_limiter = RateLimiter()
