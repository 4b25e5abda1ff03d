"""The ``splitinfer`` subcommands that run the system rather than make or read a plan: the link
emulator (``netem``), ``cloud serve``, ``edge run`` and ``demo``. Each imports its part lazily, so
the edge's commands stay light; :mod:`splitinfer.commands` holds the plan's commands and the table
of all of them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .commands import _console, _emit_json
from .errors import SplitinferError

__all__ = ["cmd_cloud_serve", "cmd_demo", "cmd_edge_run", "cmd_netem"]


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SplitinferError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def cmd_netem(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from .transport.netem import LinkEmulator, load_trace, parse_rate

    try:
        rate = parse_rate(args.rate) if args.rate else None
        trace = load_trace(args.trace) if args.trace else None
    except (ValueError, OSError) as exc:
        raise SplitinferError(str(exc)) from exc
    listen, target = _hostport(args.listen), _hostport(args.to)

    async def run() -> None:
        emu = LinkEmulator(target, rate_mbps=rate, trace=trace, speedup=args.speedup, delay_ms=args.delay_ms,
                           listen=listen)
        await emu.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        what = f"{rate:g} Mbit/s" if rate is not None else f"trace {args.trace} x{args.speedup:g}"
        print(f"netem: {listen[0]}:{emu.port} -> {target[0]}:{target[1]}, {what} each way, "
              f"delay {args.delay_ms:g} ms one way; Ctrl-C to stop", flush=True)
        await stop.wait()
        await emu.aclose()
        print(f"netem: stopped; {emu.up.bytes if emu.up else 0} bytes up, {emu.down.bytes if emu.down else 0} down",
              flush=True)

    asyncio.run(run())
    return 0


def cmd_cloud_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from .cloud import CloudService, load_tokens

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tokens = load_tokens(args.token_file) if args.token_file else None
    svc = CloudService(args.plans, listen=_hostport(args.listen), http=_hostport(args.http), tokens=tokens,
                       tls_cert=args.tls_cert, tls_key=args.tls_key, advertise=not args.no_advertise,
                       max_batch_size=args.max_batch_size, max_queue_delay_ms=args.max_queue_delay_ms,
                       postprocess=args.postprocess, max_connections=args.max_connections, max_rows=args.max_rows,
                       idle_timeout_s=args.idle_timeout_s, threads=args.threads)

    async def run() -> None:
        await svc.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        _on_signals(loop, stop.set)
        for what, url in svc.addresses.items():
            print(f"{what}: {url}", flush=True)
        print(f"serving {len(svc.plans)} plan(s): " + ", ".join(f"{s.plan.name} {h[:12]}" for h, s in svc.plans.items())
              + f"; batching up to {args.max_batch_size}, {args.max_queue_delay_ms:g} ms; "
              f"at most {svc.max_connections} connections; Ctrl-C to stop", flush=True)
        await stop.wait()
        print("shutting down", flush=True)
        await svc.stop(drain_s=args.drain_s)

    asyncio.run(run())
    return 0


def _on_signals(loop: Any, first: Callable[[], None]) -> None:
    """The first SIGINT/SIGTERM calls ``first`` (an orderly stop); a second one gets the default
    behaviour (the process ends at once), so a stop that hangs can always be ended."""
    import contextlib
    import signal

    sigs = (signal.SIGINT, signal.SIGTERM)

    def handler() -> None:
        for sig in sigs:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        first()

    for sig in sigs:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


def cmd_edge_run(args: argparse.Namespace) -> int:
    import asyncio
    import collections

    import numpy as np

    from .edge import EdgeAgent
    from .edge.pipeline import first_tick
    from .splitter.wire_settings import input_codec_for
    from .frames import frames_from
    from .splitter import Plan

    plan = Plan.load(args.plan)
    token = None
    if args.token_file:
        lines = [ln.strip() for ln in Path(args.token_file).read_text().splitlines() if ln.strip()]
        token = lines[0] if lines else None
    if args.cafile and not Path(args.cafile).is_file():
        raise SplitinferError(f"--cafile {args.cafile}: no such file")
    if args.cafile:
        import ssl

        try:
            ssl.create_default_context(cafile=args.cafile)
        except (ssl.SSLError, OSError) as exc:
            raise SplitinferError(f"--cafile {args.cafile}: not a PEM certificate: {exc}") from exc
    if args.frame_clock is not None and args.fps is None:
        raise SplitinferError(f"--frame-clock {args.frame_clock:g}: a frame clock needs --fps (the frames' "
                              "spacing on it); got none")
    # a refused codec is exit 2 before anything is written
    input_codec_for(plan, args.input_codec, "fp16" if args.codec == "auto" else args.codec)
    frames = frames_from(args.source, plan.inputs, args.frames)
    # line-buffered: a run that is stopped early keeps every finished frame's record
    out = open(args.out, "w", buffering=1) if args.out else None  # noqa: SIM115 - closed below

    async def run() -> list[Any]:
        results = []
        cloud = None if args.cloud == "none" else args.cloud
        print("edge: starting (loading and timing the edge segments)", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        _on_signals(asyncio.get_running_loop(), stop.set)
        async with EdgeAgent(plan, cloud, token=token, codec=args.codec, input_codec=args.input_codec,
                             threads=args.threads, candidate=args.candidate, cafile=args.cafile,
                             policy=args.policy, latency_budget_ms=args.latency_budget_ms,
                             postprocess=args.postprocess, emulate_slowdown=args.emulate_slowdown,
                             jpeg_quality=args.jpeg_quality, min_fidelity=args.min_fidelity) as agent:
            # models loaded and timed, connection up (or not): what comes next is the frames
            state = "connected" if agent.connected else f"not connected ({agent.last_error or 'no answer yet'})"
            clock = args.frame_clock
            if clock is not None:  # the first instant on it, said (a link emulator replays its schedule from it)
                clock = first_tick(clock, args.fps, time.time() + 0.1)
                state += f", first frame at {clock:.6f}"
            print(f"edge: ready, cloud {state}", file=sys.stderr, flush=True)
            ready_cpu[0] = _cpu_s()

            def until_stopped() -> Any:
                for f in frames:
                    if stop.is_set():
                        return
                    yield f

            async for r in agent.stream(until_stopped(), fps=args.fps, clock=clock):
                results.append(r)
                if out is not None:
                    out.write(json.dumps(r.to_json()) + "\n")
            probe_bytes[0] = agent.probe_bytes
            counts.update(agent.counts())
            settings.update({c.id: st[0] + (f" q{st[1]}" if st[1] is not None else "")
                             for c, st in zip(plan.candidates, agent.settings) if st is not None})
        return results

    settings: dict[str, str] = {}  # what each remote candidate's cut travelled in
    probe_bytes = [0]  # the bandwidth probes' bytes: uplink traffic beyond the frames'
    counts: dict[str, int] = {}  # hedges, races, probes (see EdgeAgent.counts)
    cpu0 = _cpu_s()
    ready_cpu = [cpu0]  # when the segments were loaded and timed: the frames' CPU starts here
    try:
        results = asyncio.run(run())
    finally:
        if out is not None:
            out.close()
    # the agent's whole process from its first frame (segments, codecs, the loop, the controller);
    # loading and timing every candidate's segments before it is start-up, reported apart
    cpu_s = _cpu_s() - ready_cpu[0]
    lat = np.array([r.timings["total_ms"] for r in results]) if results else np.zeros(1)
    cuts = collections.Counter(r.candidate for r in results)
    summary = {
        "frames": len(results),
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)),
                       "p99": float(np.percentile(lat, 99)), "mean": float(lat.mean())},
        "cuts": dict(cuts), "bytes_sent": int(sum(r.bytes_sent for r in results)),
        "bytes_per_frame": float(np.mean([r.bytes_sent for r in results])) if results else 0.0,
        "probe_bytes": probe_bytes[0], "codec_settings": settings,
        "uplink_bytes_per_frame": (sum(r.bytes_sent for r in results) + probe_bytes[0]) / max(len(results), 1),
        "fallbacks": sum(r.fallback for r in results), "out": args.out,
        "cpu_ms_per_frame": cpu_s * 1e3 / max(len(results), 1),
        "startup_cpu_s": ready_cpu[0] - cpu0,
        "agent": counts,
    }
    if args.json:
        _emit_json(summary)
    else:
        from rich.table import Table

        t = Table(title=f"edge run: {plan.name} via {args.cloud}", header_style="bold")
        for col in ("frames", "P50 ms", "P90 ms", "P99 ms", "cuts used", "KiB/frame", "+ probes", "fallbacks"):
            t.add_column(col, justify="right")
        L = summary["latency_ms"]
        t.add_row(str(summary["frames"]), f"{L['p50']:.1f}", f"{L['p90']:.1f}", f"{L['p99']:.1f}",
                  ", ".join(f"{k}×{v}" for k, v in cuts.most_common()), f"{summary['bytes_per_frame'] / 1024:.1f}",
                  f"{summary['uplink_bytes_per_frame'] / 1024:.1f}", str(summary["fallbacks"]))
        _console().print(t)
    return 0


def _cpu_s() -> float:
    """CPU seconds this process has used (user + system, every thread)."""
    t = os.times()
    return t.user + t.system


def cmd_demo(args: argparse.Namespace) -> int:
    from .demos.traffic_camera.app import parse_args_into_config, run_demo

    if args.headless and args.frames is None:
        args.frames = 300
    return run_demo(parse_args_into_config(args), headless=args.headless, as_json=args.json)
