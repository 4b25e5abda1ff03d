"""The edge agent: runs the edge segment on the device, sends the cut tensors, picks the cut for
every frame, and finishes the frame itself when the cloud is slow or gone. Every input gets
exactly one result, in order.

>>> async with EdgeAgent(Plan.load("plans/yolo-n"), cloud="tcp://10.0.0.5:7000") as agent:   # doctest: +SKIP
...     r = await agent.infer({"input": frame})
...     async for r in agent.stream(frames):
...         print(r.index, r.candidate, r.timings["total_ms"], r.fallback)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlparse

import numpy as np

from ..errors import ChannelClosed, ChannelError, PlanError, RefusedError, SourceError, SplitinferError, TlsError
from ..postprocess import postprocess as run_postprocess
from ..splitter.cost_model import CostModel
from ..splitter.plan import Candidate, Plan
from ..transport import wire
from ..transport.bandwidth import ActiveProber, BandwidthMonitor
from ..transport.channel import Channel
from ..transport.codecs import Encoded, encode_tensor
from .breaker import CircuitBreaker
from .controller import Controller
from .replies import BadReply, reply_outputs
from .result import FrameResult
from .runtime import Backend, OrtBackend

__all__ = ["EdgeAgent", "SyncEdgeAgent"]

log = logging.getLogger(__name__)

_MIN_WAIT_S = 0.03  # the shortest a frame waits for the cloud before the device starts on it too
_MAX_WAIT_S = 3.0  # the longest, whatever the prediction
_RACE_LOST = "raced: the device was first"  # an exploring frame the device finished first (not a fault)
_POSTPROCESSED_BYTES = 2048.0  # a prior for a post-processed result (a few dozen detections)


def nominal_ratio(codec: str) -> float:
    """A prior for wire bytes / raw fp32 bytes until a candidate's real size is measured: without
    it a never-tried candidate would be predicted at raw size and never tried (jpeg: a 640x640
    camera frame is ~1-3 % of its fp32 tensor; activations compress less than that)."""
    base, _, comp = codec.partition("+")
    ratio = {"raw": 1.0, "fp16": 0.5, "int8": 0.25, "jpeg": 0.03}.get(base, 1.0)
    return ratio * (0.7 if comp else 1.0)


class EdgeAgent:
    """Split inference on the edge device. ``cloud`` is ``"auto"`` (zeroconf), ``tcp://host:port``,
    ``tls://host:port``, ``webrtc://host:port`` (the cloud's HTTP port), or None (all local).
    ``candidate`` pins one cut (an id, or ``edge``/``cloud``) instead of adapting."""

    def __init__(self, plan: Plan | str, cloud: str | None = "auto", *, token: str | None = None,
                 codec: str = "fp16", input_codec: str | None = None, policy: str = "latency",
                 latency_budget_ms: float | None = None, candidate: str | None = None, max_inflight: int = 2,
                 postprocess: str | None = None, threads: int | None = None, edge_slowdown: float = 1.0,
                 monitor: BandwidthMonitor | None = None, connect_timeout_s: float = 5.0,
                 cafile: str | None = None, client_id: str = "edge", emulate_slowdown: float = 1.0,
                 downlink_mbps: float | None = None, warmup: bool = True) -> None:
        self.plan = plan if isinstance(plan, Plan) else Plan.load(plan)
        self.cloud_url, self.token, self.client_id = cloud, token, client_id
        self.codec, self.input_codec = codec, input_codec or codec
        self.pinned = self._resolve(candidate) if candidate else None
        self.max_inflight = max(1, max_inflight)
        self.postprocess = postprocess
        self.threads = threads
        self.emulate_slowdown = emulate_slowdown  # see OrtBackend: a fast machine standing in for a slow device
        self.downlink_mbps = downlink_mbps  # None: assume the uplink's rate for results coming back
        self.warmup = warmup
        # a frame waits hedge_factor x its predicted network-and-cloud time + hedge_margin_ms for
        # the cloud, then the device starts finishing it as well
        self.hedge_factor, self.hedge_margin_ms = 1.3, 30.0
        self.cafile = cafile
        self.connect_timeout_s = connect_timeout_s
        cm = CostModel.from_plan(self.plan, edge_slowdown=edge_slowdown)
        self.controller = Controller(cm, policy=policy, latency_budget_ms=latency_budget_ms)
        self.monitor = monitor or BandwidthMonitor()
        self.breaker = CircuitBreaker(max_cooldown_s=4.0)
        self.local = [i for i, c in enumerate(self.plan.candidates) if c.local]
        # all-cloud candidates (the cut is model inputs): their wire size is measured on real frames
        # even while they are not used, since encoding an image costs a few ms on any device
        self._input_only = [i for i, c in enumerate(self.plan.candidates) if c.edge is None and not c.local]
        self._whole = self._whole_index()  # the all-edge candidate that runs the whole model, if any
        if self._whole is not None and self._input_only:  # exploring between these is raced (_process_frame)
            self.controller.cheap_explore = {self._whole, *self._input_only}
        self._sized_at = [-float("inf")] * len(self.plan.candidates)
        self.size_every_s = 2.0
        self._prior_ratio = [nominal_ratio(self.input_codec if c.edge is None else self.codec)
                             for c in self.plan.candidates]
        self._backends: dict[str, Backend] = {}
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="splitinfer-edge")
        self._ch: Channel | None = None
        self._pending: dict[int, asyncio.Future[wire.Message]] = {}
        self._ids = itertools.count(1)
        self._frames = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._connected = asyncio.Event()
        self._closing = False
        self._prober: ActiveProber | None = None
        self._inflight_bytes = 0  # sent to the cloud, not yet answered
        self.refused: RefusedError | None = None
        self.last_error: str | None = None  # why the cloud is not connected, in words (TLS, refusal, ...)
        self.reconnects = 0
        self._postprocessed = ""  # what the connected cloud's results carry (its welcome says)

    def _resolve(self, cid: str) -> int:
        ids = [c.id for c in self.plan.candidates]
        if cid not in ids:
            raise PlanError(f"no candidate {cid!r}; the candidates are {ids}")
        return ids.index(cid)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "EdgeAgent":
        if self.cloud_url is not None:
            self._spawn(self._supervise())
        if self.warmup:  # meanwhile the connection comes up
            await asyncio.get_running_loop().run_in_executor(self._executor, self._warm)
        if self.cloud_url is not None:
            with contextlib.suppress(asyncio.TimeoutError):  # not fatal: frames run locally meanwhile
                await asyncio.wait_for(self._connected.wait(), self.connect_timeout_s)
        return self

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        ch = self._ch
        if ch is not None:
            with contextlib.suppress(Exception):
                await ch.send(wire.Bye("edge closing"))
            await ch.aclose()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> "EdgeAgent":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    @property
    def connected(self) -> bool:
        return self._ch is not None and not self._ch.closed

    # ------------------------------------------------------------------ connection
    async def _open(self) -> Channel:
        url = self.cloud_url
        if url == "auto":
            from ..transport.discovery import discover

            found = await discover(plan_hash=self.plan.hash, first=True, timeout=3.0)
            if not found:
                raise ChannelError(f"no cloud service for plan {self.plan.hash[:12]} found by zeroconf")
            svc = found[0]
            # TLS is this agent's decision: an advertisement may ask for it, never turn it off
            url = f"{'tls' if (svc.tls or self.cafile) else 'tcp'}://{svc.host}:{svc.port}"
        assert url is not None
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
        await ch.send(wire.Hello(self.plan.hash, self.client_id, token=self.token))
        reply = await asyncio.wait_for(ch.recv(), self.connect_timeout_s)
        if isinstance(reply, wire.Refusal):
            await ch.aclose()
            raise RefusedError(f"the cloud refused the hello: {reply.message}", reply.reason)
        if not isinstance(reply, wire.Welcome):
            await ch.aclose()
            raise ChannelError(f"expected a welcome, got {reply.KIND!r}")
        self._postprocessed = reply.postprocess
        if reply.postprocess:  # results will be post-processed (e.g. detections): small
            self.controller.result_prior = [0.0 if c.local else _POSTPROCESSED_BYTES for c in self.plan.candidates]
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
                self._ch = ch
                self._connected.set()
                self._prober = ActiveProber(self.monitor, ch.send)
                probe = self._spawn(self._prober.run())
                try:
                    await self._read(ch)
                finally:
                    probe.cancel()
                    self._ch = None
                    self._connected.clear()
                    for fut in self._pending.values():
                        if not fut.done():
                            fut.set_exception(ChannelClosed("the connection to the cloud was lost"))
                    await ch.aclose()
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
                if self._prober is not None:
                    self._prober.on_pong(msg)
                if self.breaker.state(time.monotonic()) == "half-open":
                    self.breaker.success()
            elif isinstance(msg, wire.Bye):
                return

    def _downlink(self, uplink_mbps: float) -> float:
        """The rate results come back at: the uplink's unless told (links are rarely slower down)."""
        return self.downlink_mbps if self.downlink_mbps is not None else uplink_mbps

    # ------------------------------------------------------------------ compute
    def _warm(self) -> None:
        """Load every edge segment and time it on this device before the first frame.

        The plan's profile was measured where the plan was made, often a much faster machine;
        without this the first frames would trust it (and pay for loading the sessions). Each
        segment runs twice, the second run is the measurement; the codecs run once on the cut
        so their first use costs nothing extra."""
        zeros = {t.name: np.zeros(t.shape, t.dtype) for t in self.plan.inputs}
        for i, cand in enumerate(self.plan.candidates):
            if cand.edge is None or (self.pinned is not None and i != self.pinned):
                continue
            backend = self._backend(str(self.plan.file(cand.edge)))
            feeds = {k: zeros[k] for k in cand.edge.inputs}
            out = backend.run(feeds)
            t = time.perf_counter()
            out = backend.run(feeds)
            self.controller.observe_edge(i, (time.perf_counter() - t) * 1e3)
            if not cand.local:
                for v in cand.cut_feed(zeros, out).values():
                    encode_tensor(v, self.codec)
        if self.pinned is None or self.plan.candidates[self.pinned].edge is None:
            for v in zeros.values():
                encode_tensor(v, self.input_codec)

    def _due_for_sizing(self, only_unmeasured: bool = False) -> list[int]:
        """All-cloud candidates whose wire size should be measured on this frame (and marks them)."""
        now = time.monotonic()
        due = [i for i in self._input_only if not (only_unmeasured and self._sized_at[i] > -float("inf"))
               and now - self._sized_at[i] >= self.size_every_s]
        for i in due:
            self._sized_at[i] = now
        return due

    def _encode_inputs(self, due: list[int], inputs: Mapping[str, np.ndarray]) -> dict[int, dict[str, Encoded]]:
        return {i: {t.name: encode_tensor(inputs[t.name], self.input_codec) for t in self.plan.candidates[i].cut}
                for i in due}

    def _observe_sizes(self, encoded: dict[int, dict[str, Encoded]]) -> None:
        """Encoding the frame as an all-cloud candidate would send it keeps that candidate's wire
        size (the cost model's byte ratio) true while it is not in use: without it a candidate
        never tried would be judged by a prior forever."""
        for i, enc in encoded.items():
            self.controller.observe_bytes(i, sum(e.nbytes for e in enc.values()))

    async def _sample_sizes_later(self, inputs: Mapping[str, np.ndarray]) -> None:
        due = self._due_for_sizing()
        if due:  # on the device's thread, after the frame: a JPEG is a few ms
            enc = await asyncio.get_running_loop().run_in_executor(self._executor, self._encode_inputs, due, inputs)
            self._observe_sizes(enc)

    def _whole_index(self) -> int | None:
        """The all-edge candidate that runs the whole model from the plan's inputs, if any."""
        names = {t.name for t in self.plan.inputs}
        for k, cand in enumerate(self.plan.candidates):
            if cand.local and cand.edge is not None and set(cand.edge.inputs) == names:
                return k
        return None

    def _whole_model(self) -> str:
        """The file that runs the whole model locally: the all-edge candidate's segment when the
        plan has one (the same graph, and its session is already loaded), else the plan's model."""
        edge = self.plan.candidates[self._whole].edge if self._whole is not None else None
        return str(self.plan.file(edge)) if edge is not None else str(self.plan.model_file)

    def _backend(self, path: str) -> Backend:
        b = self._backends.get(path)
        if b is None:
            b = self._backends[path] = OrtBackend(path, threads=self.threads, emulate_slowdown=self.emulate_slowdown)
        return b

    async def _run_local(self, path: str, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        def run() -> tuple[dict[str, np.ndarray], float]:
            t = time.perf_counter()  # the run itself, not the wait for the device's thread
            out = self._backend(path).run(feeds)
            return out, (time.perf_counter() - t) * 1e3

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    def _finish(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.postprocess and "detections" not in outputs:
            return run_postprocess(self.postprocess, outputs)
        return outputs

    async def infer(self, inputs: Mapping[str, np.ndarray]) -> FrameResult:
        """One frame. Never raises for cloud trouble: the frame is finished locally instead."""
        for spec in self.plan.inputs:
            if spec.name not in inputs:
                raise SplitinferError(f"input {spec.name!r} is missing; the plan's inputs are "
                                      f"{[t.name for t in self.plan.inputs]}")
            spec.check(np.asarray(inputs[spec.name]))
        return await self._process(next(self._frames), inputs)

    async def _process(self, index: int, inputs: Mapping[str, np.ndarray],
                       captured: float | None = None) -> FrameResult:
        r = await self._process_frame(index, inputs, captured)
        if self.pinned is None and self._input_only and r.placement != "cloud":
            self._spawn(self._sample_sizes_later(inputs))
        return r

    async def _process_frame(self, index: int, inputs: Mapping[str, np.ndarray],
                             captured: float | None = None) -> FrameResult:
        # latency counts from the frame's capture (time waiting for a free pipeline slot included)
        t0 = captured if captured is not None else time.perf_counter()
        now = time.monotonic()
        cloud_ok = self.connected and self.breaker.allows(now)
        encoded: dict[int, dict[str, Encoded]] = {}
        if self.pinned is None:
            # the first frame: a few ms, once (the encoding is reused if the frame goes that way)
            encoded = self._encode_inputs(self._due_for_sizing(only_unmeasured=True), inputs)
            self._observe_sizes(encoded)
        bw = self.monitor.estimate_mbps()
        if self._prober is not None:  # an overdue probe bounds the rate from above
            bw = min(bw, self._prober.rate_bound_mbps())
        # frames and probes ahead of this one on the uplink
        ahead = self._inflight_bytes + (self._prober.inflight_bytes if self._prober is not None else 0)
        backlog_ms = ahead * 8 / (max(bw, 1e-3) * 1e3)
        if self.pinned is not None:
            i, explore = self.pinned, False
            preds = self.controller.predict(bw, self.monitor.min_rtt_ms(), backlog_ms=backlog_ms,
                                            default_ratio=self._prior_ratio, downlink_mbps=self._downlink(bw))
            pred = preds[i]
        else:
            # base RTT (the 10 s minimum): queueing in a slow link is already in the bandwidth
            choice = self.controller.choose(bw, self.monitor.min_rtt_ms(), now, backlog_ms=backlog_ms,
                                            allowed=None if cloud_ok else self.local,
                                            default_ratio=self._prior_ratio, downlink_mbps=self._downlink(bw))
            i, explore, pred, preds = choice.index, choice.explore, choice.predicted_ms, list(choice.predictions)
        # Exploring between the all-cloud and the all-edge candidate races them: the frame goes to
        # the cloud and the device starts it at once, the first result wins, and both are measured.
        # Exploring thus costs device time, not latency.
        whole = self._whole
        race = False
        if explore and cloud_ok and whole is not None:
            cur = self.controller.current
            if i in self._input_only:
                race = True
            elif i == whole and cur in self._input_only:
                i, race = cur, True  # type: ignore[assignment]
        pred = preds[i]
        cand = self.plan.candidates[i]
        # what the choice was made from, for logs and dashboards
        conditions = {"bandwidth_mbps": bw, "rtt_ms": self.monitor.min_rtt_ms(), "backlog_ms": backlog_ms,
                      "cloud_ok": cloud_ok, "predicted_ms": {c.id: p for c, p in zip(self.plan.candidates, preds)},
                      "cloud_error": None if self.connected else self.last_error}
        timings = {"edge_ms": 0.0, "encode_ms": 0.0, "transfer_ms": 0.0, "cloud_queue_ms": 0.0,
                   "cloud_compute_ms": 0.0, "local_ms": 0.0, "total_ms": 0.0}
        eout: dict[str, np.ndarray] = {}
        if cand.edge is not None:
            eout, timings["edge_ms"] = await self._run_local(str(self.plan.file(cand.edge)),
                                                             {k: inputs[k] for k in cand.edge.inputs})
            self.controller.observe_edge(i, timings["edge_ms"])
        if cand.local:
            outputs = self._finish(cand.finish({}, eout, self.plan.output_names))
            timings["total_ms"] = (time.perf_counter() - t0) * 1e3
            return FrameResult(index, outputs, cand.id, "edge", None, 0, timings, predicted_ms=pred, explore=explore,
                               conditions=conditions)
        cut = cand.cut_feed(inputs, eout)
        closed = False

        async def local() -> dict[str, np.ndarray]:
            # finish on the device: the cloud segment on the cut we have, or the whole model
            if cand.edge is None:
                out, ms = await self._run_local(self._whole_model(), dict(inputs))
                if whole is not None:  # a real measurement of the all-edge candidate
                    self.controller.observe_edge(whole, ms)
            else:
                assert cand.cloud is not None
                cout, ms = await self._run_local(str(self.plan.file(cand.cloud)), cut)
                out = cand.finish(cut, cout, self.plan.output_names)
            if not closed:  # a raced run that lost finishes after the frame's record is made
                timings["local_ms"] = ms
            return out

        if cloud_ok:  # a pinned candidate too: an open breaker means the cloud is not asked
            result, sent, reason = await self._remote(i, cand, cut, pred, timings, local, encoded.get(i), race=race)
        else:
            result, sent = await local(), 0
            reason = "circuit open" if self.connected else (
                f"cloud unavailable: {self.last_error}" if self.last_error else "cloud unavailable")
        closed = True
        batch = int(timings.pop("batch", 1))
        outputs = self._finish(result)
        timings["total_ms"] = (time.perf_counter() - t0) * 1e3
        if reason == _RACE_LOST:  # the device won the race: an all-edge frame that also measured the cloud
            assert whole is not None
            return FrameResult(index, outputs, self.plan.candidates[whole].id, "edge", None, sent, timings,
                               predicted_ms=preds[whole], explore=True, conditions=conditions)
        if reason is None:
            return FrameResult(index, outputs, cand.id, "edge" if cand.edge else None, "cloud", sent, timings,
                               predicted_ms=pred, explore=explore, batch_size=batch, conditions=conditions)
        return FrameResult(index, outputs, cand.id, "edge" if cand.edge else None, "edge", sent, timings,
                           fallback=True, fallback_reason=reason, predicted_ms=pred, explore=explore,
                           conditions=conditions)

    def _hedge_s(self, i: int, pred_ms: float) -> float:
        """How long a frame waits for the cloud before the device starts finishing it too: the
        predicted network-and-cloud time with a margin, not a fixed long timeout."""
        network_ms = max(pred_ms - self.controller.edge_ms()[i], 0.0)
        return min(max((self.hedge_factor * network_ms + self.hedge_margin_ms) / 1e3, _MIN_WAIT_S), _MAX_WAIT_S)

    async def _remote(self, i: int, cand: Candidate, cut: dict[str, np.ndarray], pred_ms: float,
                      timings: dict[str, float], local: Callable[[], Awaitable[dict[str, np.ndarray]]],
                      encoded: dict[str, Encoded] | None = None,
                      race: bool = False) -> tuple[dict[str, np.ndarray], int, str | None]:
        """Send the cut and wait for the cloud; if it is late, finish the frame on the device as
        well and take whichever comes first (a hedged request). ``reason`` is None when the cloud
        answered, else why the frame was finished locally. With ``race`` (exploring) the device
        starts at once, and a device that wins is not the cloud failing: ``reason`` is
        ``_RACE_LOST`` and the cloud's reply, whenever it comes, is measured as usual."""
        ch = self._ch
        if ch is None:
            return await local(), 0, "cloud unavailable"
        t = time.perf_counter()
        codec = self.input_codec if cand.edge is None else self.codec
        if encoded is None:  # (else encoded already, when its size was sampled)
            encoded = {k: encode_tensor(v, codec) for k, v in cut.items()}
            timings["encode_ms"] = (time.perf_counter() - t) * 1e3
            self.controller.observe_encode(i, timings["encode_ms"])
        wire_bytes = sum(e.nbytes for e in encoded.values())
        self.controller.observe_bytes(i, wire_bytes)
        self._sized_at[i] = time.monotonic()
        hedge_s = 0.0 if race else self._hedge_s(i, pred_ms)
        rid = next(self._ids)
        fut: asyncio.Future[wire.Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        fut.add_done_callback(_consume)
        while len(self._pending) > 256:  # replies that never came (a frame long finished locally)
            self._pending.pop(next(iter(self._pending))).cancel()
        req = wire.InferRequest(rid, self.plan.hash, cand.id, encoded, codec=codec,
                                deadline_ms=_MAX_WAIT_S * 1e3, result_codec="raw")
        sent_at = time.perf_counter()
        sent = False

        async def cloud() -> tuple[wire.Message, float]:
            nonlocal sent
            await ch.send(req)
            sent = True
            reply = await asyncio.shield(fut)  # a late reply still lands in fut (see _late_reply)
            return reply, time.perf_counter()

        remote = asyncio.ensure_future(cloud())
        remote.add_done_callback(_consume)
        fallback: asyncio.Future[dict[str, np.ndarray]] | None = None
        self._inflight_bytes += wire_bytes
        reason: str | None = None
        try:
            done, _ = await asyncio.wait({remote}, timeout=hedge_s) if hedge_s > 0 else (set(), set())
            if not done:  # late: the device starts on it too; the first to finish wins
                fallback = asyncio.ensure_future(local())
                fallback.add_done_callback(_consume)
                done, _ = await asyncio.wait({remote, fallback}, return_when=asyncio.FIRST_COMPLETED)
                if remote not in done:
                    reason = _RACE_LOST if race else f"cloud later than {hedge_s * 1e3:.0f} ms"
            if remote in done and remote.exception() is not None:
                exc = remote.exception()
                reason = (f"connection lost: {exc}" if isinstance(exc, (ChannelClosed, ChannelError)) else
                          f"bad reply from the cloud: {exc}" if isinstance(exc, BadReply) else str(exc))
        finally:
            if reason != _RACE_LOST:
                self._inflight_bytes -= wire_bytes
        if reason == _RACE_LOST:
            def measured(task: "asyncio.Future[tuple[wire.Message, float]]") -> None:
                self._inflight_bytes -= wire_bytes
                if not task.cancelled() and task.exception() is None:
                    reply, arrived = task.result()
                    if isinstance(reply, wire.Result):
                        self._observe_reply(i, reply, (arrived - sent_at) * 1e3, wire_bytes, {})

            remote.add_done_callback(measured)
            assert fallback is not None
            return await fallback, wire_bytes, reason
        if reason is not None:
            failed = remote.done() and not remote.cancelled() and remote.exception() is not None
            remote.cancel()
            self.breaker.failure(time.monotonic())
            if not failed:
                # the link did not carry this frame in the time the device took: it carries less
                # than that, and at most half the estimate; a reply arriving later says how much
                elapsed_s = max(time.perf_counter() - sent_at, 1e-3)
                rate = min(wire_bytes * 8 / elapsed_s / 1e6, self.monitor.raw_mbps() / 2)
                self.monitor.add_transfer(wire_bytes, wire_bytes * 8 / max(rate, 1e-3) / 1e6)
                fut.add_done_callback(functools.partial(self._late_reply, wire_bytes))
            else:
                self._pending.pop(rid, None)
            out = await (fallback if fallback is not None else local())
            return out, wire_bytes if sent else 0, reason
        reply, arrived = remote.result()
        if isinstance(reply, wire.Error):
            self.breaker.failure(time.monotonic())
            return await (fallback or local()), wire_bytes, f"cloud error {reply.code}: {reply.message}"
        assert isinstance(reply, wire.Result)
        try:
            outputs = reply_outputs(self.plan, cand, self._postprocessed, reply)
        except (wire.ProtocolError, ValueError) as exc:  # never returned as a cloud result
            self.breaker.failure(time.monotonic())
            log.warning("bad reply from the cloud: %s", exc)
            return await (fallback or local()), wire_bytes, f"bad reply from the cloud: {exc}"
        if fallback is not None and not race:
            fallback.cancel()  # not started yet: dropped; running: its result is ignored
        # (racing, the device's run goes on: its time is the measurement the race was for)
        self._observe_reply(i, reply, (arrived - sent_at) * 1e3, wire_bytes, timings)
        if self._postprocessed:
            return outputs, wire_bytes, None  # post-processed by the cloud (e.g. detections)
        return cand.finish(cut, outputs, self.plan.output_names), wire_bytes, None

    def _observe_reply(self, i: int, reply: wire.Result, elapsed_ms: float, wire_bytes: int,
                       timings: dict[str, float]) -> None:
        """What a reply says about the link, the cloud and this candidate."""
        self.breaker.success()
        tm = reply.timings
        timings["cloud_queue_ms"], timings["cloud_compute_ms"] = tm.queue_ms, tm.compute_ms
        timings["transfer_ms"] = max(elapsed_ms - tm.queue_ms - tm.compute_ms, 0.0)
        timings["batch"] = tm.batch_size
        self.monitor.add_transfer(wire_bytes, tm.recv_ms / 1e3)
        overhead_ms = max(elapsed_ms - tm.recv_ms - tm.queue_ms - tm.compute_ms, 0.0)
        self.monitor.add_rtt(overhead_ms)
        self.controller.observe_overhead(i, overhead_ms)
        self.controller.observe_cloud(i, tm.compute_ms, tm.queue_ms, tm.batch_size)
        if reply.info is not None:
            self.controller.observe_result(i, reply.info.nbytes)

    def _late_reply(self, nbytes: int, fut: "asyncio.Future[wire.Message]") -> None:
        """A reply for a frame already finished locally: how long the request took to arrive is
        still a real measurement of the link (the only one during an outage)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        reply = fut.result()
        if isinstance(reply, wire.Result) and reply.timings.recv_ms > 0:
            self.monitor.add_transfer(nbytes, reply.timings.recv_ms / 1e3)

    async def stream(self, frames: Iterable[Mapping[str, np.ndarray]] | AsyncIterable[Mapping[str, np.ndarray]],
                     *, fps: float | None = None) -> AsyncIterator[FrameResult]:
        """Results for ``frames`` in order; frame n+1 runs its edge segment while frame n is on the
        wire, at most ``max_inflight`` frames at a time (backpressure)."""
        pending: deque[asyncio.Task[FrameResult]] = deque()
        sem = asyncio.Semaphore(self.max_inflight)
        done = asyncio.Event()
        start = time.monotonic()

        failed: list[BaseException] = []

        async def produce() -> None:
            k = 0
            try:
                async for frame in _aiter(frames):
                    if fps:
                        delay = start + k / fps - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    captured = time.perf_counter()
                    await sem.acquire()
                    task = asyncio.ensure_future(self._process(next(self._frames), frame, captured))
                    task.add_done_callback(lambda _: sem.release())
                    pending.append(task)
                    k += 1
                    ready.set()
            except Exception as exc:  # the source failed: frames taken get their results, then the error
                failed.append(exc)
            finally:
                done.set()
                ready.set()

        ready = asyncio.Event()
        producer = asyncio.ensure_future(produce())
        try:
            while True:
                while not pending and not done.is_set():
                    ready.clear()
                    await ready.wait()
                if not pending:
                    break
                yield await pending.popleft()
            await producer
            if failed:
                exc = failed[0]
                if isinstance(exc, SplitinferError):
                    raise exc
                raise SourceError(f"the frame source failed: {type(exc).__name__}: {exc}") from exc
        finally:
            producer.cancel()
            for t in pending:
                t.cancel()


def _consume(fut: "asyncio.Future[Any]") -> None:
    """Mark a future's exception as seen: a reply future may fail after nobody waits for it."""
    if not fut.cancelled():
        fut.exception()


async def _aiter(frames: Any) -> AsyncIterator[Any]:
    if hasattr(frames, "__aiter__"):
        async for f in frames:
            yield f
    else:
        for f in frames:
            yield f
            await asyncio.sleep(0)


class SyncEdgeAgent:
    """A thin synchronous facade: the agent lives on an event loop in its own thread.

    >>> with SyncEdgeAgent("plans/yolo-n", cloud="tcp://10.0.0.5:7000") as agent:   # doctest: +SKIP
    ...     r = agent.infer_sync({"input": frame})
    """

    def __init__(self, plan: Plan | str, cloud: str | None = "auto", **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="splitinfer-edge-loop", daemon=True)
        self._thread.start()
        self.agent: EdgeAgent = self._call(self._make(plan, cloud, kwargs), 60)

    async def _make(self, plan: Plan | str, cloud: str | None, kwargs: dict[str, Any]) -> EdgeAgent:
        return await EdgeAgent(plan, cloud, **kwargs).start()

    def _call(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def infer_sync(self, inputs: Mapping[str, np.ndarray], timeout: float | None = 60.0) -> FrameResult:
        return self._call(self.agent.infer(inputs), timeout)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self.agent.aclose(), 30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> "SyncEdgeAgent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


