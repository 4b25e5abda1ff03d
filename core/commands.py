"""What each ``splitinfer`` subcommand does; :mod:`splitinfer.cli` parses the command line and
maps errors to exit codes. Each command imports its part lazily so that ``splitinfer --help``
and the edge's commands stay fast and light."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import SplitinferError

__all__ = ["COMMANDS"]


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output is read by people too: do not squeeze tables to 80 columns.
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 200)


def _emit_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


class _Progress:
    """A rich progress bar on stderr, fed (message, fraction) by the splitter."""

    def __init__(self, title: str, enabled: bool) -> None:
        self.title, self.enabled = title, enabled and sys.stderr.isatty()
        self._bar: Any = None

    def __enter__(self) -> Callable[[str, float], None]:
        if not self.enabled:
            return lambda what, frac: None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[what]}"),
                             TimeElapsedColumn(), console=_console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task(self.title, total=1.0, what="")
        return lambda what, frac: self._bar.update(task, completed=frac, what=what)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


# ---------------------------------------------------------------- rendering

def _fmt_bytes(n: float) -> str:
    if n >= 100 * 1024:
        return f"{n / 1024:,.0f} KiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n:.0f} B"


def _print_summary(summary: dict[str, Any], verification: dict[str, Any] | None = None) -> None:
    from rich.table import Table

    con = _console()
    m = summary["model"]
    con.print(f"[bold]{m['name']}[/]  plan {summary['plan']}  hash {summary['plan_hash'][:16]}…  "
              f"{m['flops'] / 1e9:.2f} GFLOP, {m['nodes']} nodes")
    for io in ("inputs", "outputs"):
        con.print(f"  {io}: " + ", ".join(f"{t['name']} {t['shape']} {t['dtype']}" for t in summary[io]))
    if summary["profiles"]:
        con.print("  profiles: " + ", ".join(f"{k} ({v['role']}, whole model {v['whole_ms']:.1f} ms)"
                                           for k, v in summary["profiles"].items() if v.get("whole_ms") is not None))
    a = summary["assumptions"]
    bws = list(summary["best_at_mbps"])
    table = Table(title=f"candidates (predictions: edge = split host × {a['edge_slowdown']:g} unless profiled "
                        f"on the edge, RTT {a['rtt_ms']:g} ms)", title_style="", header_style="bold")
    for col in ("id", "cut tensors", "raw", f"sends (codec {a['codec']})", "edge GFLOP", "cloud GFLOP", "edge ms", "cloud ms"):
        table.add_column(col, justify="left" if col in ("id", "cut tensors") else "right")
    for bw in bws:
        table.add_column(f"@{float(bw):g} Mbit/s", justify="right")
    checks = {c["id"]: c for c in (verification or {}).get("candidates", [])}
    if checks:
        table.add_column("verified", justify="right")
    for c in summary["candidates"]:
        cut = ", ".join(c["cut"][:3]) + (f" +{len(c['cut']) - 3}" if len(c["cut"]) > 3 else "")
        if c["kind"] == "edge":
            cut = "(all-edge)"
        elif c["kind"] == "cloud":
            cut = f"(all-cloud) {cut}"
        sends = "-" if c["kind"] == "edge" else f"{_fmt_bytes(c['sends'])} {c['sends_codec']}"
        row = [c["id"], cut, _fmt_bytes(c["bytes"]) if c["kind"] != "edge" else "-", sends,
               f"{c['flops_edge'] / 1e9:.2f}", f"{c['flops_cloud'] / 1e9:.2f}",
               "-" if c["edge_ms"] is None else f"{c['edge_ms']:.1f}",
               "-" if c["cloud_ms"] is None else f"{c['cloud_ms']:.1f}"]
        for bw in bws:
            p = c["predicted_ms"].get(bw)
            txt = "-" if p is None else f"{p:,.1f}"
            row.append(f"[bold green]{txt}[/]" if summary["best_at_mbps"][bw] == c["id"] else txt)
        if checks:
            ch = checks.get(c["id"])
            row.append("-" if ch is None else (f"✓ {ch['max_abs_diff']:.1e}" if ch["ok"] else f"[red]✗ {ch['problem']}[/]"))
        table.add_row(*row)
    con.print(table)
    _print_wire(summary)


def _print_wire(summary: dict[str, Any]) -> None:
    """Bytes per frame of each remote candidate per measured codec setting, with fidelity."""
    from rich.table import Table

    remote = [c for c in summary["candidates"] if c["wire"]]
    if not remote:
        return
    labels = list(dict.fromkeys(r["codec"] + (f" q{r['quality']}" if "quality" in r else "")
                                for c in remote for r in c["wire"]))
    s = summary.get("wire_samples") or {}
    table = Table(title=f"bytes per frame on the wire, measured on {s.get('frames', '?')} {s.get('source', '')} frames "
                        "(fidelity: 1 - relative output error)", title_style="", header_style="bold")
    table.add_column("id")
    table.add_column("raw", justify="right")
    for lab in labels:
        table.add_column(lab, justify="right")
    for c in remote:
        by = {r["codec"] + (f" q{r['quality']}" if "quality" in r else ""): r for r in c["wire"]}
        table.add_row(c["id"], _fmt_bytes(c["bytes"]),
                      *(f"{_fmt_bytes(by[lab]['bytes'])} ({by[lab]['fidelity']:.3f})" if lab in by else "-"
                        for lab in labels))
    _console().print(table)


# ---------------------------------------------------------------- subcommands

def _load_source(arg: str, shapes: dict[str, tuple[int, ...]]) -> tuple[Any, Any, dict[str, tuple[int, ...]]]:
    """``MODEL`` is an ONNX path or ``ref:NAME`` for a reference model."""
    if arg.startswith("ref:"):
        from .models import REFERENCE_MODELS, build

        name = arg[4:]
        if name not in REFERENCE_MODELS:
            raise SplitinferError(f"unknown reference model {name!r}; expected one of {sorted(REFERENCE_MODELS)}")
        shape = next(iter(shapes.values()), None)
        model, example = build(name, shape)
        return model, example, {}
    return Path(arg), None, shapes


def _normalize(args: argparse.Namespace) -> Any:
    """``--normalize`` as given; the reference models' image inputs take RGB in [0, 1]."""
    if args.normalize is not None:
        from ._types import PixelFormat

        try:
            return PixelFormat.parse(args.normalize)
        except ValueError as exc:
            raise SplitinferError(f"--normalize: {exc}") from None
    if args.model.startswith("ref:") and args.model[4:] in ("yolo-n", "yolo-s", "chain"):
        return "0-1"
    return None


