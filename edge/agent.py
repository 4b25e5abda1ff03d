"""The edge agent: runs the edge segment on the device, sends the cut tensors, picks the cut for
every frame, and finishes the frame itself when the cloud is slow or gone. Every input gets
exactly one result, in order, in one output format wherever it ran.

The concerns live in their own modules: the link and its supervision (``link.py``), the hedged
remote call (``remote.py``), the device and its queue (``device.py``), the uplink as a frame's
choice sees it (``uplink.py``), the choice (``controller.py``), what the bandwidth prober is
told (``probing.py``), how each cut is encoded (``encoding.py``); this class runs one frame
through them.

>>> async with EdgeAgent(Plan.load("plans/yolo-n"), cloud="tcp://10.0.0.5:7000") as agent:   # doctest: +SKIP
...     r = await agent.infer({"input": frame})
...     async for r in agent.stream(frames):
...         print(r.index, r.candidate, r.timings["total_ms"], r.fallback)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import PlanError, RefusedError, SplitinferError
from ..postprocess import POSTPROCESSORS
from ..postprocess import postprocess as run_postprocess
from ..splitter.cost_model import CostModel
from ..splitter.wire_settings import DEFAULT_MIN_FIDELITY
from ..splitter.plan import Plan
from ..transport.bandwidth import BandwidthMonitor
from ..codecs import Encoded
from .breaker import CircuitBreaker
from .controller import Choice, Controller, DeviceLoad, Evidence
from .device import Device
from .encoding import CutEncoder
from .link import CloudLink
from .pipeline import pipeline
from .probing import ProbeSteering
from .remote import RACE_LOST, RemoteCall
from .result import FrameResult
from .sizes import InputSizes
from .uplink import uplink_now

__all__ = ["EdgeAgent"]

log = logging.getLogger(__name__)

_POSTPROCESSED_BYTES = 2048.0  # a prior for a post-processed result (a few dozen detections)


class EdgeAgent:
    """Split inference on the edge device. ``cloud`` is ``"auto"`` (zeroconf), ``tcp://host:port``,
    ``tls://host:port``, ``webrtc://host:port`` (the cloud's HTTP port), or None (all local).
    ``candidate`` pins one cut (an id, or ``edge``/``cloud``) instead of adapting.
    ``postprocess`` (e.g. ``"yolo"``) is the output format of every frame, agreed with the cloud
    at hello: detections whether a frame ran on the device, split or in the cloud. ``fps`` is the
    camera's frame rate for callers that feed :meth:`infer` from a camera themselves (a paced
    :meth:`stream` says it itself): the controller charges a candidate that cannot keep it."""

    def __init__(self, plan: Plan | str, cloud: str | None = "auto", *, token: str | None = None,
                 codec: str = "auto", input_codec: str | None = None, policy: str = "latency",
                 latency_budget_ms: float | None = None, candidate: str | None = None, max_inflight: int = 2,
                 postprocess: str | None = None, threads: int | None = None, edge_slowdown: float = 1.0,
                 monitor: BandwidthMonitor | None = None, connect_timeout_s: float = 5.0,
                 cafile: str | None = None, client_id: str = "edge", emulate_slowdown: float = 1.0,
                 downlink_mbps: float | None = None, warmup: bool = True, jpeg_quality: int | None = None,
                 fps: float | None = None, min_fidelity: float = DEFAULT_MIN_FIDELITY) -> None:
        self.plan = plan if isinstance(plan, Plan) else Plan.load(plan)
        if fps is not None and not (math.isfinite(fps) and fps > 0):
            raise SplitinferError(f"fps must be a positive number, got {fps}")
        if postprocess and postprocess not in POSTPROCESSORS:
            raise SplitinferError(f"postprocess must be one of {sorted(POSTPROCESSORS)}, got {postprocess!r}")
        self.cloud_url = cloud
        # what each candidate's cut travels in, and the candidates the fidelity floor admits
        self.encoder = CutEncoder(self.plan, codec, input_codec, jpeg_quality, min_fidelity)
        enc = self.encoder
        self.settings, self.usable, self.input_codec = enc.settings, enc.usable, enc.input_codec
        self.pinned = self._resolve(candidate) if candidate else None
        self.max_inflight = max(1, max_inflight)
        self.postprocess = postprocess or ""
        self.downlink_mbps = downlink_mbps  # None: assume the uplink's rate for results coming back
        self.warmup = warmup
        self.connect_timeout_s = connect_timeout_s
        cm = CostModel.from_plan(self.plan, edge_slowdown=edge_slowdown)
        self.controller = Controller(cm, policy=policy, latency_budget_ms=latency_budget_ms)
        if self.postprocess:  # results will be post-processed (e.g. detections): small
            self.controller.result_prior = [0.0 if c.local else _POSTPROCESSED_BYTES for c in self.plan.candidates]
        # the controller compares expected latencies: it plans with the measured rate itself, not a
        # share of it (a safety factor made every cloud frame's prediction ~5 % too long on the
        # uplink traces, and edge frames won the close calls; a frame the link fails is hedged)
        self.monitor = monitor or BandwidthMonitor(safety=1.0)
        self.breaker = CircuitBreaker(max_cooldown_s=4.0)
        # emulate_slowdown: see OrtBackend (a fast machine standing in for a slow device)
        self.device = Device(threads=threads, emulate_slowdown=emulate_slowdown, max_jobs=self.max_inflight + 1)
        self.link = CloudLink(self.plan, cloud, monitor=self.monitor, token=token, cafile=cafile, client_id=client_id,
                              connect_timeout_s=connect_timeout_s, postprocess=self.postprocess,
                              on_pong=self._on_pong) if cloud is not None else None
        self.remote = RemoteCall(self.plan, self.link, self.controller, self.monitor, self.breaker, self.device,
                                 downlink_mbps=downlink_mbps) if self.link is not None else None
        self.local = [i for i, c in enumerate(self.plan.candidates) if c.local]
        # all-cloud candidates (the cut is model inputs): their wire size is measured on real frames
        # even while they are not used (sizes.py); a race of one measures it too
        self.sizes = InputSizes(self.plan, self.controller, self.encoder.encode)
        self._input_only = self.sizes.input_only
        self._whole = self._whole_index()  # the all-edge candidate that runs the whole model, if any
        if self._whole is not None and self._input_only:  # exploring between these is raced (_decide)
            # (the whole model from an all-cloud choice; an all-cloud candidate from any)
            self.controller.cheap_explore = {self._whole: frozenset(self._input_only),
                                             **dict.fromkeys(self._input_only)}
        self.races = 0  # explorations raced between the cloud and the device
        self._prior_ratio = self.encoder.prior_ratio  # until a candidate's wire size is measured here
        # what the prober is told after each frame's choice (its probes' budget: probing.py)
        self.probing = ProbeSteering(self.plan, self.controller, self._prior_ratio)
        self._frames = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        # the camera's interval between frames (the device's steady load): known from the rate a
        # stream is paced at (stream(fps=...)) or told (fps=...). Not measured from arrivals: a
        # caller that waits for each result (infer() in a loop, an unpaced stream, whose backpressure
        # holds the source) sends the next frame when the last is done, so the gaps are the agent's
        # own pace - a slower candidate then always looked unable to keep up (at 20 ms a frame the
        # all-edge candidate's 100 ms was charged ~1 s of backlog that could never build)
        self.fps = fps
        self.frame_interval_ms = 1e3 / fps if fps else math.nan

    def _resolve(self, cid: str) -> int:
        ids = [c.id for c in self.plan.candidates]
        if cid not in ids:
            raise PlanError(f"no candidate {cid!r}; the candidates are {ids}")
        return ids.index(cid)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "EdgeAgent":
        if self.link is not None:
            self.link.start()
        if self.warmup:  # meanwhile the connection comes up
            await self.device.call(self._warm, 0.0)
        if self.link is not None:  # not fatal: frames run locally meanwhile
            await self.link.wait_connected(self.connect_timeout_s)
        return self

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self.link is not None:
            await self.link.aclose()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.device.shutdown()

    async def __aenter__(self) -> "EdgeAgent":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ------------------------------------------------------------------ the link, seen from here
    @property
    def connected(self) -> bool:
        return self.link is not None and self.link.connected

    @property
    def last_error(self) -> str | None:
        """Why the cloud is not connected, in words (not found, refused, TLS, unreachable)."""
        if self.link is None:
            return "no cloud configured"
        return self.link.last_error

    @property
    def refused(self) -> RefusedError | None:
        return self.link.refused if self.link is not None else None

    @property
    def probe_bytes(self) -> int:
        """Uplink bytes the bandwidth probes have sent (beyond the frames' ``bytes_sent``)."""
        return self.link.probe_bytes if self.link is not None else 0

    @property
    def reconnects(self) -> int:
        return self.link.reconnects if self.link is not None else 0

    def counts(self) -> dict[str, int]:
        """What the agent did beyond the frames' own work, for a run's summary: hedges started on
        the device (and checks that declined one), races of the cloud and the device, probes (on the current connection)."""
        prober = self.link.prober if self.link is not None else None
        remote = self.remote
        return {"hedges": remote.hedges if remote is not None else 0,
                "hedges_declined": remote.hedges_declined if remote is not None else 0, "races": self.races,
                "probes": prober.sent if prober is not None else 0,
                "recovery_probes": prober.recovery_probes if prober is not None else 0}

    def _on_pong(self) -> None:
        if self.breaker.state(time.monotonic()) == "half-open":
            self.breaker.success()

    def _downlink(self, uplink_mbps: float) -> float:
        """The rate results come back at: the uplink's unless told (links are rarely slower down)."""
        return self.downlink_mbps if self.downlink_mbps is not None else uplink_mbps

    # ------------------------------------------------------------------ compute
    def _warm(self) -> None:
        """Load every edge segment and time it on this device before the first frame.

        The plan's profile was measured where the plan was made, often a much faster machine;
        without this the first frames would trust it (and pay for loading the sessions). Each
        segment runs three times, the faster of the last two is the measurement (a device starting
        beside other work, a cloud service warming its sessions on the same machine, measured a
        single run at twice its time, and the edge was not tried again for seconds); the codecs run once on the cut
        so their first use costs nothing extra."""
        zeros = {t.name: np.zeros(t.shape, t.dtype) for t in self.plan.inputs}
        # pinned, the candidate and the whole model (what its frames fall back on: when to hedge
        # depends on how long the device takes to finish a frame)
        for i, cand in enumerate(self.plan.candidates):
            if cand.edge is None or (self.pinned is not None and i not in (self.pinned, self._whole)):
                continue
            backend = self.device.backend(str(self.plan.file(cand.edge)))
            feeds = {k: zeros[k] for k in cand.edge.inputs}
            out = backend.run(feeds)
            timed = []
            for _ in range(2):  # the faster of two: one run can meet the start-up of everything else
                t = time.perf_counter()
                out = backend.run(feeds)
                timed.append((time.perf_counter() - t) * 1e3)
            self.controller.observe_edge(i, min(timed), warm=True)
            if not cand.local:
                for k, v in cand.cut_feed(zeros, out).items():
                    self.encoder.encode(i, k, v)
        for i in self.sizes.input_only:
            if self.pinned is None or self.pinned == i:
                for k, v in zeros.items():
                    self.encoder.encode(i, k, v)

    async def _sample_sizes_later(self, inputs: Mapping[str, np.ndarray], r: FrameResult) -> None:
        preds = (r.conditions or {}).get("predicted_ms")
        due = self.sizes.due(predicted=[preds[c.id] for c in self.plan.candidates] if preds else None,
                             chosen_ms=r.predicted_ms if preds else None)
        if due:  # on the device's thread, after the frame: a JPEG is a few ms
            enc = await self.device.call(lambda: self.sizes.encode(due, inputs), 3.0)
            self.sizes.observe(enc)

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

    def _finish(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The frame's outputs in the agreed format (post-processed on the device when the cloud did not)."""
        if self.postprocess and "detections" not in outputs:
            return run_postprocess(self.postprocess, outputs)
        return outputs

    # ------------------------------------------------------------------ the device's load
    def _local_finish_ms(self, i: int, edge: Sequence[float] | None = None) -> float:
        """What finishing candidate ``i``'s frame on the device would take (``edge``: each
        candidate's device time now, when the frame has it): the whole model for an all-cloud
        frame, the rest of it (whole minus the edge part) for a split one."""
        edge = self.controller.edge_ms() if edge is None else edge
        if self._whole is None:
            return self.controller.cloud_ms()[i] * self.controller.device_scale()
        return edge[self._whole] if self.plan.candidates[i].edge is None else max(edge[self._whole] - edge[i], 0.0)

    def _load(self, edge: Sequence[float]) -> DeviceLoad:
        """The device's queue now, each candidate's work on it (``edge``: its device time now; an
        all-cloud frame's JPEG is made on the loop, not in the device's queue), the camera's frame
        interval, the pipeline depth."""
        device = [0.0 if (i in self._input_only or ms <= 0.5) else ms for i, ms in enumerate(edge)]
        return DeviceLoad(self.device.wait_ms(), device, self.frame_interval_ms, self.max_inflight)

    # ------------------------------------------------------------------ frames
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
            self._spawn(self._sample_sizes_later(inputs, r))
        return r

    def _decide(self, now: float) -> _Decision:
        """The frame's candidate from the live conditions (the link, the device's queue, the
        evidence), whether it explores and whether that is raced; the prober is told after."""
        cloud_ok, bw, backlog_ms, probe_ms = uplink_now(self.monitor, self.link, self.remote, self.breaker)
        # what every prediction for this frame is made from, taken once (see controller.Evidence)
        ev = self.controller.evidence(now, default_ratio=self._prior_ratio)
        load = self._load(ev.edge)
        common = dict(backlog_ms=backlog_ms, downlink_mbps=self._downlink(bw), load=load, evidence=ev)
        rtt = self.monitor.min_rtt_ms()  # base RTT (the 10 s minimum): queueing in a slow link is in the bandwidth
        if self.pinned is not None:
            i, explore, base = self.pinned, False, self.pinned
            choice: Choice | None = None
            preds, model = self.controller.predict_parts(bw, rtt, **common)  # type: ignore[arg-type]
        else:
            choice = self.controller.choose(bw, rtt, now, allowed=self.usable if cloud_ok else self.local,
                                            transient_ms=probe_ms, default_ratio=self._prior_ratio,
                                            **common)  # type: ignore[arg-type]
            i, explore, preds = choice.index, choice.explore, list(choice.predictions)
            base, model = choice.unexplored, list(choice.base)
        if self.link is not None and self.link.prober is not None:
            # after this frame's send has started (its first wait): on a CPU-quota device the
            # frame's own CPU before the send is its latency, and the prober's settings can wait
            asyncio.get_running_loop().call_soon(functools.partial(
                self.probing.steer, self.link.prober, bw, rtt, preds, common,
                frame_interval_ms=self.frame_interval_ms, pinned=self.pinned is not None))
        # Exploring between the all-cloud and the all-edge candidate races them: the frame goes to
        # the cloud and the device starts it at once, the first result wins, and both are measured.
        # Exploring thus costs device time, not latency (and is not done while the device is full).
        whole = self._whole
        race = False
        if explore and cloud_ok and whole is not None and self.device.has_room():
            if i in self._input_only:
                race = True
            elif i == whole and base in self._input_only:
                i, race = base, True  # type: ignore[assignment]
            self.races += race
        if explore and not race and i in self.controller.cheap_explore and base is not None and base != i \
                and (cloud_ok or base in self.local) and (choice is None or not self.controller.worth_running(choice)):
            # explored by a race, or for real where it is as close as a costly candidate must be
            # to be explored (the standing choice is a split cut: no race), or not at all
            i, explore = base, False
        pred = preds[i]
        cand = self.plan.candidates[i]
        # what the choice was made from, for logs and dashboards
        conditions = {"bandwidth_mbps": bw, "rtt_ms": rtt, "backlog_ms": backlog_ms, "probe_backlog_ms": probe_ms,
                      "device_wait_ms": load.wait_ms, "frame_interval_ms": load.interval_ms if math.isfinite(load.interval_ms) else None, "cloud_ok": cloud_ok,
                      "predicted_ms": {c.id: p for c, p in zip(self.plan.candidates, preds)},
                      "cloud_error": None if self.connected else self.last_error,
                      # the probes answered since the last frame and what the monitor took each as
                      "probes": self.link.prober.take_answered()
                      if self.link is not None and self.link.prober is not None else []}
        return _Decision(i, explore, race, preds, model, cloud_ok, ev, load, conditions)

    async def _process_frame(self, index: int, inputs: Mapping[str, np.ndarray],
                             captured: float | None = None) -> FrameResult:
        # latency counts from the frame's capture (time waiting for a free pipeline slot included)
        t0 = captured if captured is not None else time.perf_counter()
        now = time.monotonic()
        encoded: dict[int, dict[str, Encoded]] = {}
        if self.pinned is None:
            # the first frame: a few ms, once (the encoding is reused if the frame goes that way)
            encoded = self.sizes.encode(self.sizes.due(only_unmeasured=True), inputs)
            self.sizes.observe(encoded)
        d = self._decide(now)
        i, explore, race, preds, model, cloud_ok = d.index, d.explore, d.race, d.preds, d.model, d.cloud_ok
        ev, load, conditions = d.evidence, d.load, d.conditions
        whole = self._whole
        pred = preds[i]
        cand = self.plan.candidates[i]
        timings = {"edge_ms": 0.0, "encode_ms": 0.0, "transfer_ms": 0.0, "cloud_queue_ms": 0.0,
                   "cloud_compute_ms": 0.0, "local_ms": 0.0, "total_ms": 0.0}
        eout: dict[str, np.ndarray] = {}
        edge_expect = ev.edge[i]
        started = time.perf_counter()
        # only the device wait the load term predicted is left out of the residual: the way to the
        # device's thread and back is the candidate's own cost (~20 ms a frame at 0.06 core)
        queued_ms = 0.0

        def own_ms() -> float:  # the frame's time so far, less its predicted wait (see observe_total)
            return (time.perf_counter() - started) * 1e3 - queued_ms

        if cand.edge is not None:
            eout, timings["edge_ms"] = await self.device.run(str(self.plan.file(cand.edge)),
                                                             {k: inputs[k] for k in cand.edge.inputs}, edge_expect,
                                                             priority=index)
            queued_ms = min(max((time.perf_counter() - started) * 1e3 - timings["edge_ms"], 0.0), load.wait_ms)
            self.controller.observe_edge(i, timings["edge_ms"])
        if cand.local:
            outputs = self._finish(cand.finish({}, eout, self.plan.output_names))
            # what the frame took beyond its device time, as remote frames' residuals are kept
            # (post-processing runs here for a local frame, in the cloud for a remote one)
            self.controller.observe_total(i, own_ms(), model[i])
            timings["total_ms"] = (time.perf_counter() - t0) * 1e3
            return FrameResult(index, outputs, cand.id, "edge", None, 0, timings, predicted_ms=pred, explore=explore,
                               conditions=conditions)
        cut = cand.cut_feed(inputs, eout)
        closed = False
        local_expect = self._local_finish_ms(i, ev.edge)

        async def local() -> dict[str, np.ndarray]:
            # finish on the device: the cloud segment on the cut we have, or the whole model
            if cand.edge is None:
                out, ms = await self.device.run(self._whole_model(), dict(inputs), local_expect, priority=index)
                if whole is not None:  # a measurement of the all-edge candidate (raced: an upper bound)
                    self.controller.observe_edge(whole, ms, raced=race)
            else:
                assert cand.cloud is not None
                cout, ms = await self.device.run(str(self.plan.file(cand.cloud)), cut, local_expect, priority=index)
                out = cand.finish(cut, cout, self.plan.output_names)
            if not closed:  # a raced run that lost finishes after the frame's record is made
                timings["local_ms"] = ms
            return out

        if cloud_ok and self.remote is not None:  # a pinned candidate too: an open breaker means the cloud is not asked
            codec = self.encoder.setting(i)[0]
            enc = encoded.get(i)
            if enc is None:  # (else encoded already, when its size was sampled)
                t = time.perf_counter()
                enc = {k: self.encoder.encode(i, k, v) for k, v in cut.items()}
                timings["encode_ms"] = (time.perf_counter() - t) * 1e3
                self.controller.observe_encode(i, timings["encode_ms"])
            self.sizes.mark(i)
            # paced, the device is not needed by another frame before the next one is due
            due = t0 + self.frame_interval_ms / 1e3 if math.isfinite(self.frame_interval_ms) else -math.inf
            outcome = await self.remote.call(i, cand, cut, enc, codec, pred, timings, local, local_expect, race=race,
                                             priority=index, free_until=due, device_ms=edge_expect)
            result, sent, reason = outcome.outputs, outcome.sent, outcome.reason
            network_ms = outcome.network_ms
        else:
            result, sent, network_ms = await local(), 0, math.nan
            reason = "circuit open" if self.connected else (self.link.why_not() if self.link is not None
                                                            else "no cloud configured")
        closed = True
        batch = int(timings.pop("batch", 1))
        outputs = self._finish(result)
        timings["total_ms"] = (time.perf_counter() - t0) * 1e3
        if reason == RACE_LOST:  # the device won the race: an all-edge frame that also measured the cloud
            assert whole is not None
            return FrameResult(index, outputs, self.plan.candidates[whole].id, "edge", None, sent, timings,
                               predicted_ms=preds[whole], explore=True, conditions=conditions)
        if reason is None:
            # what the model missed for this candidate: beyond its device time and the network's
            # time as it really was, where the bandwidth estimate took that as a sample (a link
            # that fell is the estimate's news, not the candidate's), else beyond the prediction;
            # a raced frame shared the device with the whole model's run: an upper bound, which is
            # how a candidate held off by stale evidence is measured again
            expected = edge_expect + network_ms if math.isfinite(network_ms) else model[i]
            self.controller.observe_total(i, own_ms(), expected, raced=race)
            return FrameResult(index, outputs, cand.id, "edge" if cand.edge else None, "cloud", sent, timings,
                               predicted_ms=pred, explore=explore, batch_size=batch, conditions=conditions)
        return FrameResult(index, outputs, cand.id, "edge" if cand.edge else None, "edge", sent, timings,
                           fallback=True, fallback_reason=reason, predicted_ms=pred, explore=explore,
                           conditions=conditions)

    async def stream(self, frames: Iterable[Mapping[str, np.ndarray]] | AsyncIterable[Mapping[str, np.ndarray]],
                     *, fps: float | None = None, clock: float | None = None) -> AsyncIterator[FrameResult]:
        """Results for ``frames`` in order; frame n+1 runs its edge segment while frame n is on the
        wire, at most ``max_inflight`` frames at a time (backpressure). With ``fps`` the source is
        paced like a camera, a frame's latency counts from its scheduled capture
        (:func:`splitinfer.edge.pipeline.pipeline`), and the controller plans for that rate (a
        candidate the device cannot keep it with builds a backlog). ``clock`` (Unix seconds, with
        ``fps``) puts the captures on the instants ``clock + k / fps``."""
        def process(frame: Mapping[str, np.ndarray], captured: float) -> Awaitable[FrameResult]:
            return self._process(next(self._frames), frame, captured)  # numbered as it is taken

        before = self.frame_interval_ms
        if fps:
            self.frame_interval_ms = 1e3 / fps
        try:
            async for r in pipeline(process, frames, max_inflight=self.max_inflight, fps=fps, clock=clock):
                yield r
        finally:
            self.frame_interval_ms = before


class _Decision(NamedTuple):
    """What :meth:`EdgeAgent._decide` settled for a frame: the candidate, whether it explores (raced
    between the cloud and the device), every candidate's predicted ms and the model's part of it
    (before the residuals), whether the cloud may be asked, the evidence and the device's load."""
    index: int
    explore: bool
    race: bool
    preds: list[float]
    model: list[float]
    cloud_ok: bool
    evidence: Evidence
    load: DeviceLoad
    conditions: dict[str, Any]  # what the choice was made from, for logs and dashboards
