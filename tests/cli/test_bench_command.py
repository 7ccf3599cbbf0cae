"""`bf16bridge bench`: the benchmark harness as a command of the installed package, from any folder;
its header says what each column means; --strict fails a run that missed a target. (The runs are
checked by tests/project/test_benchmarks_smoke.py; here --only page, which runs nothing.)"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bf16bridge.bench import command, harness

SAVED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "full.json"
FUNCTIONS = SAVED.parent / "functions.json"
FRAMEWORKS = ("torch", "jax", "tensorflow")


def _bench(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bf16bridge", "bench", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def _missed(saved: dict) -> list[dict]:
    """The rows of a saved main part that miss their target: the routes that must copy, over 1.5x memcpy."""
    return [c for c in saved["copying"] if c["bridge"]["median"] > 1.5 * c["memcpy"]["median"]]


def test_bench_writes_the_page_from_saved_results_from_any_folder(tmp_path):
    """`bf16bridge bench` was an invalid choice; `python -m benchmarks` ran only from the repository."""
    out = _bench("--only", "page", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "bf16bridge bench: no part runs: the page is written again from the saved results"
    assert f"writes the page to {tmp_path / 'out' / 'benchmarks.md'}" in out.stdout
    assert (tmp_path / "out" / "benchmarks.md").read_text().startswith("# Benchmarks")
    assert lines[-1] == "0 of 0 targets met"


@pytest.mark.parametrize("strict", [False, True])
def test_strict_exits_1_when_a_saved_target_is_missed(tmp_path, strict):
    """The last full run's results, judged again: a missed target is a MISS line and, with --strict,
    exit status 1; the same results with every target met exit 0 either way."""
    saved = json.loads(SAVED.read_text())
    copying = [c for c in saved["copying"] if c.get("copies") is not False]  # judged against memcpy
    for c in copying:  # every route that must copy within its target
        c["bridge"] = dict(c["memcpy"])
    for c in saved["copying"]:  # and every layout the target keeps as fast as the raw call
        if c.get("copies") is False:
            c["bridge"], c["small"]["bridge"] = dict(c["raw"]), dict(c["small"]["raw"])
    for k in saved["kernels"]:  # and every kernel at its bandwidth floor
        if "time" in k:
            k["time"] = dict(k["time"], median=k["floor"], best=k.get("floor_best", k["floor"]))
    missed = dict(saved, copying=[dict(c, bridge={**c["memcpy"], "median": 2 * c["memcpy"]["median"]})
                                  if c is copying[0] else c for c in saved["copying"]])
    assert not _missed(saved) and len(_missed(missed)) == 1
    flag = ["--strict"] if strict else []
    for results, status in ((saved, 0), (missed, 1 if strict else 0)):
        (tmp_path / "full.json").write_text(json.dumps(results))
        out = _bench("--only", "page", "--out", str(tmp_path), *flag, cwd=tmp_path)
        assert out.returncode == status, out.stdout[-3000:] + out.stderr[-3000:]
        assert out.stdout.count("\nMISS  ") == (results is missed), out.stdout
        assert ("(--strict: exit status 1)" in out.stdout) == (strict and results is missed)


def _loss_step(bridge: float, same_bits: bool = True) -> dict:
    """A loss step's results as bf16bridge/bench/loss_step.py saves them: the bridge's fastest step ``bridge``
    seconds, the fastest it is judged against (jax.jit(value_and_grad) by hand) 1 ms; medians 1.1x."""
    best = {"bridge": bridge, "bridge, jit=False": 3e-3, "jax.jit(vjp) by hand": 1.2e-3,
            "jax.jit(value_and_grad) by hand": 1e-3, "torch_jax_interop WrappedJaxFunction": 2e-3,
            "torch_jax_interop WrappedJaxScalarFunction": 1.5e-3, "torch": 0.4e-3}
    return {"times": {k: {"best": v, "median": 1.1 * v, "calls": 3} for k, v in best.items()},
            "best_peer": "jax.jit(value_and_grad) by hand", "ratio": bridge / 1e-3, "target": 1.1,
            "same_bits_as_jit_vjp_by_hand": same_bits}


def test_the_loss_step_is_on_the_page_and_a_missed_target_fails_strict(tmp_path):
    """The torch MLP step with a jax loss was measured and saved, but neither on the page nor judged: each
    contender's time, the ratio to the fastest hand-jitted or torch_jax_interop step, the 1.1x target, the bits;
    a step over 1.1x is a MISS and --strict exits 1."""
    from bf16bridge.bench import report

    saved = json.loads(FUNCTIONS.read_text())
    runs = {}
    for name, bridge in (("met", 1.05e-3), ("missed", 1.2e-3)):
        (tmp_path / "functions.json").write_text(json.dumps(dict(saved, mlp_step=_loss_step(bridge))))
        out = _bench("--only", "page", "--out", str(tmp_path), "--strict", cwd=tmp_path)
        step = [line for line in out.stdout.splitlines() if "a torch MLP step with a jax loss" in line]
        assert len(step) == 1 and step[0].startswith("met " if name == "met" else "MISS  "), out.stdout[-3000:]
        assert out.returncode == (1 if "\nMISS  " in out.stdout else 0), out.stdout[-3000:] + out.stderr[-3000:]
        runs[name] = (out.stdout.splitlines()[-1], (tmp_path / "benchmarks.md").read_text())
    met, total = re.match(r"(\d+) of (\d+) targets met", runs["met"][0]).groups()
    assert runs["missed"][0].startswith(f"{int(met) - 1} of {total} targets met; ")
    assert runs["missed"][0].endswith("(--strict: exit status 1)")
    page = runs["missed"][1]
    assert "## The loss step: a torch MLP step with a jax loss" in page
    for row in ("| bridge | 1.20 ms (1.32 ms) | 1.00x |", "| bridge, jit=False | 3.00 ms (3.30 ms) | 0.40x |",
                "| jax.jit(vjp) by hand | 1.20 ms (1.32 ms) | 1.00x |",
                "| jax.jit(value_and_grad) by hand (judged against) | 1.00 ms (1.10 ms) | 1.20x |",
                "| torch_jax_interop WrappedJaxFunction | 2.00 ms (2.20 ms) | 0.60x |",
                "| torch_jax_interop WrappedJaxScalarFunction | 1.50 ms (1.65 ms) | 0.80x |",
                "| torch | 400.0 us (440.0 us) | 3.00x |"):
        assert row in page, row
    assert ("The bridge over jax.jit(value_and_grad) by hand: 1.20x (target 1.1x); same bits: yes; "
            "target **missed**.") in page
    assert "1.20x of jax.jit(value_and_grad) by hand (1.20 ms vs 1.00 ms)" in page  # in the targets' table
    # fast enough but not the same bits is a miss too; results saved before the row existed say so
    judged = [t for t in report.function_targets(dict(saved, mlp_step=_loss_step(0.9e-3, same_bits=False)))
              if "MLP step" in t[0]]
    assert [ok for _, ok, _ in judged] == [False] and "the loss or gradients differ" in judged[0][2]
    assert "Not in these saved results" in "\n".join(report.function_markdown(dict(saved, mlp_step=None)))


def test_the_header_explains_every_column_the_log_prints(tmp_path):
    """The log's columns (bridge, raw, workaround, memcpy, floor; a part's own) were never explained."""
    names = ["numpy", "torch", "jax"]
    out = command.header("main", True, names, {"tensorflow": "why"}, command.paths.outputs(True, tmp_path))
    glossary = out.split("columns:\n", 1)[1]
    for column in ("bridge", "raw", "workaround", "memcpy", "floor", "met / MISS"):
        assert f"\n  {column} " in "\n" + glossary, column
    assert "left out: tensorflow (why)" in out and "main part over numpy, torch, jax" in out
    dtypes = command.header("dtypes", False, names, {}, command.paths.outputs(False, tmp_path))
    assert "  bf16 " in dtypes and "  workaround " not in dtypes  # the part's own columns, only those


def test_quick_leaves_out_what_does_not_fit_its_budget_unless_asked():
    ap = command.parser()
    names, left = command.frameworks(ap, ap.parse_args(["--quick"]))
    assert set(left) == set(command.QUICK_LEAVES_OUT) and not set(names) & set(left) and "numpy" in names
    assert command.frameworks(ap, ap.parse_args(["--quick", "--frameworks", "all"]))[1] == {}
    assert command.frameworks(ap, ap.parse_args([]))[1] == {}  # a full run measures every framework
    assert command.frameworks(ap, ap.parse_args(["--frameworks", "np,pt"])) == (
        ["numpy", "torch"], {n: "not in --frameworks" for n in harness.registry.names() if n not in ("numpy", "torch")})


@pytest.mark.parametrize("argv, says", [
    (["--frameworks", "torch,jaxx"], "--frameworks torch,jaxx: unknown framework 'jaxx'"),
    (["--frameworks", "torch"], "names 1 framework(s): the main part measures pairs"),
    (["--only", "nosuch"], "argument --only: invalid choice: 'nosuch'"),
    (["--quick", "--out", __file__], "is a file; name a folder"),
])
def test_usage_errors_come_before_any_framework_is_imported(argv, says):
    code = ("import sys\nfrom bf16bridge.bench.command import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    print(e.code)\n"
            f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert out.stdout.splitlines() == ["2", "[]"], out.stdout + out.stderr[-3000:]
    assert "usage: bf16bridge bench" in out.stderr and says in out.stderr, out.stderr
