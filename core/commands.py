"""The plan's ``splitinfer`` subcommands (split, verify, inspect, bottleneck, profile) and the
table of every subcommand; the ones that run the system are in :mod:`splitinfer.run_commands`.
:mod:`splitinfer.cli` parses the command line and maps errors to exit codes. Each command imports
its part lazily so that ``splitinfer --help`` and the edge's commands stay fast and light."""

from __future__ import annotations

import argparse
import json
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


def _run(name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of :mod:`splitinfer.run_commands`, imported when it runs."""
    def run(args: argparse.Namespace) -> int:
        from . import run_commands

        return int(getattr(run_commands, name)(args))

    return run


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "split": _cmd_split, "verify": _cmd_verify, "inspect": _cmd_inspect, "profile": _cmd_profile,
    "bottleneck": _cmd_bottleneck,
    "netem": _run("cmd_netem"), "cloud serve": _run("cmd_cloud_serve"), "edge run": _run("cmd_edge_run"),
    "demo": _run("cmd_demo"),
}
