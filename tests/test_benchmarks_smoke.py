"""The benchmark harness runs in --quick mode and writes its table (timing is not judged here),
and what the adapters declare about costs agrees with what the last full run measured."""

import json
import subprocess
import sys
from pathlib import Path

from bf16bridge import registry

ROOT = Path(__file__).resolve().parent.parent
FULL = ROOT / "benchmarks" / "results" / "full.json"


def _copying_importers() -> list[str]:
    """The adapters whose import copies an unaligned buffer itself: each declares import_copy_cost."""
    return [n for n in registry.names() if registry.get(n).dlpack_unaligned == "copies"]


def test_quick_benchmark_runs_and_writes_its_table(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Targets" in doc and "## 1 KiB of bf16" in doc and "## 32 MiB of bf16" in doc
    assert doc.count("| torch -> numpy |") >= 2 and "## Kernels" in doc and "import bf16bridge" in doc
    assert "## What an import's own copy costs" in doc
    res = json.loads((tmp_path / "quick.json").read_text())
    n = len(registry.names())
    assert res["mode"] == "quick" and len(res["pairs"]) == 2 * n * (n - 1) and res["pairs_left_out"] == []
    measured = {c["adapter"]: c for c in res["import_copy_cost"]}
    assert sorted(measured) == sorted(_copying_importers()) != []
    assert all(c["measured"] > 0 and c["own"]["median"] > 0 and c["bridge"]["median"] > 0 for c in measured.values())
    assert all(not r["copies"] for r in res["pairs"]), "every pair is zero-copy for aligned input"
    assert (tmp_path / "benchmarks.png").stat().st_size > 10_000


def test_declared_import_copy_cost_agrees_with_the_saved_measurement():
    """Adapter.import_copy_cost says whether the framework's own copy on import costs more (> 1) or
    less (< 1) than the bridge's aligned copy; the planner acts on it. The last full benchmark run
    (benchmarks/results/full.json, `python -m benchmarks`) measured it: both must be on the same side.
    (The adapters are loaded here, not at collection, so collecting imports no framework.)"""
    saved = {c["adapter"]: c for c in json.loads(FULL.read_text()).get("import_copy_cost", [])}
    names = _copying_importers()
    assert names, "no adapter's import copies an unaligned buffer: nothing declares import_copy_cost"
    for name in names:
        assert name in saved, f"{FULL.name} has no import_copy_cost measurement for {name}: run python -m benchmarks"
        declared, measured = registry.get(name).import_copy_cost, saved[name]["measured"]
        assert declared != 1 and measured != 1
        assert (declared > 1) == (measured > 1), (
            f"{name} declares import_copy_cost={declared:g}, the benchmark measured {measured:.2f}")
