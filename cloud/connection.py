"""One edge's connection to the cloud service, from its hello to its bye.

The first frame must be a hello (protocol version, plan hash, token — compared in constant time)
within the service's ``hello_timeout_s`` and under ``HELLO_LIMITS``; anything else is refused with
a reason and nothing is decoded or computed. Then the channel's limits widen and requests are
taken: each is checked against the plan's cut with its tensors still encoded
(:func:`~splitinfer.cloud.admission.check_request`), decoded (a JPEG becomes the model input by
the plan's pixel format), batched per (plan, candidate), post-processed when the edge asked for
it at hello, and answered with the server's receive, queue and compute times. Content errors get
an error frame and keep the connection; broken framing closes it; a connection idle for
``idle_timeout_s`` gets a bye. The service's life cycle (start, HTTP, advertising, drain and
stop) is :mod:`~splitinfer.cloud.service`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import __version__
from .._types import PixelFormat
from ..errors import ChannelClosed, ProtocolError
from ..postprocess import POSTPROCESSORS, postprocess
from ..splitter.plan import Plan
from ..transport import wire
from ..transport.channel import Channel
from .admission import RequestError, check_request
from .batcher import Busy, DeadlineExceeded

if TYPE_CHECKING:  # pragma: no cover
    from .service import CloudService

__all__ = ["Connection", "Served", "MAX_INFLIGHT_PER_CONNECTION"]

log = logging.getLogger(__name__)

MAX_INFLIGHT_PER_CONNECTION = 64  # requests one edge may have open; beyond: "busy"


@dataclass
class Served:
    """A plan as served to one edge: the post-processing agreed at its hello (or the service's)."""

    plan: Plan
    postprocess: str | None

    @property
    def pixels(self) -> dict[str, PixelFormat]:
        """How each image input's camera pixels become the model input (for JPEG frames)."""
        return {t.name: t.pixels for t in self.plan.inputs if t.pixels is not None}


class Connection:
    """Serves one channel for ``service``: what it reads of the service is its configuration
    (plans, tokens, limits, timeouts), its state, its metrics, its batchers and its executor."""

    def __init__(self, service: "CloudService", ch: Channel,
                 track: Callable[[asyncio.Task[None]], None] = lambda t: None) -> None:
        self.svc, self.ch, self.track = service, ch, track  # track: each request's task, for the drain

    async def run(self) -> None:
        """The hello, then requests until a bye, the idle timeout or the channel's end."""
        served = await self._hello()
        if served is not None:
            await self._requests(served)

    async def _hello(self) -> Served | None:
        svc, ch = self.svc, self.ch
        try:
            msg = await asyncio.wait_for(ch.recv(tensors=False), svc.hello_timeout_s)
        except asyncio.TimeoutError:
            svc.metrics.errors.labels("refused_hello_timeout").inc()
            return None
        except ProtocolError as exc:
            await self._refuse("protocol", f"expected a hello frame: {exc}")
            return None
        if not isinstance(msg, wire.Hello):
            await self._refuse("protocol", f"expected a hello frame first, got {msg.KIND!r}")
            return None
        if msg.protocol != wire.PROTOCOL_VERSION:
            await self._refuse("version", f"protocol version {msg.protocol} is not served; this service speaks "
                                          f"version {wire.PROTOCOL_VERSION}")
            return None
        served = svc.plans.get(msg.plan_hash)
        if served is None:
            await self._refuse("plan", f"plan {msg.plan_hash[:16]}… is not served here; served plans: "
                                       f"{[h[:16] for h in svc.plans]}")
            return None
        if svc.tokens is not None and not any(hmac.compare_digest((msg.token or "").encode(), t.encode())
                                              for t in svc.tokens):
            await self._refuse("token", "missing token" if not msg.token else "the token is not accepted")
            return None
        if msg.postprocess is not None:  # the edge names its output format: every frame the same, wherever it ran
            if msg.postprocess and msg.postprocess not in POSTPROCESSORS:
                await self._refuse("postprocess", f"post-processing {msg.postprocess!r} is not known here; "
                                                  f"known: {sorted(POSTPROCESSORS)}")
                return None
            served = dataclasses.replace(served, postprocess=msg.postprocess or None)
        ch.set_limits(svc.limits)  # a known peer: frames with tensors from now on
        await ch.send(wire.Welcome(uuid.uuid4().hex[:12], server=f"splitinfer {__version__} {svc.name}",
                                   max_frame=svc.limits.max_frame, postprocess=served.postprocess or ""))
        return served

    async def _refuse(self, reason: str, message: str) -> None:
        self.svc.metrics.errors.labels(f"refused_{reason}").inc()
        with contextlib.suppress(Exception):
            await self.ch.send(wire.Refusal(reason, message))

    async def _requests(self, served: Served) -> None:
        svc, ch = self.svc, self.ch
        inflight: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(ch.recv(tensors=False), svc.idle_timeout_s)
                except asyncio.TimeoutError:
                    svc.metrics.errors.labels("idle_timeout").inc()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(ch.send(wire.Bye(f"idle for {svc.idle_timeout_s:g} s")), 1.0)
                    return
                except ProtocolError as exc:
                    if ch.closed:  # the framing broke: the channel is gone
                        return
                    await self._error(None, "protocol", str(exc))
                    continue
                if isinstance(msg, wire.InferRequest):
                    if len(inflight) >= MAX_INFLIGHT_PER_CONNECTION:
                        await self._error(msg.request_id, "busy",
                                          f"{len(inflight)} requests already open on this connection")
                        continue
                    t = asyncio.create_task(self._infer(served, msg))
                    inflight.add(t)
                    t.add_done_callback(inflight.discard)
                    self.track(t)
                elif isinstance(msg, wire.Ping):
                    await ch.send(wire.Pong(msg.seq, msg.sent_at, recv_ms=msg.info.seconds * 1e3 if msg.info else 0.0,
                                            nbytes=msg.info.nbytes if msg.info else 0))
                elif isinstance(msg, wire.Bye):
                    return
                else:
                    await self._error(None, "protocol", f"unexpected {msg.KIND!r} frame after the hello")
        finally:
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)

    async def _error(self, request_id: int | None, code: str, message: str) -> None:
        self.svc.metrics.errors.labels(code).inc()
        with contextlib.suppress(ChannelClosed):
            await self.ch.send(wire.Error(request_id, code, message))

    async def _infer(self, served: Served, req: wire.InferRequest) -> None:
        svc = self.svc
        received = req.info.end if req.info else time.monotonic()
        recv_ms = req.info.seconds * 1e3 if req.info else 0.0
        plan = served.plan
        try:
            cand = check_request(served.plan, req, svc.max_rows)
            svc.metrics.requests.labels(plan.hash[:12], cand.id).inc()
            if svc.state != "running":
                raise RequestError("shutdown", "the service is shutting down")
            try:
                # a JPEG becomes the model input; a bottleneck's latent is decoded with the plan's tables
                req.tensors = wire.decode_tensors(req.tensors, served.pixels, cand.tables)
            except ProtocolError as exc:
                raise RequestError("bad_request", str(exc)) from None
            deadline = received + req.deadline_ms / 1e3 if req.deadline_ms is not None else None
            if deadline is not None and time.monotonic() > deadline:
                raise RequestError("deadline", f"the deadline ({req.deadline_ms:.1f} ms) passed on arrival")
            try:
                res = await svc.batcher(plan, cand).submit(req.tensors, deadline=deadline)
            except Busy as exc:
                raise RequestError("busy" if svc.state == "running" else "shutdown", str(exc)) from None
            except DeadlineExceeded as exc:
                raise RequestError("deadline", str(exc)) from None
            outputs = cand.finish(req.tensors, res.outputs, plan.output_names)
            if served.postprocess:
                outputs = await svc.offload(postprocess, served.postprocess, outputs)
            svc.metrics.queue.observe(res.queue_s)
            svc.metrics.compute.observe(res.compute_s)
            svc.metrics.batch_size.observe(res.batch_size)
            result = wire.Result(req.request_id, outputs, codec=req.result_codec,
                                 timings=wire.ServerTimings(recv_ms, res.queue_s * 1e3, res.compute_s * 1e3,
                                                            res.batch_size))
            await self.ch.send(result)
            svc.metrics.latency.labels(plan.hash[:12], cand.id).observe(time.monotonic() - received)
        except RequestError as exc:
            await self._error(req.request_id, exc.code, str(exc))
        except ChannelClosed:
            pass
        except Exception as exc:  # a bug or a runtime failure: the sender hears of it, others go on
            if svc.state != "running":  # a run terminated by the shutdown
                await self._error(req.request_id, "shutdown", "the service is shutting down")
                return
            log.exception("request %s failed", req.request_id)
            await self._error(req.request_id, "internal", f"{type(exc).__name__}: {exc}")
