"""The package runs on Python 3.10 (JetPack 6's), proven without a 3.10 interpreter: every module
is parsed by vermin, which knows in which version each syntax form, module, function and keyword
argument of the standard library appeared, and must need nothing newer than 3.10. The packaging
says so too."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["core", "edge", "transport", "splitter", "cloud", "demos"]


def _vermin() -> str:
    """The vermin beside this interpreter (the dev extra's), else on PATH; skips without it."""
    found = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    if found is None:
        pytest.skip("vermin is not installed (it comes with the dev extra)")
    return found


def test_every_module_needs_nothing_newer_than_python_3_10():
    vermin = _vermin()
    p = subprocess.run([vermin, "--no-tips", "--violations", "--eval-annotations", "-t=3.10-",
                        "--backport", "typing_extensions", *PACKAGES], cwd=ROOT, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, f"modules need a Python newer than 3.10:\n{p.stdout}\n{p.stderr}"
    assert "Minimum required versions" in p.stdout and "Incompatible" in p.stdout, p.stdout  # it analysed the files


def test_a_module_that_needs_python_3_11_is_caught(tmp_path):
    """The check above can fail: a 3.11-only module (tomllib) is named."""
    vermin = _vermin()
    (tmp_path / "m.py").write_text("import tomllib\n")
    p = subprocess.run([vermin, "--no-tips", "--violations", "-t=3.10-", str(tmp_path / "m.py")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "tomllib" in p.stdout


def test_the_packaging_admits_python_3_10():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=3\.10"$', text, re.M)
    assert re.search(r'^target-version = "py310"$', text, re.M)
