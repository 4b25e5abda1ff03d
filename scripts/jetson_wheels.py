"""Which wheels a Jetson gets: resolve the base install's dependencies (pyproject's floors) for
an aarch64 device and a Python version without that device or that interpreter.

    python scripts/jetson_wheels.py                      # JetPack 6: Python 3.10, glibc 2.35
    python scripts/jetson_wheels.py --python 3.12 --glibc 2.39 --json

``pip download --only-binary=:all:`` with the device's platform tags (manylinux_2_17 up to its
glibc) and Python version: a dependency with no binary wheel for it fails here, naming the
package, instead of trying to compile on the camera. Resolved twice: the newest releases the
floors admit, and every dependency pinned at its floor (are the floors honest for the device?).
Prints a table and writes benchmarks/results/jetson_wheels.json (each package: version, wheel,
the oldest glibc its platform tags accept).
Needs the package index (pip's own configuration); nothing is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def base_dependencies() -> list[str]:
    """The ``[project] dependencies`` of pyproject.toml: what the edge install pulls. (Run on the
    developer's machine: reading the TOML needs Python 3.11's tomllib.)"""
    try:
        import tomllib
    except ModuleNotFoundError:
        raise SystemExit("scripts/jetson_wheels.py reads pyproject.toml with tomllib: run it on Python 3.11 or newer")

    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def platform_tags(arch: str, glibc: str) -> list[str]:
    """Every manylinux tag a device with this glibc accepts, newest first (pip takes them as given)."""
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < 17:
        raise ValueError(f"glibc must be 2.17 or newer, got {glibc}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}"]


def wheel_tag(name: str) -> tuple[str, str, str]:
    """(distribution, version, platform tag) of a wheel's file name."""
    stem = name[:-len(".whl")]
    parts = stem.split("-")
    return parts[0], parts[1], parts[-1]


def needs_glibc(platform: str) -> str | None:
    """The oldest glibc a wheel's platform tags accept (any one of its tags will do): None for a
    pure-Python wheel."""
    versions = [17 for t in platform.split(".") if t.startswith("manylinux2014")]
    versions += [int(m) for m in re.findall(r"manylinux_2_(\d+)_", platform)]
    return f"2.{min(versions)}" if versions else None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def resolve(python: str, glibc: str, arch: str, requirements: list[str], dest: Path,
            lifted: dict | None = None) -> list[dict]:
    """The wheels pip picks for the device. ``lifted`` (for requirements pinned at their floors):
    a floor with no wheel for the device is raised to its lowest release that has one, and noted
    there."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-cache-dir",
           "--python-version", python, "--implementation", "cp", "-d", str(dest)]
    for tag in platform_tags(arch, glibc):
        cmd += ["--platform", tag]
    p = subprocess.run(cmd + requirements, capture_output=True, text=True)
    if p.returncode != 0 and lifted is not None:  # a pinned floor with no wheel: its lowest release that has one
        m = re.search(r"requirement (\S+)==(\S+) \(from versions: ([^)]*)\)", p.stderr)
        if m and len(lifted) < len(requirements):
            name, floor, versions = m.group(1), m.group(2), [v.strip() for v in m.group(3).split(",")]
            final = [v for v in versions if re.fullmatch(r"[\d.]+", v) and _key(v) >= _key(floor)]
            if final:
                up = min(final, key=_key)
                lifted[name] = {"floor": floor, "lowest_with_a_wheel": up}
                requirements = [f"{name}=={up}" if r == f"{name}=={floor}" else r for r in requirements]
                return resolve(python, glibc, arch, requirements, dest, lifted)
    if p.returncode != 0:
        missing = re.findall(r"No matching distribution found for (\S+)", p.stderr)
        raise RuntimeError(f"no binary wheel for {', '.join(missing) or 'a dependency'} on Python {python}, "
                           f"{arch}, glibc {glibc}:\n{p.stderr.strip()[-2000:]}")
    rows = []
    for whl in sorted(dest.glob("*.whl")):
        dist, version, plat = wheel_tag(whl.name)
        rows.append({"package": dist, "version": version, "platform": plat, "needs_glibc": needs_glibc(plat),
                     "wheel": whl.name, "mb": round(whl.stat().st_size / 2**20, 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="3.10", help="the device's Python (JetPack 6: 3.10)")
    ap.add_argument("--glibc", default="2.35", help="the device's glibc (JetPack 6, Ubuntu 22.04: 2.35)")
    ap.add_argument("--arch", default="aarch64")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python) or not re.fullmatch(r"\d+\.\d+", args.glibc):
        print(f"--python must look like 3.10 and --glibc like 2.35, got {args.python!r} and {args.glibc!r}",
              file=sys.stderr)
        return 2
    reqs = base_dependencies()
    floors = [re.sub(r">=", "==", r) for r in reqs]  # each at its floor: are the floors honest for the device?
    result: dict = {"python": args.python, "glibc": args.glibc, "arch": args.arch, "requirements": reqs}
    for name, asked in (("newest", reqs), ("floors", floors)):
        lifted: dict | None = {} if name == "floors" else None
        with tempfile.TemporaryDirectory() as tmp:
            try:
                rows = resolve(args.python, args.glibc, args.arch, asked, Path(tmp), lifted)
            except (RuntimeError, ValueError) as e:
                print(e, file=sys.stderr)
                return 1
        result[name] = {"wheels": rows, "total_mb": round(sum(r["mb"] for r in rows), 1),
                        "needs_glibc": max((r["needs_glibc"] for r in rows if r["needs_glibc"]),
                                           key=lambda v: int(v.split(".")[1]), default=None)}
        if lifted is not None:
            result[name]["floors_without_a_wheel"] = lifted
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "jetson_wheels.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    for name, what in (("newest", "the newest releases the floors admit"), ("floors", "every dependency at its floor")):
        rows = result[name]["wheels"]
        print(f"Python {args.python}, {args.arch}, glibc {args.glibc}, {what}: {len(rows)} wheels, "
              f"{result[name]['total_mb']} MB; the device needs glibc >= {result[name]['needs_glibc']}")
        width = max(len(r["package"]) for r in rows)
        for r in rows:
            glibc = f"glibc >= {r['needs_glibc']}" if r["needs_glibc"] else "pure Python"
            print(f"  {r['package']:<{width}}  {r['version']:<10} {glibc:<16} {r['mb']:>6.2f} MB  {r['wheel']}")
        for pkg, v in result[name].get("floors_without_a_wheel", {}).items():
            print(f"  floor {pkg}>={v['floor']} has no wheel for the device: its lowest release with one is "
                  f"{v['lowest_with_a_wheel']}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