def _cmd_split(args: argparse.Namespace) -> int:
    from .splitter import parse_input_shape, plan_summary, split_model

    shapes = dict(parse_input_shape(s) for s in args.input_shape or [])
    source, example, shapes = _load_source(args.model, shapes)
    extra = _load_npy(args.input, None) if args.input else []
    with _Progress("split", not args.json) as progress:
        res = split_model(source, args.output, input_shapes=shapes, example_input=example,
                          max_candidates=args.candidates, cut=args.cut.split(",") if args.cut else None,
                          verify=not args.no_verify, verify_inputs=extra, threads=args.threads,
                          profile=not args.no_profile, force=args.force, edge_slowdown=args.edge_slowdown,
                          normalize=_normalize(args), frames=args.frames, samples=args.samples, progress=progress)
    summary = plan_summary(res.plan, edge_slowdown=args.edge_slowdown)
    ver = res.verification.to_json() if res.verification else None
    if args.json:
        _emit_json({"ok": True, **summary, "verification": ver})
    else:
        _print_summary(summary, ver)
        png = res.plan.path / "report.png"
        _console().print(f"wrote {res.plan.path}" + (f" and {png}" if png.exists() else ""))
    return 0


def _load_npy(path: str, plan: Any) -> list[dict[str, Any]]:
    import numpy as np

    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SplitinferError(f"{path}: not a .npy/.npz file: {exc}") from exc
    if isinstance(data, np.ndarray):
        if plan is not None and len(plan.inputs) != 1:
            raise SplitinferError(f"{path}: a .npy holds one array but the model has inputs "
                                  f"{[t.name for t in plan.inputs]}; use a .npz with one array per input")
        name = plan.inputs[0].name if plan is not None else "input"
        return [{name: data}]
    return [dict(data.items())]


def _cmd_verify(args: argparse.Namespace) -> int:
    from .splitter import Plan, verify_plan

    plan = Plan.load(args.plan)
    extra = _load_npy(args.input, plan) if args.input else []
    report = verify_plan(plan, extra_inputs=extra, tolerance=args.tolerance, threads=args.threads)
    if args.json:
        _emit_json({"plan": str(plan.path), "plan_hash": plan.hash, **report.to_json()})
    else:
        from rich.table import Table

        t = Table(title=f"verify {plan.path} (tolerance {report.tolerance:g}, inputs: {', '.join(report.inputs)})",
                  header_style="bold")
        for col in ("candidate", "max |diff|", "batch-2 max |diff|", "result"):
            t.add_column(col)
        for c in report.checks:
            t.add_row(c.id, f"{c.max_abs_diff:.2e}" + (f" (fidelity {c.fidelity:.4f})" if c.fidelity is not None else ""),
                      "-" if c.batch_max_abs_diff is None else f"{c.batch_max_abs_diff:.2e}",
                      "[green]ok[/]" if c.ok else f"[red]FAIL[/] {c.problem}")
        _console().print(t)
        _console().print("[bold green]all candidates match[/]" if report.ok else "[bold red]verification failed[/]")
    return 0 if report.ok else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .splitter import Plan, plan_summary

    plan = Plan.load(args.plan)
    summary = plan_summary(plan, edge_slowdown=args.edge_slowdown)
    if args.json:
        _emit_json(summary)
    else:
        _print_summary(summary)
    return 0


