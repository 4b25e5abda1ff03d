"""The cloud service: finishes the compute for many edge devices at once.

One :class:`CloudService` loads plans (hashes verified), accepts edge connections over TCP
(+TLS) and WebRTC — each served from its hello to its bye by :mod:`~splitinfer.cloud.connection`
— batches requests per (plan, candidate) (:mod:`~splitinfer.cloud.batcher`), runs cloud segments
on onnxruntime (:mod:`~splitinfer.cloud.sessions`), and drains and stops cleanly. Bad frames get
an error frame naming the problem; the service keeps serving everyone else. An HTTP port serves ``/healthz``, ``/readyz``, ``/metrics``, ``/v1/plans`` and
the WebRTC signalling endpoint ``/v1/webrtc/offer``.

>>> async with CloudService(["plans/yolo-n"], listen=("0.0.0.0", 7000)) as svc:   # doctest: +SKIP
...     await svc.wait_closed()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..errors import ChannelClosed, ChannelError, PlanError, SplitinferError
from ..postprocess import POSTPROCESSORS
from ..splitter.plan import Candidate, Plan
from ..transport import wire
from ..transport.channel import Channel
from ..transport.budget import PartialBudget
from ..transport.ratelimit import RateLimiter
from ..transport.tcp import DEFAULT_FRAME_IDLE_S, DEFAULT_PARTIAL_BYTES, TcpServer, default_max_connections, server_ssl_context
from .batcher import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE, DEFAULT_MAX_QUEUE_DELAY_MS, Batcher
from .connection import Connection, Served
from .metrics import Metrics
from .sessions import SessionPool

__all__ = ["CloudService", "load_tokens", "HELLO_TIMEOUT_S"]

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0  # a connection whose hello has not arrived whole by then is closed
IDLE_TIMEOUT_S = 120.0  # a connection that sends nothing for this long is closed (edges ping every few s)


def load_tokens(path: str | os.PathLike[str]) -> set[str]:
    """One token per line; blank lines and ``#`` comments ignored."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise SplitinferError(f"--token-file {path}: {exc.strerror or exc}") from exc
    tokens = {ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")}
    if not tokens:
        raise SplitinferError(f"--token-file {path}: no tokens in it (expected one per line)")
    return tokens


class CloudService:
    def __init__(self, plans: Sequence[str | os.PathLike[str] | Plan], *,
                 listen: tuple[str, int] = ("127.0.0.1", 7000), http: tuple[str, int] | None = ("127.0.0.1", 8000),
                 tokens: Collection[str] | None = None, tls_cert: str | None = None, tls_key: str | None = None,
                 advertise: bool = True, name: str | None = None,
                 max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, max_queue_delay_ms: float = DEFAULT_MAX_QUEUE_DELAY_MS,
                 max_queue: int = DEFAULT_MAX_QUEUE, max_sessions: int = 16, workers: int | None = None,
                 providers: Sequence[str] | None = None, threads: int | None = None,
                 postprocess: Mapping[str, str] | str | None = None, limits: wire.Limits = wire.DEFAULT_LIMITS,
                 max_connections: int | None = None, max_rows: int | None = None,
                 hello_timeout_s: float = HELLO_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_partial_bytes: int = DEFAULT_PARTIAL_BYTES, frame_idle_s: float = DEFAULT_FRAME_IDLE_S) -> None:
        if not plans:
            raise PlanError("the cloud service needs at least one plan")
        self.plans: dict[str, Served] = {}
        for p in plans:
            plan = p if isinstance(p, Plan) else Plan.load(p)
            pp = postprocess if isinstance(postprocess, str) else (postprocess or {}).get(plan.hash)
            if pp is not None and pp not in POSTPROCESSORS:
                raise SplitinferError(f"unknown post-processing {pp!r}; expected one of {sorted(POSTPROCESSORS)}")
            if pp == "yolo" and (len(plan.outputs) != 1 or len(plan.outputs[0].shape) != 3):
                raise SplitinferError(f"plan {plan.name} ({plan.hash[:12]}): yolo post-processing needs one output "
                                      f"(B, 4 + classes, N), the plan has {[list(t.shape) for t in plan.outputs]}")
            self.plans[plan.hash] = Served(plan, pp)
        self.listen, self.http_addr = listen, http
        self.tokens = set(tokens) if tokens else None
        self.tls = (tls_cert, tls_key) if tls_cert or tls_key else None
        if self.tls and not (tls_cert and tls_key):
            raise SplitinferError("TLS needs both --tls-cert and --tls-key")
        self.advertise = advertise
        self.name = name or f"splitinfer-{socket.gethostname()}"
        self.batch_opts = {"max_batch_size": max_batch_size, "max_queue_delay_ms": max_queue_delay_ms,
                           "max_queue": max_queue}
        self.limits = limits
        self.max_connections = max_connections or default_max_connections()
        self.max_rows = max_rows or max_batch_size  # rows one request may carry (batch-dynamic cuts)
        if self.max_rows < 1:
            raise SplitinferError(f"max_rows must be >= 1, got {self.max_rows}")
        self.hello_timeout_s, self.idle_timeout_s, self.frame_idle_s = hello_timeout_s, idle_timeout_s, frame_idle_s
        self._budget = PartialBudget(max_partial_bytes)
        self._run_options = ort.RunOptions()  # terminate=True stops runs that outlast a shutdown's drain
        self._shrink = ort.RunOptions()  # after a multi-row batch the arena gives its memory back
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self.pool = SessionPool(max_sessions, providers=providers, threads=threads)
        self.metrics = Metrics()
        self._workers = workers or max(2, min(8, os.cpu_count() or 2))
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._batchers: dict[tuple[str, str], Batcher] = {}
        self._tcp: TcpServer | None = None
        self._http_runner: Any = None
        self._webrtc: Any = None
        self._advertiser: Any = None
        self._channels: set[Channel] = set()
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._infer_tasks: set[asyncio.Task[None]] = set()
        self._loop_handler: Any = None
        self._closed = asyncio.Event()
        self.state = "new"  # new -> running -> stopping -> stopped
        self.port = 0
        self.http_port = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "CloudService":
        if self.state != "new":
            raise RuntimeError(f"cannot start a service in state {self.state!r}")
        if self.tokens is None and not _is_loopback(self.listen[0]):
            log.warning("serving on %s without a token: any client that knows a plan hash may use this service "
                        "(give tokens, e.g. --token-file)", self.listen[0])
        self._executor = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="splitinfer-cloud")
        self._install_log_limiter()
        try:
            await self._warm_up()
            ssl = server_ssl_context(*self.tls) if self.tls else None  # type: ignore[arg-type]
            # Until a hello is accepted a connection may send only small frames (HELLO_LIMITS).
            self._tcp = await TcpServer.start(self._handle_tcp, self.listen[0], self.listen[1], ssl=ssl,
                                              limits=wire.HELLO_LIMITS, max_connections=self.max_connections,
                                              budget=self._budget,  # one budget for TCP and WebRTC
                                              frame_idle_s=self.frame_idle_s)
            self.port = self._tcp.port
            if self.http_addr is not None:
                await self._start_http()
        except ChannelError as exc:
            await self._abort_start()
            what = "--http" if "HTTP" in str(exc) else "--listen"
            raise ChannelError(f"{exc} ({what})") from exc
        except BaseException:
            await self._abort_start()
            raise
        if self.advertise:
            await self._start_advertising()
        self.state = "running"
        return self

    async def _abort_start(self) -> None:
        if self._tcp is not None:
            await self._tcp.aclose()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._restore_log_handler()
        self.state = "stopped"
        self._closed.set()

    def _install_log_limiter(self) -> None:
        """Errors the event loop reports for sockets (accept failing at the fd limit, say) are logged
        at a bounded rate: a flood of connections must not become a flood of log lines."""
        loop = asyncio.get_running_loop()
        limiter = RateLimiter(every_s=1.0, burst=5)
        previous = loop.get_exception_handler()
        self._loop_handler = (loop, previous)

        def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if limiter.allow():
                if limiter.suppressed:
                    context = {**context, "message": f"{context.get('message')} "
                                                     f"({limiter.suppressed} similar messages suppressed)"}
                    limiter.suppressed = 0
                (previous or (lambda lp_, ctx: lp_.default_exception_handler(ctx)))(lp, context)

        loop.set_exception_handler(handler)

    def _restore_log_handler(self) -> None:
        if self._loop_handler is not None:
            loop, previous = self._loop_handler
            with contextlib.suppress(Exception):
                loop.set_exception_handler(previous)
            self._loop_handler = None

    async def _warm_up(self) -> None:
        """Load and run each cloud segment once (up to the session limit) before accepting edges,
        so no edge's first frame pays for session creation and misses its deadline."""
        loop = asyncio.get_running_loop()
        jobs = [(h, c) for h, s in self.plans.items() for c in s.plan.candidates if c.cloud is not None]
        for h, cand in jobs[: self.pool.max_loaded]:
            plan = self.plans[h].plan
            assert cand.cloud is not None
            path = str(plan.file(cand.cloud))
            feeds = {t.name: np.zeros(t.shape, t.dtype) for t in cand.cut}

            def run(key: tuple[str, str] = (h, cand.id), path: str = path,
                    feeds: dict[str, np.ndarray] = feeds) -> None:
                self.pool.get(key, path).run(None, feeds, self._run_options)

            await loop.run_in_executor(self._executor, run)
        self.metrics.sessions.set(self.pool.loaded)

    async def _start_http(self) -> None:
        from aiohttp import web

        from .httpapi import make_app

        webrtc = None
        try:
            from ..transport.webrtc import WebRtcAcceptor

            webrtc = self._webrtc = WebRtcAcceptor(self._handle_webrtc, limits=wire.HELLO_LIMITS,
                                                   max_peers=max(1, min(256, self.max_connections // 4)),
                                                   budget=self._budget)
        except ImportError:  # pragma: no cover - the webrtc extra is absent
            pass
        self._http_runner = web.AppRunner(make_app(self, webrtc), access_log=None)
        await self._http_runner.setup()
        site = web.TCPSite(self._http_runner, self.http_addr[0], self.http_addr[1])  # type: ignore[index]
        try:
            await site.start()
        except OSError as exc:
            raise ChannelError(f"cannot listen for HTTP on {self.http_addr[0]}:{self.http_addr[1]}: "  # type: ignore[index]
                               f"{exc.strerror or exc}") from exc
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _start_advertising(self) -> None:
        from ..transport.discovery import Advertiser

        host = self.listen[0]
        if host in ("0.0.0.0", ""):
            host = _primary_address()
        url = f"http://{host}:{self.http_port}/v1/webrtc/offer" if self.http_port else None
        try:
            self._advertiser = await Advertiser.start(self.name, port=self.port, plans=list(self.plans), host=host,
                                                      webrtc_url=url, token_required=self.tokens is not None,
                                                      tls=self.tls is not None)
        except Exception as exc:  # discovery is a convenience: never fatal
            log.warning("zeroconf advertising failed: %s", exc)

    async def stop(self, *, drain_s: float = 5.0) -> None:
        """Stop accepting, finish what is queued (at most ``drain_s``), answer every request still
        open (its result, or an error ``shutdown``), say bye on every channel and close them.
        Never raises for a drain that ran out of time: runs still going are terminated."""
        if self.state in ("stopping", "stopped", "new"):
            if self.state == "new":
                self.state = "stopped"
                self._closed.set()
            return
        self.state = "stopping"
        if self._advertiser is not None:
            with contextlib.suppress(Exception):
                await self._advertiser.aclose()
        if self._tcp is not None:
            self._tcp.stop_accepting()  # open connections keep being served while draining
        if self._webrtc is not None:
            self._webrtc._closing = True  # no new peers
        batchers = list(self._batchers.values())
        drained = asyncio.ensure_future(asyncio.gather(*(b.aclose(drain=True) for b in batchers),
                                                       return_exceptions=True))
        done, _ = await asyncio.wait({drained}, timeout=drain_s)
        if not done:  # out of time: stop the runs still going; their requests are answered "shutdown"
            self._run_options.terminate = True
            for b in batchers:
                b.abandon("the service is shutting down")
            await asyncio.wait({drained}, timeout=2.0)
        drained.add_done_callback(lambda f: f.cancelled() or f.exception())
        for b in batchers:
            b.cancel()
        if self._infer_tasks:  # every open request sends its reply (or its error) before the bye
            await asyncio.wait(set(self._infer_tasks), timeout=2.0)
        for ch in list(self._channels):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ch.send(wire.Bye("shutdown")), 1.0)
        if self._tcp is not None:
            await self._tcp.aclose()
        if self._webrtc is not None:
            await self._webrtc.aclose()
        for t in [*self._conn_tasks, *self._infer_tasks]:
            t.cancel()
        await asyncio.gather(*self._conn_tasks, *self._infer_tasks, return_exceptions=True)
        if self._http_runner is not None:
            with contextlib.suppress(Exception):
                await self._http_runner.cleanup()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self.pool.clear()
        self._restore_log_handler()
        self.state = "stopped"
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> "CloudService":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def addresses(self) -> dict[str, str]:
        scheme = "tls" if self.tls else "tcp"
        out = {"edge": f"{scheme}://{self.listen[0]}:{self.port}"}
        if self.http_port:
            base = f"http://{self.http_addr[0]}:{self.http_port}"  # type: ignore[index]
            out.update(http=base, metrics=f"{base}/metrics", webrtc=f"{base}/v1/webrtc/offer")
        return out

    # ------------------------------------------------------------------ connections
    async def _handle_tcp(self, ch: Channel) -> None:
        await self._serve(ch, "tls" if self.tls else "tcp")

    async def _handle_webrtc(self, ch: Channel) -> None:
        await self._serve(ch, "webrtc")

    async def _serve(self, ch: Channel, transport: str) -> None:
        """One connection (:class:`~splitinfer.cloud.connection.Connection`), known to the service
        until it ends: its channel gets a bye at shutdown, its requests are drained."""
        task = asyncio.current_task()
        if task is not None:
            self._conn_tasks.add(task)
        self._channels.add(ch)
        gauge = self.metrics.connections.labels(transport)
        gauge.inc()
        try:
            await Connection(self, ch, track=self._track_request).run()
        except ChannelClosed:
            pass
        finally:
            gauge.dec()
            self._channels.discard(ch)
            if task is not None:
                self._conn_tasks.discard(task)
            await ch.aclose()

    def _track_request(self, task: asyncio.Task[None]) -> None:
        self._infer_tasks.add(task)
        task.add_done_callback(self._infer_tasks.discard)

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the service's worker threads (post-processing, off the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------ inference
    def batcher(self, plan: Plan, cand: Candidate) -> Batcher:
        """The (plan, candidate) batcher, made when first asked for."""
        key = (plan.hash, cand.id)
        b = self._batchers.get(key)
        if b is None:
            assert cand.cloud is not None and self._executor is not None
            path = str(plan.file(cand.cloud))
            outputs = list(cand.cloud.outputs)

            def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                sess = self.pool.get(key, path)
                self.metrics.sessions.set(self.pool.loaded)
                rows = next(iter(feeds.values())).shape[0] if feeds else 1
                opts = self._run_options if rows <= 1 or self._run_options.terminate else self._shrink
                return dict(zip(outputs, sess.run(outputs, feeds, opts)))

            depth = self.metrics.queue_depth.labels(plan.hash[:12], cand.id)
            b = self._batchers[key] = Batcher(run, self._executor, batchable=cand.cloud.batch_dynamic,
                                              max_rows=max(self.max_rows, self.batch_opts["max_batch_size"]),
                                              on_depth=depth.set, **self.batch_opts)
        return b

    # ------------------------------------------------------------------ status
    def plans_json(self) -> list[dict[str, Any]]:
        return [{"plan_hash": h, "name": s.plan.name, "postprocess": s.postprocess,
                 "inputs": [t.to_json() for t in s.plan.inputs], "outputs": [t.to_json() for t in s.plan.outputs],
                 "candidates": [{"id": c.id, "kind": c.kind, "cut": [t.to_json() for t in c.cut],
                                 "batch_dynamic": bool(c.cloud and c.cloud.batch_dynamic)} for c in s.plan.candidates]}
                for h, s in self.plans.items()]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _primary_address() -> str:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
        return str(s.getsockname()[0])
    return "127.0.0.1"
