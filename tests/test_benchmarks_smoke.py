"""The benchmark harness runs in --quick mode and writes its table (timing is not judged here)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_runs_and_writes_its_table(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Targets" in doc and "## 1 KiB of bf16" in doc and "## 32 MiB of bf16" in doc
    assert doc.count("| torch -> numpy |") >= 2 and "## Kernels" in doc and "import bf16bridge" in doc
    res = json.loads((tmp_path / "quick.json").read_text())
    assert res["mode"] == "quick" and len(res["pairs"]) == 24
    assert all(not r["copies"] for r in res["pairs"]), "every pair is zero-copy for aligned input"
    assert (tmp_path / "benchmarks.png").stat().st_size > 10_000
