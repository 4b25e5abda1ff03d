"""The candidate tables for the YOLO-style detector (n at 640) and the transformer encoder, as
`splitinfer split` prints them, saved as JSON.

    python benchmarks/candidate_tables.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

MODELS = [("ref:yolo-n", "input=1,3,640,640"), ("ref:transformer", "input=1,64,64"), ("ref:chain", "input=1,3,224,224")]


def main() -> None:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model, shape in MODELS:
            plan = Path(tmp) / model[4:]
            base = [sys.executable, "-m", "splitinfer", "split", model, "-o", str(plan), "--input-shape", shape]
            subprocess.run(base, check=True)  # the human table
            p = subprocess.run([sys.executable, "-m", "splitinfer", "inspect", str(plan), "--json"],
                               check=True, capture_output=True, text=True)
            out[model] = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"wrote {save('candidate_tables', out)}")


if __name__ == "__main__":
    main()
