"""The ``splitinfer`` command. One subcommand per job; each imports its part lazily so that
``splitinfer --help`` and the edge's commands stay fast and light.

Exit status: 0 success; 1 a check failed (``verify``); 2 bad input (the message names it).
With ``--json`` the last line on stdout is one JSON object, also on failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import SplitinferError, VerificationError

__all__ = ["main"]


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

def _fmt_bytes(n: int) -> str:
    return f"{n / 1024:,.0f} KiB" if n >= 1024 else f"{n} B"


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
    for col in ("id", "cut tensors", "sends", "edge GFLOP", "cloud GFLOP", "edge ms", "cloud ms"):
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
        row = [c["id"], cut, _fmt_bytes(c["bytes"]) if c["kind"] != "edge" else "-",
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
                          progress=progress)
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
            t.add_row(c.id, f"{c.max_abs_diff:.2e}",
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
    import signal

    from .cloud import CloudService, load_tokens

    tokens = load_tokens(args.token_file) if args.token_file else None
    if tokens is None:
        print("warning: no --token-file: any client that knows a plan hash may use this service", file=sys.stderr)
    svc = CloudService(args.plans, listen=_hostport(args.listen), http=_hostport(args.http), tokens=tokens,
                       tls_cert=args.tls_cert, tls_key=args.tls_key, advertise=not args.no_advertise,
                       max_batch_size=args.max_batch_size, max_queue_delay_ms=args.max_queue_delay_ms,
                       postprocess=args.postprocess)

    async def run() -> None:
        await svc.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        for what, url in svc.addresses.items():
            print(f"{what}: {url}", flush=True)
        print(f"serving {len(svc.plans)} plan(s): " + ", ".join(f"{s.plan.name} {h[:12]}" for h, s in svc.plans.items())
              + f"; batching up to {args.max_batch_size}, {args.max_queue_delay_ms:g} ms; Ctrl-C to stop", flush=True)
        await stop.wait()
        print("shutting down", flush=True)
        await svc.stop()

    asyncio.run(run())
    return 0


def _cmd_edge_run(args: argparse.Namespace) -> int:
    import asyncio
    import collections

    import numpy as np

    from .edge import EdgeAgent
    from .edge.sources import frames_from
    from .splitter import Plan

    plan = Plan.load(args.plan)
    token = None
    if args.token_file:
        lines = [ln.strip() for ln in Path(args.token_file).read_text().splitlines() if ln.strip()]
        token = lines[0] if lines else None
    frames = frames_from(args.source, plan, args.frames)
    # line-buffered: a run that is stopped early keeps every finished frame's record
    out = open(args.out, "w", buffering=1) if args.out else None  # noqa: SIM115 - closed below

    async def run() -> list[Any]:
        results = []
        cloud = None if args.cloud == "none" else args.cloud
        print("edge: starting (loading and timing the edge segments)", file=sys.stderr, flush=True)
        async with EdgeAgent(plan, cloud, token=token, codec=args.codec, input_codec=args.input_codec,
                             threads=args.threads, candidate=args.candidate,
                             policy=args.policy, latency_budget_ms=args.latency_budget_ms,
                             postprocess=args.postprocess, emulate_slowdown=args.emulate_slowdown) as agent:
            # models loaded and timed, connection up (or not): what comes next is the frames
            print(f"edge: ready, cloud {'connected' if agent.connected else 'not connected'}", file=sys.stderr,
                  flush=True)
            async for r in agent.stream(frames, fps=args.fps):
                results.append(r)
                if out is not None:
                    out.write(json.dumps(r.to_json()) + "\n")
        return results

    try:
        results = asyncio.run(run())
    finally:
        if out is not None:
            out.close()
    lat = np.array([r.timings["total_ms"] for r in results]) if results else np.zeros(1)
    cuts = collections.Counter(r.candidate for r in results)
    summary = {
        "frames": len(results),
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)),
                       "p99": float(np.percentile(lat, 99)), "mean": float(lat.mean())},
        "cuts": dict(cuts), "bytes_sent": int(sum(r.bytes_sent for r in results)),
        "bytes_per_frame": float(np.mean([r.bytes_sent for r in results])) if results else 0.0,
        "fallbacks": sum(r.fallback for r in results), "out": args.out,
    }
    if args.json:
        _emit_json(summary)
    else:
        from rich.table import Table

        t = Table(title=f"edge run: {plan.name} via {args.cloud}", header_style="bold")
        for col in ("frames", "P50 ms", "P90 ms", "P99 ms", "cuts used", "KiB/frame", "fallbacks"):
            t.add_column(col, justify="right")
        L = summary["latency_ms"]
        t.add_row(str(summary["frames"]), f"{L['p50']:.1f}", f"{L['p90']:.1f}", f"{L['p99']:.1f}",
                  ", ".join(f"{k}×{v}" for k, v in cuts.most_common()), f"{summary['bytes_per_frame'] / 1024:.1f}",
                  str(summary["fallbacks"]))
        _console().print(t)
    return 0


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="splitinfer", description="Edge-cloud split inference.")
    p.add_argument("--version", action="version", version=f"splitinfer {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("split", help="cut a model into a verified plan directory")
    s.add_argument("model", help="an ONNX file, or ref:NAME for a reference model (yolo-n, yolo-s, chain, transformer)")
    s.add_argument("-o", "--output", required=True, help="plan directory to create")
    s.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="fix an input's shape (repeat per input)")
    s.add_argument("--candidates", type=int, default=8, metavar="K", help="keep at most K candidate cuts (default 8)")
    s.add_argument("--cut", metavar="T1,T2", help="force this cut (tensor names) besides the two ends")
    s.add_argument("--input", metavar="NPY", help="also verify on this .npy/.npz input")
    s.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all)")
    s.add_argument("--edge-slowdown", type=float, default=5.0,
                   help="predictions: the edge is this many times slower than this machine until profiled (default 5)")
    s.add_argument("--no-verify", action="store_true", help="skip verification (not recommended)")
    s.add_argument("--no-profile", action="store_true", help="skip timing; pick cuts from FLOPs")
    s.add_argument("--force", action="store_true", help="replace an existing plan directory")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(fn=_cmd_split)

    v = sub.add_parser("verify", help="check every candidate against the whole model")
    v.add_argument("plan")
    v.add_argument("--input", metavar="NPY", help="also verify on this .npy (one input) or .npz (named inputs)")
    v.add_argument("--tolerance", type=float, default=1e-5, help="max abs difference allowed (default 1e-5)")
    v.add_argument("--threads", type=int, default=None)
    v.add_argument("--json", action="store_true")
    v.set_defaults(fn=_cmd_verify)

    i = sub.add_parser("inspect", help="print a plan's manifest summary")
    i.add_argument("plan")
    i.add_argument("--edge-slowdown", type=float, default=5.0)
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=_cmd_inspect)

    pr = sub.add_parser("profile", help="time a plan on this machine and store the device profile in it")
    pr.add_argument("plan")
    pr.add_argument("--role", choices=("edge", "cloud", "both"), required=True)
    pr.add_argument("--name", metavar="DEVICE", help="profile name (default ROLE-HOSTNAME)")
    pr.add_argument("--threads", type=int, default=None)
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(fn=_cmd_profile)

    n = sub.add_parser("netem", help="a TCP relay that emulates a link: rate, delay, trace replay")
    n.add_argument("--listen", required=True, metavar="HOST:PORT")
    n.add_argument("--to", required=True, metavar="HOST:PORT")
    g = n.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", metavar="RATE", help="e.g. 20mbit, 500kbit (each direction)")
    g.add_argument("--trace", metavar="CSV", help="time_s,mbps rows, replayed and looped")
    n.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay (ms)")
    n.add_argument("--speedup", type=float, default=1.0, help="replay the trace this many times faster")
    n.set_defaults(fn=_cmd_netem)

    c = sub.add_parser("cloud", help="the cloud service")
    csub = c.add_subparsers(dest="cloud_command", metavar="CMD", required=True)
    cs = csub.add_parser("serve", help="serve plans to edge devices until SIGINT/SIGTERM")
    cs.add_argument("plans", nargs="+", metavar="PLAN")
    cs.add_argument("--listen", default="0.0.0.0:7000", metavar="HOST:PORT", help="edge channel, TCP (default 0.0.0.0:7000)")
    cs.add_argument("--http", default="0.0.0.0:8000", metavar="HOST:PORT",
                    help="health, metrics, plans, WebRTC signalling (default 0.0.0.0:8000)")
    cs.add_argument("--token-file", metavar="PATH", help="accepted tokens, one per line")
    cs.add_argument("--tls-cert", metavar="PATH")
    cs.add_argument("--tls-key", metavar="PATH")
    cs.add_argument("--no-advertise", action="store_true", help="do not advertise with zeroconf")
    cs.add_argument("--max-batch-size", type=int, default=8, metavar="N", help="requests per batch (default 8)")
    cs.add_argument("--max-queue-delay-ms", type=float, default=2.0, metavar="MS",
                    help="longest wait for a batch to fill (default 2)")
    cs.add_argument("--postprocess", choices=("yolo",), help="send back detections instead of raw outputs")
    cs.set_defaults(fn=_cmd_cloud_serve)

    e = sub.add_parser("edge", help="the edge agent")
    esub = e.add_subparsers(dest="edge_command", metavar="CMD", required=True)
    er = esub.add_parser("run", help="run frames through the plan, adapting the cut")
    er.add_argument("plan")
    er.add_argument("--cloud", default="auto", help="auto (zeroconf), tcp://H:P, tls://H:P, webrtc://H:HTTP_PORT, none")
    er.add_argument("--source", default="synthetic", help="synthetic, scene (a moving road), or a video file (PyAV)")
    er.add_argument("--out", metavar="JSONL", help="one JSON record per frame")
    er.add_argument("--frames", type=int, default=None, help="stop after N frames (synthetic: default 100)")
    er.add_argument("--fps", type=float, default=None, help="pace the source at F frames per second")
    er.add_argument("--token-file", metavar="PATH")
    er.add_argument("--codec", default="fp16", help="tensor codec for cut tensors (default fp16)")
    er.add_argument("--input-codec", default=None, help="codec for the all-cloud input, e.g. jpeg (default: --codec)")
    er.add_argument("--threads", type=int, default=None, help="onnxruntime threads on the edge")
    er.add_argument("--candidate", metavar="ID", help="pin one candidate (an id, edge or cloud) instead of adapting")
    er.add_argument("--policy", choices=("latency", "bytes"), default="latency")
    er.add_argument("--latency-budget-ms", type=float, default=None, help="with --policy bytes")
    er.add_argument("--postprocess", choices=("yolo",), default=None)
    er.add_argument("--emulate-slowdown", type=float, default=1.0,
                    help="make this machine stand for a device N times slower (demos, tests)")
    er.add_argument("--json", action="store_true")
    er.set_defaults(fn=_cmd_edge_run)

    d = sub.add_parser("demo", help="the traffic-camera demo: cloud, link emulator, edge and a live dashboard")
    d.add_argument("--headless", action="store_true", help="no dashboard: run --frames frames, print a summary")
    d.add_argument("--frames", type=int, default=None, help="stop after N frames (headless default 300)")
    d.add_argument("--source", metavar="VIDEO", help="a video file (PyAV); default: a rendered road")
    d.add_argument("--model", metavar="DETECTOR.onnx", help="a YOLOv8-style detector [1, 4+classes, N]")
    d.add_argument("--classes", metavar="FILE", help="class names, one per line (default: the model's metadata)")
    link = d.add_mutually_exclusive_group()
    link.add_argument("--trace", metavar="CSV", help="replay a time_s,mbps bandwidth trace (default: embedded)")
    link.add_argument("--bandwidth", metavar="RATE", help="a constant link, e.g. 5mbit")
    d.add_argument("--cloud", metavar="tcp://H:P", help="use a running cloud service instead of a local one")
    d.add_argument("--fps", type=float, default=8.0)
    d.add_argument("--slowdown", type=float, default=8.0, help="the edge device is N times slower than this machine")
    d.add_argument("--http", default="127.0.0.1:8000", metavar="HOST:PORT", help="the dashboard's address")
    d.add_argument("--json", action="store_true", help="end with one JSON object (the summary)")
    d.set_defaults(fn=_cmd_demo)
    return p


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demos.traffic_camera.app import parse_args_into_config, run_demo

    if args.headless and args.frames is None:
        args.frames = 300
    return run_demo(parse_args_into_config(args), headless=args.headless, as_json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except VerificationError as exc:
        return _fail(args, exc, 1)
    except SplitinferError as exc:
        return _fail(args, exc, 2)
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError) as exc:  # bad option values, unreadable files: named, exit 2
        return _fail(args, exc, 2)


def _fail(args: argparse.Namespace, exc: Exception, code: int) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if getattr(args, "json", False):
        _emit_json({"ok": False, "error": str(exc), "error_type": type(exc).__name__})
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