def _cmd_bottleneck(args: argparse.Namespace) -> int:
    from .splitter import add_bottleneck

    with _Progress("bottleneck", not args.json) as progress:
        res = add_bottleneck(args.plan, args.at, frames=args.frames, train_frames=args.train_frames,
                             eval_frames=args.eval_frames, channels=args.channels, stride=args.stride,
                             hidden=args.hidden, minutes=args.minutes, rate_weight=args.rate_weight, seed=args.seed,
                             threads=args.threads, weights=args.weights, save=args.save, progress=progress)
    out = res.to_json()
    jpeg = res.plan.candidates[0].rung("jpeg") if res.plan.candidates[0].edge is None else None
    if jpeg is not None:
        out["all_cloud_jpeg"] = jpeg.to_json()
    if args.json:
        _emit_json({"ok": True, **out})
        return 0
    c = _console()
    c.print(f"added candidate [bold]{res.candidate}[/] at {res.at} to {res.plan.path}: {_fmt_bytes(res.rung.nbytes)} a "
            f"frame (rans), fidelity {res.rung.fidelity:.4f} on {res.frames['held_out']} held-out frames"
            + (f"; the all-cloud JPEG q{jpeg.quality}: {_fmt_bytes(jpeg.nbytes)}, fidelity {jpeg.fidelity:.4f}"
               if jpeg is not None else ""))
    how = "the model's outputs through the frozen back" if res.distilled == "outputs" else "the cut tensor alone"
    c.print(("attached weights " + str(args.weights) + ", " if args.weights else "") + f"trained {res.training.steps} steps in {res.training.seconds:.0f} s on {res.frames['train']} frames, "
            f"distilling {how}" + (f" (the back uses {res.unsupported_ops}, which the torch interpreter lacks)"
                                   if res.unsupported_ops else ""))
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from .splitter import Plan, profile_plan

    plan = Plan.load(args.plan)
    with _Progress(f"profile ({args.role})", not args.json) as progress:
        name, info = profile_plan(plan, role=args.role, device=args.name, threads=args.threads, progress=progress)
    if args.json:
        _emit_json({"plan": str(plan.path), "device": name, **info})
    else:
        from rich.table import Table

        t = Table(title=f"{name}: {info['processor']}, {info['threads'] or 'default'} threads, "
                        f"whole model {info['whole_ms']:.2f} ms", header_style="bold")
        t.add_column("candidate")
        for col in ("edge ms", "cloud ms"):
            t.add_column(col, justify="right")
        for cid, times in info["candidates"].items():
            t.add_row(cid, *(f"{times[k]:.2f}" if k in times else "-" for k in ("edge_ms", "cloud_ms")))
        _console().print(t)
        _console().print(f"stored profile {name!r} in {plan.path / 'manifest.json'} (plan hash unchanged)")
    return 0


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SplitinferError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _cmd_netem(args: argparse.Namespace) -> int:
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


def _cmd_cloud_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from .cloud import CloudService, load_tokens

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tokens = load_tokens(args.token_file) if args.token_file else None
    svc = CloudService(args.plans, listen=_hostport(args.listen), http=_hostport(args.http), tokens=tokens,
                       tls_cert=args.tls_cert, tls_key=args.tls_key, advertise=not args.no_advertise,
                       max_batch_size=args.max_batch_size, max_queue_delay_ms=args.max_queue_delay_ms,
                       postprocess=args.postprocess, max_connections=args.max_connections, max_rows=args.max_rows,
                       idle_timeout_s=args.idle_timeout_s)

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


def _cmd_edge_run(args: argparse.Namespace) -> int:
    import asyncio
    import collections

    import numpy as np

    from .edge import EdgeAgent
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
            print(f"edge: ready, cloud {state}", file=sys.stderr, flush=True)
            ready_cpu[0] = _cpu_s()

            def until_stopped() -> Any:
                for f in frames:
                    if stop.is_set():
                        return
                    yield f

            async for r in agent.stream(until_stopped(), fps=args.fps):
                results.append(r)
                if out is not None:
                    out.write(json.dumps(r.to_json()) + "\n")
            probe_bytes[0] = agent.probe_bytes
            settings.update({c.id: st[0] + (f" q{st[1]}" if st[1] is not None else "")
                             for c, st in zip(plan.candidates, agent.settings) if st is not None})
        return results

    settings: dict[str, str] = {}  # what each remote candidate's cut travelled in
    probe_bytes = [0]  # the bandwidth probes' bytes: uplink traffic beyond the frames'
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


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demos.traffic_camera.app import parse_args_into_config, run_demo

    if args.headless and args.frames is None:
        args.frames = 300
    return run_demo(parse_args_into_config(args), headless=args.headless, as_json=args.json)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "split": _cmd_split, "verify": _cmd_verify, "inspect": _cmd_inspect, "profile": _cmd_profile,
    "bottleneck": _cmd_bottleneck,
    "netem": _cmd_netem, "cloud serve": _cmd_cloud_serve, "edge run": _cmd_edge_run, "demo": _cmd_demo,
}
