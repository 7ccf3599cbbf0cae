"""The benchmark harness runs in --quick mode and writes its table (timing is not judged here),
and what the adapters declare about costs agrees with what the last full run measured."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bf16bridge.core import registry
from strategies import needs_newer_ml_dtypes, numpy_holds

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "benchmarks" / "results" / "full.json"
FUNCTIONS = ROOT / "benchmarks" / "results" / "functions.json"
PARTS = ("dtypes", "checkpoints", "shards", "kernels", "casting")


def _copying_importers() -> list[str]:
    """The adapters whose import copies an unaligned buffer itself: each declares import_copy_cost."""
    return [n for n in registry.names() if registry.get(n).dlpack_unaligned == "copies"]


def _import_copies(name: str) -> bool:
    """Whether the adapter's hand-off from numpy copies a buffer 16 bytes past a 64-byte boundary."""
    from bf16bridge.core.memory import aligned_empty

    imp = next(h for h in registry.get(name).handoffs() if (h.src, h.dst) == (registry.HUB, name))
    x = aligned_empty((4096 + 64,), "uint8")[16:16 + 4096]
    y = imp.run(x)
    if hasattr(y, "block_until_ready"):
        y.block_until_ready()
    return registry.get(name).data_ptr(y) != x.ctypes.data


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # the harness measures every registered pair
def test_quick_benchmark_runs_and_writes_its_table(tmp_path):
    """Every part in its quick form, every framework, from a folder that is not the repository's."""
    out = subprocess.run([sys.executable, "-m", "bf16bridge.bench", "--quick", "--only", "all", "--frameworks", "all",
                          "--out", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Targets" in doc and "## 1 KiB of bf16" in doc and "## 1 MiB of bf16" in doc
    assert doc.count("| torch -> numpy |") >= 2 and "## Kernels" in doc and "import bf16bridge" in doc
    res = json.loads((tmp_path / "quick.json").read_text())
    n = len(registry.names())
    assert res["mode"] == "quick" and len(res["pairs"]) == 2 * n * (n - 1) and res["pairs_left_out"] == []
    measured = {c["adapter"]: c for c in res["import_copy_cost"]}
    assert _copying_importers() != []
    for name in _copying_importers():  # measured where its import of an unaligned buffer copies; else
        if _import_copies(name):        # (jax 0.4.30 takes it as it is) left out, saying why
            assert name in measured
        else:
            assert name not in measured
            assert f"import_copy_cost {name}: the routes did not copy as expected; left out" in out.stdout
    assert set(measured) <= set(_copying_importers())
    assert ("## What an import's own copy costs" in doc) == bool(measured)
    assert all(c["measured"] > 0 and c["own"]["median"] > 0 and c["bridge"]["median"] > 0 for c in measured.values())
    assert not [r for r in res["pairs"] if r["copies"]], "every pair is zero-copy for aligned input"
    assert not (tmp_path / "benchmarks.png").exists()  # a quick run draws no plot (test_the_plot_is_drawn_...)
    _check_functions(doc, json.loads((tmp_path / "functions-quick.json").read_text()))
    _check_parts(doc, {p: json.loads((tmp_path / f"{p}-quick.json").read_text()) for p in PARTS})


def _check_parts(doc: str, parts: dict) -> None:
    """The parts run alone too (narrow dtypes, checkpoints, shards, kernels, casting): each section on
    the page, every fp8 pair measured beside bf16 with its workaround, fp4 unpacked bit for bit as by
    hand, every loader run, the shards' ratios saved, every narrow kernel timed against astype with
    ml_dtypes' bits, every cast timed against its hand loop with the same bits."""
    for head in ("## Targets (narrow dtypes, checkpoints, shards, narrow kernels, casting)",
                 "## Narrow dtypes beside bf16 (fp8, fp4)",
                 "## Checkpoints: bb.load against safetensors' own loaders",
                 "## Shards: a sharded jax array to per-shard torch tensors and back",
                 "## Narrow kernels against ml_dtypes' astype and torch's .to()",
                 "## Casting: cast_tree and cast_module against the loops written by hand"):
        assert head in doc, head
    _check_kernels(parts["kernels"], doc)
    _check_casting(parts["casting"])
    n = len(registry.names())
    rows = parts["dtypes"]["rows"]
    fp8 = [r for r in rows if r["dtype"].startswith("float8")]
    assert {(r["dtype"], r["source"], r["target"], r["size"]) for r in fp8} == {
        (d, s, t, z) for d in ("float8_e4m3fn", "float8_e5m2") for s in registry.names() for t in registry.names()
        if s != t for z in ("1 KiB", "32 MiB")} and len(fp8) == 2 * 2 * n * (n - 1)
    assert all(r["bridge"]["best"] > 0 < r["bf16"]["best"] for r in rows)
    assert all(r["workaround"].get("same_bits") for r in fp8), "a widen-move-narrow workaround changed bits"
    fp4 = [r for r in rows if r["dtype"] == "float4_e2m1fn_x2"]
    left = {r["dtype"]: r["why"] for r in parts["dtypes"]["left_out"]}
    if numpy_holds("float4_e2m1fn_x2"):
        assert sorted((r["target"], r["size"]) for r in fp4) == [
            ("jax", "1 KiB"), ("jax", "32 MiB"), ("numpy", "1 KiB"), ("numpy", "32 MiB")] and not left
    else:  # left out, and the page says why: the ml_dtypes that has the row its values unpack to
        assert fp4 == [] and re.search(needs_newer_ml_dtypes("float4_e2m1fn_x2"), left["float4_e2m1fn_x2"])
        assert "Left out in this run: float4_e2m1fn_x2 (" in doc
    assert all(r["copies"] and r["workaround"]["same_bits"] for r in fp4), "fp4 unpacking differs from the hand one"
    ck = parts["checkpoints"]["results"]
    assert all("error" not in ck[f"bb.load {fw}"] for fw in ("numpy", "torch", "jax", "tensorflow"))
    assert "safetensors.torch" in ck and "error" not in ck["safetensors.torch"]
    many = parts["checkpoints"]["many"]["results"]  # the 850-tensor header, ours and safetensors'
    assert many and all("error" not in r for r in many.values())
    sh = parts["shards"]
    assert sh["mode"] == "quick" and sh["shards"] == 8 and all(v > 0 for v in sh["ratios"].values())


def _check_kernels(kr: dict, doc: str) -> None:
    """Every narrow float (and bf16) this ml_dtypes holds both ways at both quick sizes, ours (default
    and one thread) against astype with ml_dtypes' bits, torch's .to() beside it exactly where torch
    holds the dtype; the others left out, each named on the page with the ml_dtypes that has it."""
    import torch

    from bf16bridge.bench import kernels
    from bf16bridge.kernels import FORMATS

    assert kr["mode"] == "quick" and kr["sizes"] == ["1 KiB", "1 MiB"]
    floats = [n for n, f in FORMATS.items() if not f.integer]
    assert len(floats) == 11 and kernels.DTYPES == ("bfloat16", *floats)
    rows = kr["rows"]
    held = [d for d in kernels.DTYPES if numpy_holds(d)]
    assert sorted((r["dtype"], r["direction"], r["size"]) for r in rows) == sorted(
        (d, w, z) for d in held for w in ("float32 -> dtype", "dtype -> float32") for z in kr["sizes"])
    assert [r["dtype"] for r in kr["left_out"]] == [d for d in kernels.DTYPES if d not in held]
    for r in kr["left_out"]:
        assert re.search(needs_newer_ml_dtypes(r["dtype"]), r["why"]) and f"{r['dtype']} (" in doc, r
    for r in rows:
        ours = "to_dtype" if r["direction"] == "float32 -> dtype" else "to_float32"
        assert {ours, ours + ", threads=1", "ml_dtypes astype"} <= set(r["times"])
        assert ("torch .to()" in r["times"]) == hasattr(torch, r["dtype"]), r["dtype"]
        assert all(r["times"][k]["same_bits"] for k in (ours, ours + ", threads=1", "ml_dtypes astype")), r
        assert all(t["best"] > 0 for t in r["times"].values())
    differs = {(r["dtype"], r["direction"]) for r in rows if not r["times"].get("torch .to()", {"same_bits": 1})["same_bits"]}
    assert ("float8_e4m3fn", "float32 -> dtype") in differs, "torch's saturating fp8 went unseen (kernels.md)"
    assert sorted((r["kernel"], r["size"]) for r in kr["nibbles"]) == ([
        ("pack_nibbles", "1 KiB"), ("pack_nibbles", "1 MiB"), ("unpack_nibbles", "1 KiB"), ("unpack_nibbles", "1 MiB")]
        if numpy_holds("float4_e2m1fn") else [])  # (float4_e2m1fn values: left out with it)
    assert all(all(t["same_bits"] for t in r["times"].values()) for r in kr["nibbles"])


def _check_casting(cr: dict) -> None:
    """The three casts timed against their loops, with the same bits; the tie cast once by ours,
    twice (and untied) by the hand loop; the cast module runs."""
    sd, mod, jx = cr["state_dict"], cr["module"], cr["jax"]
    assert set(sd["times"]) == {"cast_tree", "cast_tree, policy=[]", "hand loop"}
    assert sd["tensors"] == sd["unique_tensors"] + 1 and sd["tied_cast_once"] and sd["hand_loop_unties"]
    assert set(mod["times"]) == {"cast_module", "module.to(torch.bfloat16)"} and mod["runs_in_bf16"]
    assert set(jx["times"]) == {"cast_tree", "jax.tree.map astype"} and jx["tensors"] == sd["unique_tensors"]
    for r in (sd, mod, jx):
        assert r["same_bits"] and r["kept"] > 0 and all(t["best"] > 0 for t in r["times"].values())


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
    ones = fres["convert"]["rows_batch_of_one"]  # the same pairs with a size-1 dimension, on the page too
    assert [(r["source"], r["target"]) for r in ones] == [(r["source"], r["target"]) for r in conv]
    assert "The same 1 KiB as a 1 x 512 tensor" in doc and "convert of a 1 x 512 tensor" in doc
    assert {(r["source"], r["target"]) for r in conv if "bridge, on_alias='allow'" in r["times"]} == {
        ("jax", "torch"), ("tensorflow", "torch")}, "the pairs that warn by default are timed with on_alias='allow' too"
    assert [(r["source"], r["target"]) for r in fres["tree"]] == [
        ("torch", "numpy"), ("numpy", "torch"), ("torch", "jax"), ("jax", "torch"), ("torch", "tensorflow"),
        ("tensorflow", "torch")]
    assert all(r["tensors"] == 148 for r in fres["tree"])
    bridged = fres["bridged"]
    assert len(bridged) == 6 and all(r["same_bits"] for r in bridged), "the bridge and the wrapper differ"
    under_jit = fres["bridged_jit"]
    assert [r["callee"] for r in under_jit] == ["torch", "tensorflow"] and all(r["same_bits"] for r in under_jit)
    assert "## Bridged functions under jax.jit against a hand-written pure_callback wrapper" in doc
    step = fres["mlp_step"]  # the torch MLP step with a jax loss: every contender timed, on the page
    assert {"bridge", "bridge, jit=False", "jax.jit(vjp) by hand", "jax.jit(value_and_grad) by hand", "torch"} <= set(
        step["times"]) and step["same_bits_as_jit_vjp_by_hand"], "the bridged loss step differs from the one by hand"
    assert "## The loss step: a torch MLP step with a jax loss" in doc
    assert f"| {step['best_peer']} (judged against) |" in doc
    peers = fres["peers"]
    assert any(r["tool"] == "bf16bridge" for r in peers) and all(r["ok"] for r in peers if r["tool"] == "bf16bridge")
    assert any(r["ok"] is False for r in peers if r["tool"] == "the framework's own call")


def test_functions_part_runs_alone_and_writes_the_page_from_saved_results(tmp_path, monkeypatch):
    """--only functions runs the cost-of-a-call part alone, saves its results, and writes the page
    from them and the main part's results saved before (quick.json in the same folder), which it
    does not run again. (The parts are stubbed: this checks the wiring, the run is checked above.)"""
    from bf16bridge.bench import command as entry
    from bf16bridge.bench import functions, harness, report

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


def test_main_part_runs_alone_and_writes_the_page_from_saved_results(tmp_path, monkeypatch):
    """--only main runs the main part alone (the routes, the copying routes: what a change to a copy
    is measured by), saves its results, and writes the page from them and the cost-of-a-call results
    saved before, which it does not run again, nor any other part. (Stubbed: the wiring.)"""
    from bf16bridge.bench import command as entry
    from bf16bridge.bench import harness

    res, fres_saved, seen = {"mode": "quick", "ran": "main"}, {"saved": "functions"}, []
    (tmp_path / "functions-quick.json").write_text(json.dumps(fres_saved))
    _page_only(monkeypatch, seen, "--only main")
    monkeypatch.setattr(harness, "run", lambda quick, log=print, **k: res)
    monkeypatch.setattr(entry, "run_part", lambda *a, **k: pytest.fail("--only main ran another part"))
    assert entry.main(["--quick", "--only", "main", "--out", str(tmp_path)]) == 0
    assert seen[0] == (res, fres_saved)
    assert json.loads((tmp_path / "quick.json").read_text()) == res
    assert json.loads((tmp_path / "functions-quick.json").read_text()) == fres_saved, "functions' results rewritten"
    assert (tmp_path / "benchmarks.md").read_text() == "page\nparts\n"


def _page_only(monkeypatch, seen: list, what: str) -> None:
    """Stub the main and functions parts (running either fails the test) and the page's writers
    (recording what each got into ``seen``)."""
    from bf16bridge.bench import functions, harness, report, report_parts

    monkeypatch.setattr(functions, "run", lambda *a, **k: pytest.fail(f"{what} ran the functions part"))
    monkeypatch.setattr(harness, "run", lambda *a, **k: pytest.fail(f"{what} ran the main part"))
    monkeypatch.setattr(report, "markdown", lambda res, plot, functions=None: seen.append((res, functions)) or "page\n")
    monkeypatch.setattr(report_parts, "parts_markdown", lambda parts: seen.append(parts) or "parts\n")
    monkeypatch.setattr(report, "plot", lambda res, path: False)
    monkeypatch.setattr(report, "targets", lambda res: [])
    monkeypatch.setattr(report, "function_targets", lambda f: [])
    monkeypatch.setattr(report_parts, "part_targets", lambda p: [])


def test_a_part_runs_alone_and_the_page_keeps_every_saved_part(tmp_path, monkeypatch):
    """--only dtypes (checkpoints, shards alike) runs that part alone and saves it; the page is written
    from every part's saved results, the others not run again. (Stubbed: this checks the wiring.)"""
    from bf16bridge.bench import command as entry

    saved = {"functions-quick.json": {"saved": "functions"}, "quick.json": {"saved": "main"},
             "shards-quick.json": {"saved": "shards"}}
    for name, data in saved.items():
        (tmp_path / name).write_text(json.dumps(data))
    ran, seen = [], []

    def run_part(part, quick, out, log):
        ran.append((part, quick, out))
        out.write_text(json.dumps({"ran": part}))
        return {"ran": part}

    monkeypatch.setattr(entry, "run_part", run_part)
    _page_only(monkeypatch, seen, "--only dtypes")
    assert entry.main(["--quick", "--only", "dtypes", "--out", str(tmp_path)]) == 0
    assert ran == [("dtypes", True, tmp_path / "dtypes-quick.json")]
    assert seen == [({"saved": "main"}, {"saved": "functions"}),
                    {"dtypes": {"ran": "dtypes"}, "checkpoints": None, "shards": {"saved": "shards"}, "kernels": None,
                     "casting": None}]
    for name, data in saved.items():
        assert json.loads((tmp_path / name).read_text()) == data, f"{name} was rewritten"
    assert (tmp_path / "benchmarks.md").read_text() == "page\nparts\n"


def test_page_runs_nothing_and_rebuilds_the_page_from_every_saved_result(tmp_path, monkeypatch):
    """--only page: after two branches each ran a part, the page is rebuilt from the saved results
    alone; no part runs and no saved result is rewritten."""
    from bf16bridge.bench import command as entry

    saved = {"functions-quick.json": {"saved": "functions"}, "quick.json": {"saved": "main"},
             "kernels-quick.json": {"saved": "kernels"}, "casting-quick.json": {"saved": "casting"}}
    for name, data in saved.items():
        (tmp_path / name).write_text(json.dumps(data))
    seen = []
    monkeypatch.setattr(entry, "run_part", lambda *a, **k: pytest.fail("--only page ran a part"))
    _page_only(monkeypatch, seen, "--only page")
    assert entry.main(["--quick", "--only", "page", "--out", str(tmp_path)]) == 0
    assert seen == [({"saved": "main"}, {"saved": "functions"}),
                    {"dtypes": None, "checkpoints": None, "shards": None, "kernels": {"saved": "kernels"},
                     "casting": {"saved": "casting"}}]
    for name, data in saved.items():
        assert json.loads((tmp_path / name).read_text()) == data, f"{name} was rewritten"
    assert (tmp_path / "benchmarks.md").read_text() == "page\nparts\n"


def test_part_targets_judge_against_safetensors_or_the_float32_route():
    """Checkpoint targets: bb.load against safetensors' own loader for the framework, or where that
    fails the float32 route people use; a zero-copy load's peak extra RSS against 5% of the file."""
    from bf16bridge.bench import report_parts as report

    ok = {"first_s": 1e-3, "load_s": 1.0, "touch_s": 1.0, "peak_load": 1 << 20, "peak_extra": 1 << 20}
    res = {f"bb.load {fw}": dict(ok) for fw in ("numpy", "torch", "jax", "tensorflow")}
    res.update({"safetensors.numpy": {"error": "TypeError: no bf16"}, "safetensors.flax": {"error": "ValueError"},
                "safetensors.torch + .float().numpy()": {**ok, "load_s": 0.5},
                "safetensors.torch": {**ok, "load_s": 2.0}, "safetensors.tensorflow": dict(ok)})
    res["bb.load torch"]["peak_load"] = 60 << 20
    got = {what: (met, how) for what, met, how in report.part_targets(
        {"checkpoints": {"results": res, "nbytes": 1 << 30, "zero_copy": ["bb.load numpy", "bb.load torch"]}})}
    assert got["checkpoint full load into numpy: no slower than safetensors.torch + .float().numpy()"][0] is False
    assert "safetensors.numpy fails" in got[
        "checkpoint full load into numpy: no slower than safetensors.torch + .float().numpy()"][1]
    assert got["checkpoint full load into torch: no slower than safetensors.torch"][0] is True
    assert got["checkpoint full load into jax: no slower than safetensors'"] == (
        True, "1.00 s; every safetensors loader for jax fails on the file")
    assert got["checkpoint full load into tensorflow: no slower than safetensors.tensorflow"][0] is True
    assert got["checkpoint: peak extra RSS of bb.load numpy (zero-copy) under 5% of the file"][0] is True
    assert got["checkpoint: peak extra RSS of bb.load torch (zero-copy) under 5% of the file"] == (
        False, "60.0 MiB of 1024.0 MiB (5.9%)")


@pytest.mark.parametrize("part", ["kernels", "casting"])
def test_run_part_runs_that_parts_module_and_saves_it(tmp_path, monkeypatch, part):
    """--only kernels runs bf16bridge/bench/kernels.py, --only casting bf16bridge/bench/casting.py, and each
    saves what its run returned. (Stubbed: the runs themselves are checked by the quick run.)"""
    import importlib

    from bf16bridge.bench import command as entry

    calls = []
    for name in ("kernels", "casting"):
        mod = importlib.import_module(f"bf16bridge.bench.{name}")
        monkeypatch.setattr(mod, "run", lambda quick, log=print, name=name: calls.append((name, quick)) or {"ran": name})
    out = tmp_path / f"{part}-quick.json"
    assert entry.run_part(part, True, out, print) == {"ran": part}
    assert calls == [(part, True)] and json.loads(out.read_text()) == {"ran": part}


def test_what_was_timed_is_checked_bit_for_bit():
    """A contender whose result differs from the reference in one bit is timed, and marked as
    differing, with the input, the reference's bits and its own: a wrong fast kernel is no win."""
    import numpy as np

    from bf16bridge.bench.kernels import _compare_checked

    x = np.arange(300, dtype=np.float32)
    ref = x.view(np.uint32).copy()

    def wrong():
        y = x.copy()
        y.view(np.uint32)[7] ^= 1
        return y

    got = _compare_checked({"right": x.copy, "wrong": wrong}, x, ref, quick=True)
    assert got["right"]["same_bits"] and got["right"]["differ"] == 0 and got["right"]["best"] > 0
    assert not got["wrong"]["same_bits"] and got["wrong"]["differ"] == 1 and got["wrong"]["best"] > 0
    assert got["wrong"]["examples"] == [(0x40E00000, 0x40E00000, 0x40E00001)]  # 7.0, and 7.0 with its low bit set


def _times(best: dict) -> dict:
    return {k: {"best": v, "median": v, "calls": 3} for k, v in best.items()}


def test_kernel_and_casting_targets_judge_ratios_overheads_and_bits():
    """Kernels: ours no slower than astype at the large size (10% for noise), at most astype + 10 us
    at the small one, the nibbles no slower than the one-liners, and every timed call of ours with
    ml_dtypes' bits. Casting: cast_tree no slower than the hand loop / tree map, cast_module within
    1.5x of module.to, the same bits."""
    from bf16bridge.bench import report_parts as report

    def row(dtype, direction, size, ours, astype):
        o = "to_dtype" if direction == "float32 -> dtype" else "to_float32"
        t = {o: {"best": ours}, o + ", threads=1": {"best": ours}, "ml_dtypes astype": {"best": astype}}
        return {"dtype": dtype, "direction": direction, "size": size,
                "times": {k: {**v, "median": v["best"], "same_bits": True, "differ": 0, "of": 8, "examples": []}
                          for k, v in t.items()}}

    rows = [row("bfloat16", "float32 -> dtype", "32 MiB", 1.05, 1.0), row("float8_e5m2", "float32 -> dtype", "32 MiB", 1.2, 1.0),
            row("bfloat16", "dtype -> float32", "32 MiB", 0.5, 1.0), row("bfloat16", "float32 -> dtype", "1 KiB", 11e-6, 1e-6),
            row("bfloat16", "dtype -> float32", "1 KiB", 12e-6, 1e-6)]
    rows[2]["times"]["to_float32, threads=1"].update(same_bits=False, differ=3)
    nib = [{"kernel": "pack_nibbles", "size": "32 MiB", "times": {"pack_nibbles": {"best": 1.0, "same_bits": True},
                                                                    "numpy: a": {"best": 1.0, "same_bits": True}}},
           {"kernel": "unpack_nibbles", "size": "32 MiB", "times": {"unpack_nibbles": {"best": 2.0, "same_bits": True},
                                                                      "numpy: b": {"best": 1.0, "same_bits": True}}}]
    got = {w: (ok, how) for w, ok, how in report.kernel_targets(
        {"sizes": ["1 KiB", "32 MiB"], "rows": rows, "nibbles": nib})}
    bits = next(v for w, v in got.items() if w.startswith("narrow kernels: what was timed"))
    assert bits == (False, "differs: bfloat16 dtype -> float32 32 MiB (to_float32, threads=1: 3 of 8)")
    assert got["to_dtype at 32 MiB (of float32): no slower than ml_dtypes' astype, every dtype (at most 1.1x)"] == (
        False, "worst float8_e5m2: 1.20x (1.20 s vs 1.00 s); over: float8_e5m2 1.20x")
    assert got["to_float32 at 32 MiB (of float32): no slower than ml_dtypes' astype, every dtype (at most 1.1x)"][0]
    assert got["to_dtype at 1 KiB: at most ml_dtypes' astype + 10 us, every dtype"][0] is True
    assert got["to_float32 at 1 KiB: at most ml_dtypes' astype + 10 us, every dtype"][0] is False
    assert got["pack_nibbles at 32 MiB: no slower than the numpy one-liner (at most 1.1x)"][0] is True
    assert got["unpack_nibbles at 32 MiB: no slower than the numpy one-liner (at most 1.1x)"][0] is False

    cr = {"state_dict": {"same_bits": True, "times": _times({"cast_tree": 0.7, "cast_tree, policy=[]": 1.15,
                                                             "hand loop": 1.0})},
          "module": {"same_bits": False, "times": _times({"cast_module": 1.4, "module.to(torch.bfloat16)": 1.0})},
          "jax": {"same_bits": True, "times": _times({"cast_tree": 1.0, "jax.tree.map astype": 1.0})}}
    got = {w: (ok, how) for w, ok, how in report.casting_targets(cr)}
    assert got["cast_tree of the torch state dict (norms kept, tied weights cast once): no slower than the hand loop "
               "(at most 1.1x)"] == (True, "0.70x (700.00 ms vs 1.00 s)")
    assert got["cast_tree(policy=[]) of the torch state dict (every leaf cast): no slower than the hand loop "
               "(at most 1.1x)"][0] is False
    assert got["cast_module: at most 1.5x module.to(torch.bfloat16)"][0] is True
    assert got["cast_tree of jax params: no slower than jax.tree.map astype (at most 1.1x)"][0] is True
    assert got["casting: every leaf cast has the bits of the loop it is timed against, every kept leaf the input's"] == (
        False, "differs: nn.Module")


def test_the_page_is_generated_from_the_saved_results():
    """docs/benchmarks.md is what the report makes of benchmarks/results/{full,functions}.json and
    each part's saved JSON (dtypes, checkpoints, shards): no number on it is typed by hand, and it
    was written again after the last run of any part."""
    from bf16bridge.bench import report, report_parts

    res, fres = report.load(FULL), report.load(FUNCTIONS)
    assert fres is not None, f"{FUNCTIONS} is missing: run bf16bridge bench --only functions"
    parts = {p: report.load(ROOT / "benchmarks" / "results" / f"{p}.json") for p in PARTS}
    missing = [p for p, v in parts.items() if v is None]
    assert not missing, f"no saved results for {missing}: run bf16bridge bench --only <part>"
    assert (ROOT / "docs" / "benchmarks.md").read_text() == (
        report.markdown(res, "benchmarks.png", fres) + report_parts.parts_markdown(parts))


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # asks every registered adapter
def test_declared_import_copy_cost_agrees_with_the_saved_measurement():
    """Adapter.import_copy_cost says whether the framework's own copy on import costs more (> 1) or
    less (< 1) than the bridge's aligned copy; the planner acts on it. The last full benchmark run
    (benchmarks/results/full.json, `bf16bridge bench`) measured it: both must be on the same side.
    (The adapters are loaded here, not at collection, so collecting imports no framework.)"""
    saved = {c["adapter"]: c for c in json.loads(FULL.read_text()).get("import_copy_cost", [])}
    names = _copying_importers()
    assert names, "no adapter's import copies an unaligned buffer: nothing declares import_copy_cost"
    for name in names:
        assert name in saved, f"{FULL.name} has no import_copy_cost measurement for {name}: run bf16bridge bench"
        declared, measured = registry.get(name).import_copy_cost, saved[name]["measured"]
        assert declared != 1 and measured != 1
        assert (declared > 1) == (measured > 1), (
            f"{name} declares import_copy_cost={declared:g}, the benchmark measured {measured:.2f}")


def test_a_full_run_draws_its_plot_and_a_quick_run_none(tmp_path, capsys):
    """The plot, one panel a pair, from the last full run's saved results; a quick run (two sizes: no
    curve to draw) writes none."""
    from bf16bridge.bench import report

    res = report.load(FULL)
    report.write(dict(res, mode="quick"), tmp_path / "q.md", tmp_path / "q.png", None)
    assert not (tmp_path / "q.png").exists() and "![" not in (tmp_path / "q.md").read_text()
    try:
        import matplotlib  # noqa: F401 - the bench extra; not in the oldest set
    except ImportError:
        assert report.plot(res, tmp_path / "p.png") is False
        assert "no plot (p.png): matplotlib is not installed" in capsys.readouterr().out
        return
    report.write(res, tmp_path / "f.md", tmp_path / "f.png", None)
    assert (tmp_path / "f.png").stat().st_size > 10_000 and "![time against size" in (tmp_path / "f.md").read_text()
