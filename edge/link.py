"""The edge's link to the cloud and its supervision: one connection at a time (zeroconf for
``auto``, TCP, TLS, WebRTC), the hello, a reader that routes replies to per-request futures with
their tensors still encoded, the active prober, and reconnects with backoff. Why the cloud is not
connected (not found, refused, an untrusted certificate, unreachable) is kept in words.

>>> link = CloudLink(plan, "tcp://10.0.0.5:7000", monitor=BandwidthMonitor())   # doctest: +SKIP
>>> link.start(); await link.wait_connected(5.0)                                  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from ..errors import ChannelClosed, ChannelError, RefusedError, SplitinferError, TlsError
from ..splitter.plan import Plan
from ..transport import wire
from ..transport.bandwidth import BandwidthMonitor
from ..transport.prober import ActiveProber
from ..transport.channel import Channel
from .replies import BadReply

__all__ = ["CloudLink"]

log = logging.getLogger(__name__)

_MAX_PENDING = 256  # replies awaited at once; older ones (frames long finished locally) are dropped


class CloudLink:
    """Keeps one connection to the cloud for ``plan`` and carries requests over it.

    ``on_pong`` is called for every pong (the breaker's half-open probe); ``postprocess`` is the
    output format this edge asks for at hello ("" for the model's own outputs): the cloud's
    welcome confirms it, and :attr:`postprocessed` is what its results will carry."""

    def __init__(self, plan: Plan, url: str, *, monitor: BandwidthMonitor, token: str | None = None,
                 cafile: str | None = None, client_id: str = "edge", connect_timeout_s: float = 5.0,
                 postprocess: str = "", on_pong: Callable[[], None] | None = None) -> None:
        self.plan, self.url, self.monitor = plan, url, monitor
        self.token, self.cafile, self.client_id = token, cafile, client_id
        self.connect_timeout_s = connect_timeout_s
        self.postprocess = postprocess
        self.on_pong = on_pong
        self.channel: Channel | None = None
        self.prober: ActiveProber | None = None
        self.refused: RefusedError | None = None
        self.last_error: str | None = None  # why the cloud is not connected, in words
        self.reconnects = 0
        self._probe_bytes = 0  # probe padding sent on connections that have ended (see probe_bytes)
        self.postprocessed = ""  # what the connected cloud's results carry (its welcome says)
        self._pending: dict[int, asyncio.Future[wire.Message]] = {}
        self._ids = itertools.count(1)
        self._up = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._supervise())

    async def wait_connected(self, timeout_s: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout_s)
        return self.connected

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        ch = self.channel
        if ch is not None:
            with contextlib.suppress(Exception):
                await ch.send(wire.Bye("edge closing"))
            await ch.aclose()
        for t in (self._task, self._probe_task):
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in (self._task, self._probe_task) if t is not None), return_exceptions=True)

    @property
    def connected(self) -> bool:
        return self.channel is not None and not self.channel.closed

    def why_not(self) -> str:
        """Why a frame cannot go to the cloud now, for a fallback reason."""
        return f"cloud unavailable: {self.last_error}" if self.last_error else "cloud unavailable"

    # ------------------------------------------------------------------ requests
    def expect(self) -> tuple[int, asyncio.Future[wire.Message]]:
        """A new request id and the future its reply (or its failure) will land in."""
        rid = next(self._ids)
        fut: asyncio.Future[wire.Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        while len(self._pending) > _MAX_PENDING:  # replies that never came
            self._pending.pop(next(iter(self._pending))).cancel()
        return rid, fut

    def forget(self, rid: int) -> None:
        self._pending.pop(rid, None)

    @property
    def probe_bytes(self) -> int:
        """The probes' padding sent so far, every connection's: uplink bytes beyond the frames'."""
        return self._probe_bytes + (self.prober.sent_bytes if self.prober is not None else 0)

    def probe_sends_in_flight(self) -> list[tuple[float, int]]:
        """(seconds since sent, bytes) of each probe not yet answered."""
        return self.prober.sends_in_flight() if self.prober is not None else []

    def recent_probes(self) -> list[tuple[float, int, float | None]]:
        """(seconds since sent, bytes, seconds since answered or None) of the last probes."""
        return self.prober.recent_sends() if self.prober is not None else []

    # ------------------------------------------------------------------ connection
    async def _resolve_url(self) -> str:
        if self.url != "auto":
            return self.url
        from ..transport.discovery import discover

        found = await discover(plan_hash=self.plan.hash, first=True, timeout=3.0)
        if not found:
            raise ChannelError(f"no cloud service for plan {self.plan.hash[:12]} found by zeroconf")
        svc = found[0]
        # TLS is this agent's decision: an advertisement may ask for it, never turn it off
        return f"{'tls' if (svc.tls or self.cafile) else 'tcp'}://{svc.host}:{svc.port}"

    async def _open(self) -> Channel:
        url = await self._resolve_url()
        u = urlparse(url)
        if u.scheme in ("tcp", "tls"):
            from ..transport.tcp import TcpChannel, client_ssl_context

            ssl = client_ssl_context(self.cafile) if u.scheme == "tls" else None
            ch: Channel = await TcpChannel.connect(u.hostname or "127.0.0.1", u.port or 7000, ssl=ssl,
                                                   server_hostname=u.hostname, timeout=self.connect_timeout_s)
        elif u.scheme == "webrtc":
            from ..transport.webrtc import WebRtcChannel

            ch = await WebRtcChannel.connect(f"http://{u.hostname}:{u.port or 8000}/v1/webrtc/offer",
                                             timeout=self.connect_timeout_s,
                                             headers={"Authorization": f"Bearer {self.token}"} if self.token else None)
        else:
            raise ChannelError(f"cloud URL {url!r}: expected auto, tcp://, tls:// or webrtc://")
        await ch.send(wire.Hello(self.plan.hash, self.client_id, token=self.token, postprocess=self.postprocess))
        reply = await asyncio.wait_for(ch.recv(), self.connect_timeout_s)
        if isinstance(reply, wire.Refusal):
            await ch.aclose()
            raise RefusedError(f"the cloud refused the hello: {reply.message}", reply.reason)
        if not isinstance(reply, wire.Welcome):
            await ch.aclose()
            raise ChannelError(f"expected a welcome, got {reply.KIND!r}")
        if reply.postprocess != self.postprocess:  # an older cloud that post-processes its own way
            await ch.aclose()
            raise RefusedError(f"the cloud's results carry {reply.postprocess or 'the model outputs'!r}, this edge "
                               f"asked for {self.postprocess or 'the model outputs'!r}", "postprocess")
        self.postprocessed = reply.postprocess
        return ch

    async def _supervise(self) -> None:
        """Keep a connection: connect, read until it drops, reconnect with backoff."""
        backoff = 0.1
        while not self._closing:
            try:
                ch = await self._open()
            except RefusedError as exc:
                self.refused = exc
                self._note_error(str(exc), warn=True)
                backoff = 5.0
            except TlsError as exc:
                self._note_error(str(exc), warn=True)
                backoff = 5.0
            except (ChannelError, OSError, asyncio.TimeoutError, SplitinferError) as exc:
                self._note_error(f"cloud not reachable: {exc or type(exc).__name__}")
            else:
                self.refused = None
                self.last_error = None
                backoff = 0.1
                self.channel = ch
                self._up.set()
                self.prober = prober = ActiveProber(self.monitor, ch.send, busy=lambda: bool(self._pending))
                self._probe_task = asyncio.ensure_future(prober.run())
                try:
                    await self._read(ch)
                finally:
                    self._probe_task.cancel()
                    self._probe_bytes += prober.sent_bytes
                    self.prober = None  # its unanswered probes were on a connection that is gone
                    self.channel = None
                    self._up.clear()
                    for fut in self._pending.values():
                        if not fut.done():
                            fut.set_exception(ChannelClosed("the connection to the cloud was lost"))
                    await ch.aclose()
                if not self._closing:
                    self._note_error("the connection to the cloud was lost")
                self.reconnects += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _note_error(self, message: str, *, warn: bool = False) -> None:
        """Remember why the cloud is not connected (results say it); warn once per new reason."""
        if message != self.last_error:
            (log.warning if warn else log.info)("%s", message)
        self.last_error = message

    async def _read(self, ch: Channel) -> None:
        while True:
            try:
                msg = await ch.recv(tensors=False)  # checked against the plan before decoding (replies.py)
            except ChannelClosed:
                return
            except wire.ProtocolError as exc:
                if ch.closed:
                    return
                rid = getattr(exc, "request_id", None)
                fut = self._pending.pop(rid, None) if rid is not None else None
                if fut is not None and not fut.done():  # a reply for a known request that breaks the rules
                    fut.set_exception(BadReply(str(exc)))
                else:
                    log.warning("bad frame from the cloud: %s", exc)
                continue
            if isinstance(msg, (wire.Result, wire.Error)) and msg.request_id is not None:
                fut = self._pending.pop(msg.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
                # else: a late reply for a frame already finished locally; dropped
            elif isinstance(msg, wire.Pong):
                if self.prober is not None:
                    self.prober.on_pong(msg)
                if self.on_pong is not None:
                    self.on_pong()
            elif isinstance(msg, wire.Bye):
                return


def consume(fut: "asyncio.Future[Any]") -> None:
    """Mark a future's exception as seen: a reply future may fail after nobody waits for it."""
    if not fut.cancelled():
        fut.exception()
