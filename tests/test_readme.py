"""The README's Python blocks run as written, in order, in one fresh interpreter from the
repository root (the plan they write goes to plans/, which .gitignore excludes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_blocks_run_as_written():
    pytest.importorskip("torch")
    pytest.importorskip("aiohttp")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 3
    for k, code in enumerate(blocks):
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"README python block {k + 1} failed:\n{code}\n{p.stderr[-3000:]}"
