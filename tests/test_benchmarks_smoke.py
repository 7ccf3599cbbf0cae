"""The benchmark harness runs in --quick mode and writes its table (timing is not judged here),
and what the adapters declare about costs agrees with what the last full run measured."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bf16bridge import registry

ROOT = Path(__file__).resolve().parent.parent
FULL = ROOT / "benchmarks" / "results" / "full.json"
FUNCTIONS = ROOT / "benchmarks" / "results" / "functions.json"


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
    _check_functions(doc, json.loads((tmp_path / "functions-quick.json").read_text()))


def _check_functions(doc: str, fres: dict) -> None:
    """The cost-of-a-call part: every section on the page, every pair and direction measured, the
    bridge and each hand-written wrapper agreeing bit for bit, and the peers' failures recorded."""
    for head in ("# The cost of a call", "## Targets (the cost of a call)", "## convert of 1 KiB against the raw call",
                 "## convert_tree of a GPT-2-small-shaped state dict (148 bf16 tensors)",
                 "## Bridged functions against a hand-written wrapper", "## Where each peer fails (bf16)"):
        assert head in doc, head
    n = len(registry.names())
    conv = fres["convert"]["rows"]
    assert len(conv) == n * (n - 1) and all(r["times"]["bridge"]["best"] > 0 < r["times"]["raw"]["best"] for r in conv)
    assert {(r["source"], r["target"]) for r in conv if "bridge, on_alias='allow'" in r["times"]} == {
        ("jax", "torch"), ("tensorflow", "torch")}, "the pairs that warn by default are timed with on_alias='allow' too"
    assert [(r["source"], r["target"]) for r in fres["tree"]] == [
        ("torch", "numpy"), ("numpy", "torch"), ("torch", "jax"), ("jax", "torch"), ("torch", "tensorflow"),
        ("tensorflow", "torch")]
    assert all(r["tensors"] == 148 for r in fres["tree"])
    bridged = fres["bridged"]
    assert len(bridged) == 6 and all(r["same_bits"] for r in bridged), "the bridge and the wrapper differ"
    peers = fres["peers"]
    assert any(r["tool"] == "bf16bridge" for r in peers) and all(r["ok"] for r in peers if r["tool"] == "bf16bridge")
    assert any(r["ok"] is False for r in peers if r["tool"] == "the framework's own call")


def test_functions_part_runs_alone_and_writes_the_page_from_saved_results(tmp_path, monkeypatch):
    """--only functions runs the cost-of-a-call part alone, saves its results, and writes the page
    from them and the main part's results saved before (quick.json in the same folder), which it
    does not run again. (The parts are stubbed: this checks the wiring, the run is checked above.)"""
    import benchmarks.__main__ as entry
    from benchmarks import functions, harness, report

    main_saved, fres, seen = {"saved": "main"}, {"mode": "quick", "ran": "functions"}, []
    (tmp_path / "quick.json").write_text(json.dumps(main_saved))
    monkeypatch.setattr(functions, "run", lambda quick, log=print: fres)
    monkeypatch.setattr(harness, "run", lambda *a, **k: pytest.fail("--only functions ran the main part"))
    monkeypatch.setattr(report, "markdown", lambda res, plot, functions=None: seen.append((res, functions)) or "page\n")
    monkeypatch.setattr(report, "plot", lambda res, path: False)
    monkeypatch.setattr(report, "targets", lambda res: [])
    monkeypatch.setattr(report, "function_targets", lambda f: [])
    assert entry.main(["--quick", "--only", "functions", "--out", str(tmp_path)]) == 0
    assert seen == [(main_saved, fres)]
    assert json.loads((tmp_path / "functions-quick.json").read_text()) == fres
    assert json.loads((tmp_path / "quick.json").read_text()) == main_saved, "the main part's results were rewritten"
    assert (tmp_path / "benchmarks.md").read_text() == "page\n"


def test_the_page_is_generated_from_the_saved_results():
    """docs/benchmarks.md is what the report makes of benchmarks/results/{full,functions}.json: no
    number on it is typed by hand, and it was written again after the last run of either part."""
    from benchmarks import report

    res, fres = report.load(FULL), report.load(FUNCTIONS)
    assert fres is not None, f"{FUNCTIONS} is missing: run python -m benchmarks --only functions"
    assert (ROOT / "docs" / "benchmarks.md").read_text() == report.markdown(res, "benchmarks.png", fres)


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
